"""`tformer data multi30k|wmt14 --out DIR`: fetch official corpora, check each download against its published
checksum before using it, and write every file atomically.

multi30k: six small .gz files, checked (SHA-256) and written as they are.
wmt14: the WMT14 English-German training archives (Europarl v7, Common Crawl, News Commentary v9) and the
dev/test archives, each checked before anything is extracted, then streamed (never held in memory) into
{train,newstest2013,newstest2014}.{en,de}. Nothing here runs in the tests' normal path: they point it at a
local HTTP server on loopback."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import socket
import tarfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from tformer.errors import DataError

log = logging.getLogger("tformer")

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"

# upstream name -> (local name, SHA-256 of the upstream .gz bytes; github.com/multi30k/dataset, data files
# last changed in commit c9be912 of 2018-01-17)
MULTI30K_FILES = {
    "train.en.gz": ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
    "train.de.gz": ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
    "val.en.gz": ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
    "val.de.gz": ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
    "test_2016_flickr.en.gz": ("test2016.en.gz", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    "test_2016_flickr.de.gz": ("test2016.de.gz", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(url: str, timeout: float = 30.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise DataError(f"{url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"cannot download {url} ({reason}); are you offline? Fetch the files by hand "
                        f"(they are listed in tformer/data/download.py) and point data.dir at them") from None


def offline_copy(corpus: str) -> Path:
    """Where an offline copy of `corpus` may be: $TFORMER_SHARED_DATA/CORPUS, else ../shared/data/CORPUS beside
    the working folder (where the tests and the documentation's build read it)."""
    return Path(os.environ.get("TFORMER_SHARED_DATA") or Path("..") / "shared" / "data") / corpus


def download_multi30k(out: str | Path, base_url: str = MULTI30K_URL) -> list[Path]:
    """Every Multi30k task-1 en/de file into `out`, named as the recipe expects (train, val, test2016).
    Files already there with the right checksum are kept; a download with the wrong checksum is refused. From
    the official location, a file the offline copy (`offline_copy`) holds with the right checksum is copied
    from there instead: nothing is downloaded on a machine that has one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    offline = offline_copy("multi30k") if base_url == MULTI30K_URL else None
    written = []
    for remote, (local, sha) in MULTI30K_FILES.items():
        path = out / local
        if path.exists() and _sha256(path.read_bytes()) == sha:
            log.info("%s: already there, checksum ok", path)
            written.append(path)
            continue
        url = f"{base_url.rstrip('/')}/{remote}"
        copy = offline / local if offline is not None else None
        data = copy.read_bytes() if copy is not None and copy.is_file() else None
        if data is not None and _sha256(data) == sha:
            url = str(copy)  # the offline copy, checked like a download
        else:
            data = fetch(url)
        got = _sha256(data)
        if got != sha:
            raise DataError(f"{url}: SHA-256 {got} is not the expected {sha}; the download is damaged or the "
                            "file changed upstream; nothing was written for it")
        tmp = path.with_name(f".{local}.part-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        log.info("%s: %d bytes from %s, checksum ok", path, len(data), url)
        written.append(path)
    return written


# --------------------------------------------------------------------------- WMT14 English-German


@dataclass(frozen=True)
class Archive:
    """One upstream archive: its official URL (whose last part is its name, in the output folder and under
    a --url base), the digest it must have, in whichever algorithm was published for it (a hashlib name:
    sha256, sha1, md5), and its size in bytes where published (for the progress bar only)."""

    url: str
    algorithm: str
    digest: str
    size: int | None = None

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Pair:
    """The English and the German member of one archive, line i of one translating line i of the other;
    `sgml`: WMT's SGML, whose text is the content of each `<seg id=..>` line."""

    archive: str  # Archive.name
    en: str
    de: str
    sgml: bool = False


WMT14_ARCHIVES = (
    # SHA-1 and size from dmlc/gluon-nlp scripts/datasets/url_checksums/wmt.txt (commit 01122db3867722db0615
    # 66a79e843a08f9134431). No SHA-256 or MD5 of this file was found published (TFDS and sockeye list the WMT13
    # bundle training-parallel-europarl-v7.tgz instead, which holds the same corpus but is 658 MB).
    Archive("http://www.statmt.org/europarl/v7/de-en.tgz", "sha1", "53bb5408d22977c89284bd755717e6bbb5b12bc5",
            197785698),
    # SHA-256 and size from tensorflow/datasets tensorflow_datasets/url_checksums/wmt14_translate.txt (commit
    # 90b66237ad09c9e5b9b1bc61b646db7b1fb0713c); gluon-nlp's wmt.txt lists the same sizes.
    Archive("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "sha256",
            "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", 918311367),
    Archive("http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", "sha256",
            "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485", 80418416),
    # MD5 from awslabs/sockeye contrib/autopilot/tasks.py, RAW_FILES["wmt14_dev"] (commit fea3d599807484329c4e
    # db1c9f4e2dea0f50b92c); no SHA-256 of this file was found published.
    Archive("http://www.statmt.org/wmt14/dev.tgz", "md5", "88ba3fc60b2278d59277122e1c7dd6e7"),
    # MD5 from sacreBLEU's dataset table, "wmt14/full" (mjpost/sacrebleu sacrebleu/dataset/__init__.py, 2.x).
    Archive("http://www.statmt.org/wmt14/test-full.tgz", "md5", "a8cd784e006feb32ac6f3d9ec7eb389a"),
)

# output prefix -> the pairs concatenated into {prefix}.en / {prefix}.de, in this order. Member names as in
# gluon-nlp's prepare_wmt.py, sockeye's autopilot tasks and sacreBLEU's "wmt14/full" (en-de: the files of the
# de-en pair, English source and German reference).
WMT14_LAYOUT = {
    "train": (Pair("de-en.tgz", "europarl-v7.de-en.en", "europarl-v7.de-en.de"),
              Pair("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.en", "commoncrawl.de-en.de"),
              Pair("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.en",
                   "training/news-commentary-v9.de-en.de")),
    "newstest2013": (Pair("dev.tgz", "dev/newstest2013.en", "dev/newstest2013.de"),),
    "newstest2014": (Pair("test-full.tgz", "test-full/newstest2014-deen-src.en.sgm",
                          "test-full/newstest2014-deen-ref.de.sgm", sgml=True),),
}

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Output:
    """A file of the corpus folder and its line count; `lines` is None for one kept, complete, from an
    earlier run (not read again)."""

    path: Path
    lines: int | None


def download_wmt14(out: str | Path, base_url: str | None = None, archives: Iterable[Archive] | None = None,
                   progress: bool = True) -> list[Output]:
    """WMT14 en-de into `out`: train, newstest2013, newstest2014 .{en,de}, line-aligned, raw text (see
    WMT14_LAYOUT). The archives come from their official URLs, or from `base_url`/<name>; each is downloaded
    to <name>.part, checked against its digest in `archives` (default WMT14_ARCHIVES), and only then renamed
    to <name>; every one is checked before anything is extracted. A rerun keeps the outputs already there
    (each pair is renamed into place only when complete) and the archives whose digest matches, and resumes
    a .part where the server honours a Range request."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = {a.name: a for a in (WMT14_ARCHIVES if archives is None else archives)}
    with _exclusive(out):
        todo = [prefix for prefix in WMT14_LAYOUT
                if not all((out / f"{prefix}.{lang}").is_file() for lang in ("en", "de"))]
        needed = list(dict.fromkeys(pair.archive for prefix in todo for pair in WMT14_LAYOUT[prefix]))
        paths = {}
        for name in needed:  # every download checked before anything is extracted
            url = f"{base_url.rstrip('/')}/{name}" if base_url else table[name].url
            paths[name] = _ensure_archive(out, table[name], url, progress, hint=bool(base_url))
        written = {}
        for prefix in todo:
            written[prefix] = _extract(out, prefix, WMT14_LAYOUT[prefix], paths)
    return [Output(out / f"{prefix}.{lang}", written.get(prefix))
            for prefix in WMT14_LAYOUT for lang in ("en", "de")]


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """One download into `folder` at a time (an OS lock, released when the process ends however it ends)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield
        return
    with open(folder / ".download.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"{folder}: another `tformer data` is downloading into this folder; wait for it to "
                            "finish, or give another --out") from None
        yield


def file_digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _ensure_archive(out: Path, archive: Archive, url: str, progress: bool, hint: bool) -> Path:
    path = out / archive.name
    want = archive.digest.lower()
    if path.is_file():
        got = file_digest(path, archive.algorithm)
        if got == want:
            log.info("%s: already there, %s ok", path, archive.algorithm)
            return path
        log.warning("%s: %s %s is not the expected %s; downloading it again", path, archive.algorithm, got, want)
    part = out / f"{archive.name}.part"
    try:
        got = _download(url, part, archive.algorithm, archive.size, progress)
    except urllib.error.HTTPError as e:
        hint_text = (f"; a --url base must hold the archives under their upstream names "
                     f"({', '.join(a.name for a in WMT14_ARCHIVES)})") if hint else ""
        raise DataError(f"{url}: the server answered {e.code} {e.reason}{hint_text}") from None
    if got != want:
        part.unlink(missing_ok=True)
        raise DataError(f"{url}: {archive.algorithm} {got} is not the expected {want}; the download is damaged "
                        "or the file changed upstream; it was deleted and nothing was extracted")
    os.replace(part, path)
    log.info("%s: %d bytes, %s ok", path, path.stat().st_size, archive.algorithm)
    return path


def _download(url: str, part: Path, algorithm: str, size: int | None, progress: bool,
              timeout: float = 60.0) -> str:
    """`url` into `part` (resumed from the bytes already there when the server honours a Range request);
    the digest of the whole file."""
    from tqdm import tqdm  # the text bar: tqdm.auto warns in a notebook without ipywidgets

    h = hashlib.new(algorithm)
    start = part.stat().st_size if part.is_file() else 0
    if size is not None and start > size:
        start = 0
    if start:
        with open(part, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        if start == size:
            return h.hexdigest()
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:  # nothing left to send: the .part is whole already
            return h.hexdigest()
        raise
    except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
        raise _offline(url, getattr(e, "reason", e), part.parent) from None
    with response:
        if start and response.status != 206:  # the server sends the whole file: start again
            start, h = 0, hashlib.new(algorithm)
        length = response.headers.get("Content-Length")
        total = size if size is not None else (start + int(length) if length else None)
        done = start
        with open(part, "ab" if start else "wb") as f, \
                tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024, desc=part.name,
                     disable=None if progress else True, dynamic_ncols=True) as bar:
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as e:
                    raise DataError(f"{url}: the download broke off after {done} bytes ({e}); run the command "
                                    f"again to resume it from {part}") from None
                if not chunk:
                    break
                f.write(chunk)
                h.update(chunk)
                done += len(chunk)
                bar.update(len(chunk))
    return h.hexdigest()


def _offline(url: str, reason: object, out: Path) -> DataError:
    return DataError(f"cannot download {url} ({reason}); are you offline? Put the archives (their names and "
                     f"URLs are in tformer/data/download.py) into {out} by hand: they are checked, not fetched "
                     "again")


def _extract(out: Path, prefix: str, pairs: tuple[Pair, ...], archives: dict[str, Path]) -> int:
    """{prefix}.en and {prefix}.de from `pairs`, concatenated in order: written under temporary names and
    renamed into place only when every pair is complete and aligned. The number of lines of each."""
    tmp = {lang: out / f".{prefix}.{lang}.part" for lang in ("en", "de")}
    try:
        total = 0
        with open(tmp["en"], "wb") as en, open(tmp["de"], "wb") as de:
            for pair in pairs:
                total += _copy_pair(archives[pair.archive], pair, {"en": en, "de": de})
        for lang in ("en", "de"):
            os.replace(tmp[lang], out / f"{prefix}.{lang}")
            log.info("%s: %d lines", out / f"{prefix}.{lang}", total)
        return total
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)


