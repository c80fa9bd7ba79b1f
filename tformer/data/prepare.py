"""`tformer prepare`: a translation corpus, from raw text to a prepared corpus (tformer.data.prepared) once.

1. Count the pairs of each split (a byte scan) and check that aligned files agree.
2. Train SentencePiece on a seeded sample of `data.tokenizer_sample` training pairs (all of them when the
   split is smaller: then the tokenizer is exactly the one trained on the whole split).
3. Encode every split in `data.workers` processes, one shard of `data.shard_size` raw pairs per task, while
   this process reads the text; training pairs are filtered as `filter_pairs` says.

The folder's manifest records what decides its content (`identity`: the training files' SHA-256, the
normalisation, the tokenizer settings or the given tokenizer, the filters, the shard size) and what it holds.
A folder with another corpus's manifest is refused; one with this corpus's manifest is continued (finished
shards kept). Without `data.prepared`, training and evaluation prepare into the cache folder, named by the
identity, so a corpus is prepared once per machine (tformer.data.corpus_cache finds, reuses and rebuilds it).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import gzip
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np
from tqdm import tqdm  # the text bar: tqdm.auto warns in a notebook without ipywidgets

from tformer.config import DataConfig
from tformer.data.corpus import (NORMALIZATION, Corpus, FilterReport, _nul_byte, _open, filter_pairs, iter_lines,
                                  normalize)
from tformer.data.prepared import (FORMAT, MANIFEST, VERSION, PreparedCorpus, load_tokenizers, read_manifest,
                                   read_receipt, save_tokenizers, sha256_file, token_dtype, write_manifest,
                                   write_shard)
from tformer.data.synthetic import SPLITS
from tformer.data.tokenizer import Tokenizer
from tformer.data.vocab import Vocab
from tformer.data.translation import corpus_files, language_files, pair_files, read_split, train_tokenizers
from tformer.languages import Languages
from tformer.errors import DataError

log = logging.getLogger("tformer")

_SEEN: dict[tuple[str, str, int, int], Any] = {}  # (what, path, size, mtime) -> line count or SHA-256
CHUNK = 4096  # pairs encoded at once inside a shard: bounds a worker's Python objects


def count_lines(path: Path) -> int:
    """Lines of a text file (plain or gzip), as `iter_lines` yields them, by scanning bytes (once per process
    while the file is unchanged)."""
    st = path.stat()
    key = ("lines", str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SEEN:
        _SEEN[key] = _scan_lines(path)
    return _SEEN[key]


def _scan_lines(path: Path) -> int:
    n, last = 0, b"\n"
    with _open(path) as f:
        gzipped = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        stream = gzip.open(f) if gzipped else f
        try:
            for chunk in iter(lambda: stream.read(1 << 24), b""):
                nul = chunk.find(b"\0")
                if nul >= 0:
                    raise _nul_byte(str(path), n + chunk.count(b"\n", 0, nul) + 1)
                n += chunk.count(b"\n")
                last = chunk[-1:]
        except (OSError, EOFError) as e:
            raise DataError(f"{path} looks gzip-compressed but cannot be decompressed ({e}); the file is "
                            "probably truncated") from None
    return n + (last != b"\n")


@dataclass
class Source:
    """The raw pairs of one split: how many, where from, and a fresh iterator over them."""

    split: str
    origin: str
    count: int
    inputs: list[dict[str, Any]]  # name, bytes, SHA-256 of each file read
    pairs: Callable[[], Iterator[tuple[str, str]]]
    directions: tuple[tuple[str, int], ...] = ()  # data.pairs: each direction's name and raw pairs, in order


def file_info(path: Path) -> dict[str, Any]:
    st = path.stat()
    key = ("sha256", str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SEEN:
        _SEEN[key] = sha256_file(path)
    return {"name": path.name, "bytes": st.st_size, "sha256": _SEEN[key]}


def source_inputs(cfg: DataConfig, split: str) -> list[dict[str, Any]]:
    """What a prepared split records of the files it was encoded from (`Source.inputs`); a DataError naming the
    file when one is not there."""
    return [file_info(p) for p in corpus_files(cfg, split)]


def open_source(cfg: DataConfig, split: str) -> Source:
    """A split's raw pairs; with data.pairs, every direction's one after the other (`Source.directions`)."""
    if cfg.format == "tsv":  # small by nature (the split needs every source sentence): in memory
        inputs = [file_info(p) for p in corpus_files(cfg, split)]
        corpus = read_split(cfg, split)
        return Source(split, corpus.origin, len(corpus), inputs, lambda: zip(corpus.src, corpus.tgt))
    parts = [_pair_source(split, src, tgt) for _, src, tgt in pair_files(cfg, split)]
    if not cfg.pairs:
        return parts[0]
    names = [name for name, _, _ in pair_files(cfg, split)]
    inputs = list({i["name"] + i["sha256"]: i for p in parts for i in p.inputs}.values())
    return Source(split, f"{cfg.dir} ({', '.join(names)})", sum(p.count for p in parts), inputs,
                  lambda: chain.from_iterable(p.pairs() for p in parts),
                  tuple((name, p.count) for name, p in zip(names, parts)))


def _pair_source(split: str, src_path: Path, tgt_path: Path) -> Source:
    files = [src_path, tgt_path]
    inputs = [file_info(p) for p in files]
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    origin = f"{src_path} + {tgt_path}"
    if n_src != n_tgt:
        for path in files:  # a file that is not text at all says so first, at its line
            for _ in iter_lines(path):
                pass
        short, long_ = (src_path, tgt_path) if n_src < n_tgt else (tgt_path, src_path)
        raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: the files disagree from line "
                        f"{min(n_src, n_tgt) + 1}, which exists in {long_} but not in {short}; the files must be "
                        "aligned line by line")
    if not n_src:
        raise DataError(f"{origin}: the {split} split holds no sentence pairs (empty file); give {split} data, one "
                        "sentence per line")
    return Source(split, origin, n_src, inputs, lambda: zip(iter_lines(src_path), iter_lines(tgt_path)))


# ------------------------------------------------------------------------------------------ identity


def identity(cfg: DataConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None) -> dict[str, Any]:
    """Everything that decides a prepared corpus's content, as JSON. With `tokenizers` (a checkpoint's), they
    replace the tokenizer settings and the training files."""
    out: dict[str, Any] = {
        "normalization": NORMALIZATION, "format": cfg.format,
        "split": ({"columns": list(cfg.tsv_columns), "valid_size": cfg.valid_size, "test_size": cfg.test_size,
                   "seed": cfg.seed} if cfg.format == "tsv" else None),
        "filter": {"max_len": cfg.filter_max_len, "max_ratio": cfg.filter_max_ratio},
        "shard_size": cfg.shard_size,
    }
    if cfg.pairs:  # the directions, in order, decide the tags and the shards' order
        out["pairs"] = list(cfg.pairs)
        out["tags"] = [cfg.language_tag, cfg.tag_sides]
    if tokenizers is not None:
        out["tokenizer"] = {"given": [t.fingerprint() for t in tokenizers]}
    else:
        out["tokenizer"] = {"subword": cfg.subword, "vocab_size": cfg.vocab_size, "joint": cfg.joint_vocab,
                            "character_coverage": cfg.character_coverage, "sample": cfg.tokenizer_sample,
                            "seed": cfg.seed, "train": [file_info(p)["sha256"] for p in corpus_files(cfg, "train")]}
        if cfg.pairs:
            out["tokenizer"]["temperature"] = cfg.temperature
    return out


def identity_key(ident: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{where}{k}.")]
    return [] if a == b else [f"{where.rstrip('.')} ({json.dumps(a)} there, {json.dumps(b)} here)"]


# ------------------------------------------------------------------------------------------ preparing


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One process prepares a folder at a time; the others wait, then find it done."""
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare(cfg: DataConfig, out: str | Path, splits: Iterable[str] = SPLITS,
            tokenizers: tuple[Tokenizer, Tokenizer] | None = None, progress: bool = False,
            workers: int | None = None) -> PreparedCorpus:
    """Prepare `splits` of `cfg`'s corpus into `out` (see the module docstring), continuing an interrupted
    prepare of the same corpus there; returns it opened. `tokenizers` (a checkpoint's) skip training."""
    if cfg.task != "translation":
        raise DataError(f"tformer prepare writes translation corpora; data.task is '{cfg.task}' (its data is made "
                        "in memory: nothing to prepare)")
    splits = [s for s in SPLITS if s in set(splits)]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is a file; give a folder for the prepared corpus")
    if out.is_dir() and not (out / MANIFEST).exists() and any(p.name != ".lock" for p in out.iterdir()):
        raise DataError(f"{out} is not empty and holds no prepared corpus; choose a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {out} ({e.strerror or e}); choose a writable folder") from None
    ident = identity(cfg, tokenizers)
    with _locked(out):
        manifest = read_manifest(out)
        if manifest is not None and manifest["identity"] != ident:
            why = "; ".join(_differences(manifest["identity"], ident)[:6])
            raise DataError(f"{out} holds another corpus: its {MANIFEST} differs in {why}. Choose another folder "
                            "(or remove this one)")
        if manifest is None:
            manifest = {"format": FORMAT, "version": VERSION, "identity": ident, "key": identity_key(ident),
                        "dtype": "", "tokenizer": None, "splits": {}}
            write_manifest(out, manifest)
        tic = time.perf_counter()
        toks = _tokenizers(cfg, out, manifest, tokenizers)
        for split in splits:
            source = open_source(cfg, split)
            entry = manifest["splits"].get(split)
            if entry and entry.get("complete") and entry["inputs"] == source.inputs:
                continue
            if entry and entry["inputs"] != source.inputs:  # its files changed: encode them afresh
                log.info("%s: the %s files changed since they were prepared; encoding them again", out, split)
                shutil.rmtree(out / split, ignore_errors=True)
            manifest["splits"][split] = {"inputs": source.inputs, "complete": False}
            write_manifest(out, manifest)
            manifest["splits"][split] = _encode_split(cfg, out, source, toks, np.dtype(manifest["dtype"]), progress,
                                                      workers)
            write_manifest(out, manifest)
        manifest["seconds"] = round(manifest.get("seconds", 0.0) + time.perf_counter() - tic, 2)
        write_manifest(out, manifest)
    return PreparedCorpus.open(out)


