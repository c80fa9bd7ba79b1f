"""Raw parallel corpora: two aligned files (plain or gzip) or one tab-separated file.

Every reader fails on the first problem with the file and line: invalid UTF-8, a NUL byte (not a text file),
a truncated gzip stream, files of different lengths, a TSV line with too few fields. Text is normalised
(NFC, no-break spaces to spaces, runs of whitespace to one space) before anything else sees it. Filtering
of training pairs lives in `filter_pairs` and reports how many pairs it dropped and why.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from tformer.errors import ConfigError, DataError

# U+00A0 no-break space and U+202F narrow no-break space are the two d2l replaces in fra.txt; U+2007/U+2060
# (figure space, word joiner) and U+FEFF (a stray byte-order mark) are the same trouble in other corpora.
_SPACES = {"\u00a0": " ", "\u202f": " ", "\u2007": " ", "\u2060": "", "\ufeff": ""}
_TRANSLATE = str.maketrans(_SPACES)

NORMALIZATION = "nfc+nbsp+ws1"  # bump when `normalize` changes: it is part of the encoding cache key


def normalize(line: str) -> str:
    """NFC, no-break spaces to plain spaces, whitespace runs to one space, no leading/trailing space."""
    return " ".join(unicodedata.normalize("NFC", line).translate(_TRANSLATE).split())


def _open(path: str | Path) -> BinaryIO:
    """`path` opened to read bytes; the errors name the file and say what is wrong with it."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, not a text file") from None
    except OSError as e:
        raise DataError(f"{path} cannot be read ({e.strerror})") from None


def _open_bytes(path: Path) -> bytes:
    with _open(path) as f:
        try:
            raw = f.read()
        except OSError as e:
            raise DataError(f"{path} cannot be read ({e.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{path} looks gzip-compressed but cannot be decompressed ({e}); "
                            "the file is probably truncated") from None
    return raw


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file, plain or gzip (by content, not by name), without line endings."""
    path = Path(path)
    return decode_lines(_open_bytes(path), str(path))


def decode_lines(raw: bytes, where: str) -> list[str]:
    """The lines of UTF-8 bytes (`where` names them in messages: a path, 'standard input')."""
    nul = raw.find(b"\0")  # before decoding: a binary file is 'not text' rather than 'not UTF-8'
    if nul >= 0:
        raise _nul_byte(where, raw.count(b"\n", 0, nul) + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        raise _not_utf8(where, raw[: e.start].count(b"\n") + 1, e.start - line_start + 1,
                        raw[e.start : e.start + 1]) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def iter_lines(source: str | Path | BinaryIO, where: str | None = None) -> Iterator[str]:
    """The lines of a UTF-8 text file (a path, or a seekable binary file read from its start), plain or gzip
    by content, one at a time: memory does not grow with the file. Each line is checked as `decode_lines`
    checks a whole file (a NUL byte, invalid UTF-8: the line and byte), line by line."""
    where = where or str(source)
    with contextlib.ExitStack() as stack:
        if isinstance(source, (str, Path)):
            f = stack.enter_context(_open(source))
        else:
            f = source
            f.seek(0)
        gzipped = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        stream = stack.enter_context(gzip.open(f)) if gzipped else f
        for n, raw in enumerate(_raw_lines(stream, where, gzipped), 1):
            if b"\0" in raw:
                raise _nul_byte(where, n)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(where, n, e.start + 1, raw[e.start : e.start + 1]) from None
            if n == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield line.removesuffix("\n").removesuffix("\r")


def _raw_lines(stream: BinaryIO, where: str, gzipped: bool) -> Iterator[bytes]:
    try:
        yield from stream
    except (OSError, EOFError) as e:
        if not gzipped:
            raise DataError(f"{where} cannot be read ({e})") from None
        raise DataError(f"{where} looks gzip-compressed but cannot be decompressed ({e}); "
                        "the file is probably truncated") from None


def _nul_byte(where: str, line: int) -> DataError:
    return DataError(f"{where}, line {line}: a NUL byte; this is not a text file (a binary, a compressed format "
                     "other than gzip, or UTF-16); give UTF-8 text, one sentence per line")


def _not_utf8(where: str, line: int, col: int, byte: bytes) -> DataError:
    return DataError(f"{where}, line {line}, byte {col} of the line: not valid UTF-8 ({byte!r}); convert it to "
                     "UTF-8 (e.g. iconv -f latin1 -t utf-8)")


@dataclass
class Corpus:
    """Normalised sentence pairs and where each came from (for messages)."""

    src: list[str]
    tgt: list[str]
    origin: str  # 'a.en + a.de' or 'fra.txt'
    lines: list[int] = field(default_factory=list)  # 1-based line number of each pair in its file(s)

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, idx: list[int]) -> "Corpus":
        return Corpus([self.src[i] for i in idx], [self.tgt[i] for i in idx], self.origin,
                      [self.lines[i] for i in idx])


def read_aligned(src_path: str | Path, tgt_path: str | Path) -> Corpus:
    """Line i of `src_path` translates line i of `tgt_path`."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        short, long_ = (src_path, tgt_path) if len(src) < len(tgt) else (tgt_path, src_path)
        n = min(len(src), len(tgt))
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the files disagree "
                        f"from line {n + 1}, which exists in {long_} but not in {short}; the files must be "
                        "aligned line by line")
    return Corpus([normalize(s) for s in src], [normalize(t) for t in tgt], f"{src_path} + {tgt_path}",
                  list(range(1, len(src) + 1)))