def _copy_pair(archive: Path, pair: Pair, writers: dict[str, BinaryIO]) -> int:
    """Both members of `pair` appended to their writers, streamed from the archive in one pass; the number
    of lines of each (a DataError when the two differ)."""
    wanted = {pair.en: "en", pair.de: "de"}
    counts: dict[str, int] = {}
    try:
        with tarfile.open(archive, "r|gz") as tar:
            for member in tar:
                lang = wanted.get(member.name.removeprefix("./"))
                if lang is None or lang in counts or not member.isfile():
                    continue
                stream = tar.extractfile(member)
                where = f"{archive}:{member.name}"
                counts[lang] = (_copy_sgml(stream, writers[lang], where) if pair.sgml
                                else _copy_lines(stream, writers[lang]))
                if len(counts) == 2:
                    break
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise DataError(f"{archive} cannot be read as a .tgz archive ({e}); delete it and run again") from None
    for member, lang in wanted.items():
        if lang not in counts:
            raise DataError(f"{archive} has no member {member}; is it the right archive?")
    if counts["en"] != counts["de"]:
        raise DataError(f"{archive}: {pair.en} has {counts['en']} lines but {pair.de} has {counts['de']}; they "
                        "must be line-aligned; nothing was written for them")
    return counts["en"]