def _tokenizers(cfg: DataConfig, out: Path, manifest: dict[str, Any],
                given: tuple[Tokenizer, Tokenizer] | None) -> tuple[Tokenizer, Tokenizer]:
    """The folder's tokenizers: already there, the given ones, or trained now on a sample of the training pairs."""
    if manifest["tokenizer"]:
        return load_tokenizers(out, manifest)
    info: dict[str, Any] = {}
    if given is not None:
        toks = given
    elif cfg.pairs:
        sentences, info = _language_sample(cfg)
        tic = time.perf_counter()
        toks = train_tokenizers(cfg, Corpus(sentences, [], cfg.dir), Languages.of(cfg).tags)
        info["seconds"] = round(time.perf_counter() - tic, 2)
    else:
        source = open_source(cfg, "train")
        src, tgt, info = _sample(source, cfg.tokenizer_sample, cfg.seed)
        tic = time.perf_counter()
        toks = train_tokenizers(cfg, Corpus(src, tgt, source.origin))
        info["seconds"] = round(time.perf_counter() - tic, 2)
        log.info("SentencePiece trained in %.0f s", info["seconds"])
    manifest["dtype"] = token_dtype(max(len(t.vocab) for t in toks)).name
    manifest["tokenizer"] = {**save_tokenizers(out, toks), "sample": info}
    write_manifest(out, manifest)
    return toks