def read_tsv(path: str | Path, src_column: int = 0, tgt_column: int = 1) -> Corpus:
    """One pair per line, fields separated by tabs (the Tatoeba / manythings `fra.txt` format; extra
    columns such as attribution are ignored)."""
    need = max(src_column, tgt_column) + 1
    src, tgt = [], []
    for n, line in enumerate(read_lines(path), 1):
        fields = line.split("\t")
        if len(fields) < need:
            raise DataError(f"{path}, line {n}: {len(fields)} tab-separated field(s), but columns "
                            f"{src_column} and {tgt_column} (0-based) are needed; is this a TSV file?")
        src.append(normalize(fields[src_column]))
        tgt.append(normalize(fields[tgt_column]))
    return Corpus(src, tgt, str(path), list(range(1, len(src) + 1)))


def _rank(seed: int, text: str) -> bytes:
    return hashlib.sha256(f"{seed}\t{text}".encode("utf-8")).digest()


def split_corpus(corpus: Corpus, valid_size: int, test_size: int, seed: int) -> dict[str, Corpus]:
    """A seeded train/valid/test split that never changes: pairs are grouped by source sentence (so every
    translation of one sentence lands in the same split, and no test sentence is seen in training), groups
    ordered by a SHA-256 of (seed, source), test filled first, then valid, the rest train."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(corpus.src):
        groups.setdefault(s, []).append(i)
    order = sorted(groups, key=lambda s: _rank(seed, s))
    out: dict[str, list[int]] = {"test": [], "valid": [], "train": []}
    for s in order:
        name = "test" if len(out["test"]) < test_size else "valid" if len(out["valid"]) < valid_size else "train"
        out[name].extend(groups[s])
    if not out["train"]:
        raise ConfigError(f"{corpus.origin}: {len(corpus)} pairs leave nothing for training after "
                          f"test_size={test_size} and valid_size={valid_size}; lower them")
    return {k: corpus.subset(sorted(v)) for k, v in out.items()}


@dataclass
class FilterReport:
    kept: int
    dropped: Counter  # reason -> count

    def __str__(self) -> str:
        total = self.kept + sum(self.dropped.values())
        if not self.dropped:
            return f"kept all {total} training pairs"
        why = ", ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
        return f"kept {self.kept} of {total} training pairs; dropped {why}"


def filter_pairs(src_lens: list[int], tgt_lens: list[int], max_len: int, max_ratio: float
                 ) -> tuple[list[int], FilterReport]:
    """Indices of training pairs to keep: both sides non-empty, at most `max_len` tokens, and the longer
    side at most `max_ratio` times the shorter (0 = no ratio check). Lengths are in model tokens."""
    keep, dropped = [], Counter()
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        if s == 0 or t == 0:
            dropped["with an empty side"] += 1
        elif s > max_len or t > max_len:
            dropped[f"longer than {max_len} tokens"] += 1
        elif max_ratio and max(s, t) > max_ratio * min(s, t):
            dropped[f"with a length ratio above {max_ratio:g}"] += 1
        else:
            keep.append(i)
    return keep, FilterReport(len(keep), dropped)