def _copy_lines(src: BinaryIO, dst: BinaryIO) -> int:
    """Bytes as they are, in chunks (a line ends at a newline only, as in `wc -l`); a last line without one gets
    it. The number of lines."""
    n, last = 0, b"\n"
    while chunk := src.read(_CHUNK):
        dst.write(chunk)
        n += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        dst.write(b"\n")
        n += 1
    return n


def _copy_sgml(src: BinaryIO, dst: BinaryIO, where: str) -> int:
    n = 0
    for text in sgml_segments(_decoded_lines(src, where)):
        dst.write(text.encode("utf-8") + b"\n")
        n += 1
    return n


def _decoded_lines(src: BinaryIO, where: str) -> Iterator[str]:
    """UTF-8 lines, each ending at a newline only (as sacreBLEU reads them: newline="\\n")."""
    for number, raw in enumerate(src, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{where}, line {number}: not valid UTF-8 ({e.reason} at byte {e.start + 1})") from None


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")
_ENTITY = re.compile(r"&(?:(amp|lt|gt|quot|apos)|#([0-9]+)|#[xX]([0-9a-fA-F]+));")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def sgml_segments(lines: Iterable[str]) -> Iterator[str]:
    """The text of each `<seg ...>text</seg>` line of a WMT SGML file, in order: extracted and its white
    space collapsed as sacreBLEU does (FakeSGMLDataset), then XML entities (&amp; &lt; &gt; &quot; &apos;,
    &#N; &#xN;) unescaped. sacreBLEU leaves entities as they are; WMT test sets since 2009 use none (a bare
    `&` stays `&`), so on them both give the same text."""
    for line in lines:
        if line.startswith("<seg "):
            yield unescape_xml(re.sub(r"\s+", " ", _SEG.sub(r"\1", line).strip()))


def unescape_xml(text: str) -> str:
    """The five predefined XML entities and numeric character references, each only with its `;`; anything
    else (a bare `&`, `&nbsp;`) is left as it is."""
    def one(m: re.Match) -> str:
        if m.group(1):
            return _NAMED[m.group(1)]
        code = int(m.group(2)) if m.group(2) else int(m.group(3), 16)
        return chr(code) if 0 < code <= 0x10FFFF else m.group(0)

    return _ENTITY.sub(one, text)