def _sample(source: Source, size: int, seed: int) -> tuple[list[str], list[str], dict[str, Any]]:
    """Normalised training pairs for SentencePiece: every pair in order when the split has at most `size`
    (or `size` is 0), else `size` pairs drawn without replacement by a generator seeded with `seed`, in
    corpus order."""
    n = source.count
    if not size or size >= n:
        chosen = None
        log.info("SentencePiece learns from all %s training pairs", f"{n:,}")
    else:
        chosen = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
        log.info("SentencePiece learns from %s of %s training pairs (sampled, seed %d)", f"{size:,}", f"{n:,}", seed)
    src, tgt = [], []
    want = iter(chosen.tolist()) if chosen is not None else None
    nxt = next(want) if want is not None else 0
    for i, (s, t) in enumerate(source.pairs()):
        if want is not None:
            if i != nxt:
                continue
            nxt = next(want, -1)
        src.append(normalize(s))
        tgt.append(normalize(t))
        if want is not None and nxt < 0:
            break
    return src, tgt, {"pairs": len(src), "of": n, "seed": seed if chosen is not None else None}


def _language_sample(cfg: DataConfig) -> tuple[list[str], dict[str, Any]]:
    """A multilingual model's SentencePiece text: each language's training sentences (each file once), language l
    given a share ~ n_l ** (1 / data.temperature) of 2 x data.tokenizer_sample sentences (0: all), at most all of
    its own; drawn without replacement, seeded by data.seed, in file order."""
    files = language_files(cfg, "train")
    sizes = {lang: sum(count_lines(p) for p in paths) for lang, paths in files.items()}
    total = sum(sizes.values())
    budget = 2 * cfg.tokenizer_sample or total
    weight = {lang: n ** (1 / cfg.temperature) for lang, n in sizes.items()}
    share = {lang: min(n, round(budget * weight[lang] / sum(weight.values()))) for lang, n in sizes.items()}
    sentences: list[str] = []
    for k, (lang, paths) in enumerate(files.items()):
        n, want = sizes[lang], share[lang]
        chosen = None if want >= n else set(np.random.default_rng([cfg.seed, k]).choice(n, want, replace=False).tolist())
        lines = chain.from_iterable(iter_lines(p) for p in paths)
        sentences.extend(normalize(line) for i, line in enumerate(lines) if chosen is None or i in chosen)
    log.info("SentencePiece learns from %s", ", ".join(f"{share[lang]:,} {lang}" for lang in files))
    return sentences, {"sentences": share, "of": sizes, "temperature": cfg.temperature, "seed": cfg.seed}


