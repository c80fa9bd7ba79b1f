"""A prepared corpus: a translation task encoded once into memory-mapped shards, read without loading it.

    DIR/manifest.json             what decides the content (`identity`) and what is there (splits, shards)
    DIR/spm.model                 the joint SentencePiece model (or spm.src.model and spm.tgt.model)
    DIR/{split}/{k:05d}.tok.npy   token ids, uint16 (vocabulary <= 65,536) or uint32: the source then the
                                  target of each kept pair, back to back
    DIR/{split}/{k:05d}.off.npy   (n,) int64: where each pair starts in .tok.npy
    DIR/{split}/{k:05d}.len.npy   (n, 2) uint16: source and target lengths in pieces (no specials)
    DIR/{split}/{k:05d}.txt       the normalised text of each kept pair, 'source<TAB>target' per line
    DIR/{split}/{k:05d}.json      the shard's receipt, written last: counts, sizes and SHA-256 of its files

A folder found inconsistent with itself (a manifest that is not JSON, a tokenizer or a shard that disagrees
with its record) raises DamagedCorpusError: the one error after which the cache may rebuild an entry
(tformer.data.prepare). A file that cannot be read, or a manifest of another format or a newer version, is
a plain DataError: the folder may be whole, and it is left as it is.

Shard k holds raw pairs k x shard_size ... (k + 1) x shard_size - 1 of its split (training pairs filtered).
A shard counts only once its receipt exists and its files have the sizes the receipt gives; every file is
written under a temporary name and renamed into place, so an interrupted `tformer prepare` leaves finished
shards that a rerun keeps and nothing half-written that anything reads.

Reading maps the token and offset files (`mmap`) and keeps only the lengths in memory (4 bytes per pair):
batches are planned from the lengths and only the pairs of the batches in flight are read.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from tformer.data.tokenizer import PieceTableTokenizer, SubwordTokenizer, Tokenizer
from tformer.data.vocab import Vocab
from tformer.errors import DataError
from tformer.languages import Directions
from tformer.files import replace_atomically

FORMAT = "tformer-prepared"
VERSION = 1
MANIFEST = "manifest.json"


class DamagedCorpusError(DataError):
    """A prepared corpus folder that disagrees with itself (its manifest, receipts, shards, tokenizers)."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabulary <= 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_file(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary name and an fsync: `path` is either absent or whole. A full
    disk (or a file-size limit) is a DataError naming the file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise DataError(f"could not write {path} ({e.strerror or e}); the shards finished before it are kept: "
                        "free space and run the same `tformer prepare` again to continue") from None


def write_shard(folder: Path, k: int, tokens: np.ndarray, lengths: np.ndarray, texts: list[str],
                receipt: dict[str, Any]) -> dict[str, Any]:
    """Shard `k` into `folder`: `tokens` (each pair's source then target ids, back to back), `lengths` (n, 2)
    and the pairs' `texts`; its receipt (holding `receipt`'s entries too) last."""
    if lengths.size and int(lengths.max()) >= 1 << 16:
        raise DataError(f"{folder}, shard {k}: a sentence of {int(lengths.max())} pieces; a prepared corpus stores "
                        "lengths up to 65,535 (lower data.filter_max_len, or split the line)")
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths.sum(axis=1)[:-1], out=offsets[1:])
    files = {"tok": _npy_bytes(tokens), "off": _npy_bytes(offsets), "len": _npy_bytes(lengths.astype(np.uint16)),
             "txt": "".join(line + "\n" for line in texts).encode("utf-8")}
    out = {**receipt, "pairs": len(lengths), "tokens": int(tokens.size), "dtype": tokens.dtype.name, "files": {}}
    for name, data in files.items():
        path = folder / f"{k:05d}.{name}" if name == "txt" else folder / f"{k:05d}.{name}.npy"
        write_file(path, data)
        out["files"][path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_file(folder / f"{k:05d}.json", json.dumps(out, indent=1).encode("utf-8"))
    return out


def read_receipt(folder: Path, k: int) -> dict[str, Any] | None:
    """Shard k's receipt when the shard is complete (receipt readable, files of the recorded sizes), else None."""
    path = folder / f"{k:05d}.json"
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
        files = receipt["files"]
        for name, info in files.items():
            if (folder / name).stat().st_size != info["bytes"]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return receipt


class MappedArray:
    """A read-only memory map of an .npy file: its array without reading it, and a way to hand the pages
    read so far back to the page cache (`release`), so a long epoch does not grow the process's memory."""

    def __init__(self, path: Path, dtype: np.dtype | None = None, ndim: int = 1) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, file_dtype = read_header(f)
                offset = f.tell()
                size = os.fstat(f.fileno()).st_size
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except FileNotFoundError:
            raise DamagedCorpusError(f"{path} is missing: the prepared corpus is incomplete; run `tformer prepare` "
                                     "with the same settings again to rebuild it") from None
        except ValueError as e:
            raise DamagedCorpusError(f"{path} is not a readable .npy file ({e}); the prepared corpus is damaged: "
                                     "run `tformer prepare` with the same settings again to rebuild it") from None
        except OSError as e:
            raise DataError(f"{path} cannot be read ({e.strerror or e}); check the folder's permissions and "
                            "the disk") from None
        need = offset + int(np.prod(shape, dtype=np.int64)) * file_dtype.itemsize
        if fortran or len(shape) != ndim or (dtype is not None and file_dtype != dtype) or size < need:
            why = (f"{size} bytes where its header needs {need} (truncated)" if size < need
                   else f"dtype {file_dtype} shape {shape}, expected {dtype} with {ndim} dimension(s)")
            raise DamagedCorpusError(f"{path}: {why}; the prepared corpus is damaged: run `tformer prepare` with "
                                     "the same settings again to rebuild it")
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_RANDOM)  # batches read scattered pairs: no read-ahead
        self.array = (np.frombuffer(self._mm, dtype=file_dtype, count=int(np.prod(shape)), offset=offset)
                      .reshape(shape) if self._mm is not None and need > offset
                      else np.empty(shape, dtype=file_dtype))

    def release(self) -> None:
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_DONTNEED)