_WORKER: dict[str, Any] = {}


def _init_worker(src: Tokenizer, tgt: Tokenizer, dtype: str) -> None:
    _WORKER.update(src=src, tgt=tgt, dtype=np.dtype(dtype))


def _encode_shard(folder: Path, k: int, first: int, pairs: list[tuple[str, str]], limits: tuple[int, float] | None,
                  tags: list[DirectionTags] | None = None) -> dict[str, Any]:
    """Normalise, encode, filter (`limits`: training) and write shard `k`, whose first raw pair is line `first`.
    `tags` (data.pairs): each direction's first raw line and the language tokens put before its sources and its
    targets; the receipt counts the pairs kept of each direction."""
    src_tok, tgt_tok, dtype = _WORKER["src"], _WORKER["tgt"], _WORKER["dtype"]
    tokens, lengths, texts, empty, kept = [], [], [], [], []
    dropped: Counter = Counter()
    for c in range(0, len(pairs), CHUNK):
        chunk = pairs[c : c + CHUNK]
        src_text = [normalize(s) for s, _ in chunk]
        tgt_text = [normalize(t) for _, t in chunk]
        src_ids, tgt_ids = src_tok.encode_batch(src_text), tgt_tok.encode_batch(tgt_text)
        if tags is not None:
            which = np.searchsorted([t.line for t in tags], np.arange(first + c, first + c + len(chunk)), "right") - 1
            src_ids = [[*tags[d].source, *ids] for d, ids in zip(which.tolist(), src_ids)]
            tgt_ids = [[*tags[d].target, *ids] for d, ids in zip(which.tolist(), tgt_ids)]
        if limits is not None:
            keep, report = filter_pairs([len(s) for s in src_ids], [len(t) for t in tgt_ids], *limits)
            dropped.update(report.dropped)
        else:
            keep = range(len(chunk))
            empty.extend(first + c + i for i in keep if not src_text[i] or not tgt_text[i])
        if tags is not None:
            kept.append(which[list(keep)])
        tokens.append(np.fromiter(chain.from_iterable(chain(src_ids[i], tgt_ids[i]) for i in keep), dtype=dtype))
        lengths.append(np.array([(len(src_ids[i]), len(tgt_ids[i])) for i in keep], dtype=np.int64).reshape(-1, 2))
        texts.extend(f"{src_text[i]}\t{tgt_text[i]}" for i in keep)
    receipt = {"first_line": first, "raw": len(pairs), "dropped": dict(dropped), "empty": empty[:5],
               "n_empty": len(empty)}
    if tags is not None:
        receipt["directions"] = np.bincount(np.concatenate(kept), minlength=len(tags)).tolist()
    return write_shard(folder, k, np.concatenate(tokens), np.concatenate(lengths), texts, receipt)


def _encode_split(cfg: DataConfig, out: Path, source: Source, toks: tuple[Tokenizer, Tokenizer],
                  dtype: np.dtype, progress: bool, workers: int | None) -> dict[str, Any]:
    split, size = source.split, cfg.shard_size
    folder = out / split
    folder.mkdir(exist_ok=True)
    for leftover in folder.glob(".*.tmp-*"):  # an interrupted write: never counted, removed now
        leftover.unlink(missing_ok=True)
    n_shards = -(-source.count // size)
    receipts: dict[int, dict[str, Any]] = {}
    for k in range(n_shards):
        r = read_receipt(folder, k)
        if r is not None and r.get("first_line") == k * size + 1 and r.get("raw") == min(size, source.count - k * size):
            receipts[k] = r
    if receipts:
        log.info("%s: %d of %d %s shards already prepared; encoding the rest", out, len(receipts), n_shards, split)
    limits = (cfg.filter_max_len, cfg.filter_max_ratio) if split == "train" else None
    tags = _direction_tags(source, toks[0], Languages.of(cfg))
    workers = workers or cfg.workers or os.cpu_count() or 1
    workers = max(1, min(workers, n_shards - len(receipts)))
    bar = tqdm(total=source.count, initial=sum(r["raw"] for r in receipts.values()), unit="pair", unit_scale=True,
               desc=f"encoding {split}", disable=not progress, dynamic_ncols=True, smoothing=0.1)
    tic = time.perf_counter()
    pairs = source.pairs()
    chunks = ((k, list(islice(pairs, size))) for k in range(n_shards))  # shard k: the next `size` raw pairs
    with bar, _pool(workers, toks, dtype) as submit:
        pending: dict[cf.Future, int] = {}
        for k, chunk in chunks:
            if k in receipts:
                continue
            pending[submit(_encode_shard, folder, k, k * size + 1, chunk, limits, tags)] = k
            while len(pending) > workers:  # a bounded number of shards in memory at once
                _collect(pending, receipts, bar, cf.FIRST_COMPLETED)
        while pending:
            _collect(pending, receipts, bar, cf.ALL_COMPLETED)
    ordered = [receipts[k] for k in range(n_shards)]
    dropped = Counter()
    for r in ordered:
        dropped.update(r["dropped"])
    kept = sum(r["pairs"] for r in ordered)
    if split == "train":
        report = FilterReport(kept, dropped)
        log.info("%s: %s", source.origin, report)
        if not kept:
            raise DataError(f"{source.origin}: every training pair was filtered out ({report}); check the files or "
                            "raise data.filter_max_len / data.filter_max_ratio")
    else:
        n_empty = sum(r["n_empty"] for r in ordered)
        if n_empty:
            lines = [n for r in ordered for n in r["empty"]][:5]
            log.warning("%s: %d %s pair(s) with an empty side (line %s); they are kept and score as written",
                        source.origin, n_empty, split, ", ".join(map(str, lines)) + (" ..." if n_empty > 5 else ""))
    seconds = time.perf_counter() - tic
    log.info("%s: %s pairs encoded into %d shard(s) in %.0f s", split, f"{kept:,}", n_shards, seconds)
    entry = {"inputs": source.inputs, "complete": True, "raw_pairs": source.count, "pairs": kept,
             "tokens": sum(r["tokens"] for r in ordered), "shards": n_shards, "dropped": dict(dropped),
             "seconds": round(seconds, 2)}
    if tags is not None:
        entry["directions"] = [name for name, _ in source.directions]
    return entry


class DirectionTags(NamedTuple):
    """What a direction's pairs start with: its first raw line (1-based), then the ids before each source and each
    target (data.tag_sides 'source': the target's token before the source; 'both': the source's token before the
    source and the target's before the target)."""

    line: int
    source: tuple[int, ...]
    target: tuple[int, ...]


def _direction_tags(source: Source, tok: Tokenizer, languages: Languages | None) -> list[DirectionTags] | None:
    """Each direction's DirectionTags (None: one direction). Tokens on the target side must be ones the
    tokenizer leaves out of the text (an imported M2M-100's, NLLB-200's or mBART-50's), or outputs would show
    them."""
    if not source.directions or languages is None:
        return None
    out, line = [], 1
    for name, count in source.directions:
        src, tgt = name.split("-")
        ids = {}
        for lang in (src, tgt) if languages.tag_sides == "both" else (tgt,):  # Johnson et al.: no source token
            ids[lang] = tok.vocab.encode([languages.tag(lang)])[0]
            if ids[lang] == Vocab.unk:
                raise DataError(f"the tokenizer has no piece {languages.tag(lang)} for direction {name}: prepare the "
                                "corpus with a tokenizer trained for data.pairs (or add the direction to data.pairs "
                                "before training)")
        if languages.tag_sides == "source":
            out.append(DirectionTags(line, (ids[tgt],), ()))
        elif languages.tag(tgt) in getattr(tok, "controls", ()):
            out.append(DirectionTags(line, (ids[src],), (ids[tgt],)))
        else:
            raise DataError(f"data.tag_sides=both puts {languages.tag(tgt)} before the targets, but the tokenizer "
                            "would write it into the outputs' text: tags on both sides are for models imported "
                            "with them (M2M-100, NLLB-200, mBART-50); train with data.tag_sides=source")
        line += count
    return out


def _collect(pending: dict[cf.Future, int], receipts: dict[int, dict[str, Any]], bar: tqdm, when: str) -> None:
    done, _ = cf.wait(pending, return_when=when)
    for fut in done:
        k = pending.pop(fut)
        receipts[k] = fut.result()  # a worker's DataError (a full disk, an over-long sentence) surfaces here
        bar.update(receipts[k]["raw"])


@contextlib.contextmanager
def _pool(workers: int, toks: tuple[Tokenizer, Tokenizer], dtype: np.dtype):
    """`submit(fn, *args)` running in `workers` processes (forked: they start at once), or here for one."""
    initargs = (toks[0], toks[1], dtype.name)  # forked processes inherit them; spawned ones unpickle them
    if workers == 1:
        _init_worker(*initargs)

        def submit(fn, *args):
            fut: cf.Future = cf.Future()
            try:
                fut.set_result(fn(*args))
            except Exception as e:  # noqa: BLE001 - handed to the caller through the future, as a pool does
                fut.set_exception(e)
            return fut

        yield submit
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pool = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=initargs)
    try:
        yield pool.submit
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