@dataclass
class _Shard:
    tokens: MappedArray
    offsets: MappedArray
    lengths: np.ndarray  # (n, 2) uint16, in memory


class ShardedExamples(Sequence):
    """The pairs of one split of a prepared corpus, as a sequence of (source ids, target ids) lists; lengths
    come from memory, ids from the mapped shards only when a pair is read."""

    def __init__(self, folder: Path, receipts: list[dict[str, Any]], dtype: np.dtype) -> None:
        self.folder = folder
        self._shards: list[_Shard] = []
        for k, receipt in enumerate(receipts):
            lengths = MappedArray(folder / f"{k:05d}.len.npy", np.dtype(np.uint16), 2)
            shard = _Shard(MappedArray(folder / f"{k:05d}.tok.npy", dtype), MappedArray(folder / f"{k:05d}.off.npy",
                           np.dtype(np.int64)), np.array(lengths.array))
            n, tokens = len(shard.lengths), shard.tokens.array.size
            if n != receipt["pairs"] or len(shard.offsets.array) != n or tokens != receipt["tokens"] or (
                    n and int(shard.offsets.array[-1]) + int(shard.lengths[-1].astype(np.int64).sum()) != tokens):
                raise DamagedCorpusError(
                    f"{folder / f'{k:05d}.json'}: the shard's files disagree with it and with each other ({n} pairs, "
                    f"{tokens} tokens; receipt: {receipt['pairs']} and {receipt['tokens']}); run `tformer prepare` "
                    "with the same settings again to rebuild it")
            self._shards.append(shard)
        self._starts = np.cumsum([0] + [len(s.lengths) for s in self._shards]).tolist()
        self._lengths = (np.concatenate([s.lengths for s in self._shards]) if self._shards
                         else np.zeros((0, 2), dtype=np.uint16))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:  # type: ignore[override]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} of {len(self)}")
        k = bisect_right(self._starts, i) - 1
        shard = self._shards[k]
        j = i - self._starts[k]
        o = int(shard.offsets.array[j])
        a, b = (int(x) for x in shard.lengths[j])
        ids = shard.tokens.array[o : o + a + b].tolist()
        return ids[:a], ids[a:]

    def __iter__(self) -> Iterator[tuple[list[int], list[int]]]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> np.ndarray:
        """(n, 2) uint16: source and target pieces of every pair."""
        return self._lengths

    def model_lengths(self, frame_rate: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Source + </s> and <s> + target, as `tformer.data.model_lengths` gives them (int32, from memory)."""
        lengths = self._lengths.astype(np.int32)
        lengths += 1
        return lengths[:, 0], lengths[:, 1]

    def release(self) -> None:
        """Return the mapped pages read so far to the page cache (they stay cached, shared between processes)."""
        for s in self._shards:
            s.tokens.release()
            s.offsets.release()


class PreparedCorpus:
    """A prepared corpus folder, opened for reading (see the module docstring)."""

    def __init__(self, path: Path, manifest: dict[str, Any], tokenizers: tuple[SubwordTokenizer, SubwordTokenizer]
                 ) -> None:
        self.path = path
        self.manifest = manifest
        self.tokenizers = tokenizers

    @classmethod
    def open(cls, path: str | Path) -> "PreparedCorpus":
        path = Path(path)
        manifest = read_manifest(path)
        if manifest is None:
            raise DataError(f"{path} holds no prepared corpus (no {MANIFEST}); write one with `tformer prepare "
                            f"--config C --out {path}`")
        return cls(path, manifest, load_tokenizers(path, manifest))

    @property
    def splits(self) -> list[str]:
        return [s for s, e in self.manifest["splits"].items() if e.get("complete")]

    def entry(self, split: str) -> dict[str, Any]:
        """The manifest's record of a complete split (else a DataError saying which splits are complete)."""
        entry = self.manifest["splits"].get(split)
        if not entry or not entry.get("complete"):
            have = ", ".join(self.splits) or "none"
            raise DataError(f"{self.path} holds no complete '{split}' split (complete: {have}); run `tformer "
                            f"prepare` with the same settings on it to add it")
        return entry

    def examples(self, split: str) -> ShardedExamples:
        entry = self.entry(split)
        folder = self.path / split
        receipts = []
        for k in range(entry["shards"]):
            receipt = read_receipt(folder, k)
            if receipt is None:
                raise DamagedCorpusError(
                    f"{folder / f'{k:05d}.json'}: shard {k} of '{split}' is missing or incomplete (its receipt is "
                    "absent, or a file's size differs from it); run `tformer prepare` with the same settings again "
                    "to rebuild it")
            receipts.append(receipt)
        return ShardedExamples(folder, receipts, np.dtype(self.manifest["dtype"]))

    def directions(self, split: str) -> "Directions | None":
        """Which direction each kept pair of a multilingual split belongs to (None: one direction)."""
        names = self.entry(split).get("directions")
        if not names:
            return None
        counts = [(read_receipt(self.path / split, k) or {}).get("directions") for k in range(self.entry(split)["shards"])]
        if any(c is None or len(c) != len(names) for c in counts):
            raise DamagedCorpusError(f"{self.path / split}: a shard's receipt lacks its directions' counts; run "
                                     "`tformer prepare` with the same settings again to rebuild it")
        per_shard = [np.repeat(np.arange(len(names), dtype=np.int16), c) for c in counts]
        return Directions(tuple(names), np.concatenate(per_shard))

    def texts(self, split: str) -> tuple[list[str], list[str]]:
        """The normalised source and target sentences of the split's kept pairs, in order."""
        entry = self.entry(split)
        src, tgt = [], []
        for k in range(entry["shards"]):
            path = self.path / split / f"{k:05d}.txt"
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                raise DamagedCorpusError(f"{path} is missing; run `tformer prepare` again to rebuild it") from None
            except UnicodeDecodeError as e:
                raise DamagedCorpusError(f"{path} cannot be read ({e}); run `tformer prepare` again to rebuild "
                                         "it") from None
            except OSError as e:
                raise DataError(f"{path} cannot be read ({e.strerror or e}); check the folder's permissions and "
                                "the disk") from None
            for n, line in enumerate(lines, 1):
                s, tab, t = line.partition("\t")
                if not tab:
                    raise DamagedCorpusError(f"{path}, line {n}: no tab between source and target; the prepared "
                                             "corpus is damaged: run `tformer prepare` again to rebuild it")
                src.append(s)
                tgt.append(t)
        return src, tgt

    def verify(self) -> list[str]:
        """Every shard file checked against its receipt's SHA-256; the problems found (empty: all good)."""
        problems = []
        for split in self.splits:
            folder = self.path / split
            for k in range(self.manifest["splits"][split]["shards"]):
                receipt = read_receipt(folder, k)
                if receipt is None:
                    problems.append(f"{folder / f'{k:05d}.json'}: missing or incomplete shard")
                    continue
                for name, info in receipt["files"].items():
                    if sha256_file(folder / name) != info["sha256"]:
                        problems.append(f"{folder / name}: SHA-256 differs from its receipt (the file was changed "
                                        "or damaged)")
        return problems


def tokenizer_files(joint: bool) -> tuple[str, str]:
    return ("spm.model", "spm.model") if joint else ("spm.src.model", "spm.tgt.model")


def save_tokenizers(folder: Path, toks: tuple[Tokenizer, Tokenizer]) -> dict[str, Any]:
    """Write the corpus's tokenizers into `folder` (durably); returns the manifest's record of them without the
    sample. SentencePiece models trained here: spm.model (joint) or spm.{src,tgt}.model; a piece table (an
    imported model's tokenizers, kind 'pieces'): spm.{side}.model, table.{side}.json and vocab.{side}.txt."""
    joint = toks[0] is toks[1] or toks[0].fingerprint() == toks[1].fingerprint()
    kind = toks[0].kind
    if kind == "pieces":
        names: tuple[str, str] = ("spm.src.model", "spm.src.model" if joint else "spm.tgt.model")
        for tok, side in zip(toks[: 1 if joint else 2], ("src", "tgt")):
            for name, data in {**tok.files(side), f"vocab.{side}.txt": tok.vocab.dumps()}.items():
                write_file(folder / name, data)
    else:
        names = tokenizer_files(joint)
        for tok, name in zip(toks, names):
            write_file(folder / name, tok.model_bytes)
    return {"kind": kind, "files": list(names), "fingerprints": [t.fingerprint() for t in toks],
            "pieces": [len(t.vocab) for t in toks]}


def load_tokenizers(path: Path, manifest: dict[str, Any]) -> tuple[Tokenizer, Tokenizer]:
    info = manifest.get("tokenizer") or {}
    names = info.get("files")
    if not names:
        raise DamagedCorpusError(f"{path / MANIFEST} names no tokenizer: the prepare stopped before training it; "
                                 "run `tformer prepare` with the same settings again")
    pieces = info.get("kind", "subword") == "pieces"

    def load(name: str) -> Tokenizer:
        if pieces:  # spm.{side}.model beside table.{side}.json and vocab.{side}.txt
            side = name.split(".")[1]
            return PieceTableTokenizer.load(path, side, Vocab.load(path / f"vocab.{side}.txt"))
        return SubwordTokenizer.load(path / name)

    try:
        src = load(names[0])
        tgt = src if names[1] == names[0] else load(names[1])
    except DamagedCorpusError:
        raise
    except DataError as e:  # a file the manifest names, missing or not a tokenizer
        raise DamagedCorpusError(f"{e}; the prepared corpus {path} is damaged: run `tformer prepare` again into "
                                 "a new folder") from None
    for tok, name, fp in zip((src, tgt), names, info["fingerprints"]):
        if tok.fingerprint() != fp:
            raise DamagedCorpusError(f"{path / name} is not the tokenizer the corpus was encoded with (its SHA-256 "
                                     f"differs from {MANIFEST}'s); the folder was changed: run `tformer prepare` "
                                     "again into a new one")
    limit = np.iinfo(np.dtype(manifest["dtype"])).max + 1
    for tok, name in zip((src, tgt), names):
        if len(tok.vocab) > limit:
            raise DamagedCorpusError(f"{path / name}: {len(tok.vocab)} pieces do not fit the corpus's "
                                     f"{manifest['dtype']} token ids (at most {limit}); the folder mixes files of "
                                     "different corpora: run `tformer prepare` again into a new folder")
    return src, tgt


def read_manifest(path: Path, fmt: str = FORMAT, keys: tuple[tuple[str, type], ...] = (
        ("identity", dict), ("splits", dict), ("dtype", str))) -> dict[str, Any] | None:
    """The manifest of a prepared corpus folder (of format `fmt`: text, or tformer.data.features' speech
    features, with its `keys`); None when there is none. A damaged or foreign one is an error."""
    file = path / MANIFEST
    if not file.exists():
        return None
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{file} cannot be read ({e.strerror or e}); check the folder's permissions and the "
                        "disk") from None
    except ValueError as e:  # written whole or not at all (replace_atomically): changed since
        raise DamagedCorpusError(f"{file} cannot be read ({e}); remove the folder and run `tformer prepare` "
                                 "again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise DataError(f"{file} is not a tformer prepared-corpus manifest (no format '{fmt}'); choose "
                        "another folder")
    if manifest.get("version", 0) > VERSION:
        raise DataError(f"{file}: format version {manifest.get('version')} is newer than this tformer reads "
                        f"({VERSION}); upgrade tformer")
    for key, kind in keys:
        if not isinstance(manifest.get(key), kind):
            raise DamagedCorpusError(f"{file}: '{key}' is missing or not a {kind.__name__}; the file is damaged: "
                                     "remove the folder and run `tformer prepare` again")
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    try:
        with replace_atomically(path / MANIFEST, fsync=True) as f:
            f.write(json.dumps(manifest, indent=1))
    except OSError as e:
        raise DataError(f"could not write {path / MANIFEST} ({e.strerror or e}); free space and run the same "
                        "`tformer prepare` again to continue") from None
