"""A prepared speech corpus: features computed once (filterbanks from audio, or .npy frames copied) into
memory-mapped shards, with the training set's global CMVN statistics.

    DIR/manifest.json            what decides the content (`identity`), the splits, the CMVN statistics
    DIR/{split}/{k:05d}.feat.npy (frames, F) float16 or float32: the utterances' frames back to back
    DIR/{split}/{k:05d}.off.npy  (n,) int64: where each utterance starts in .feat.npy
    DIR/{split}/{k:05d}.len.npy  (n,) int32: its frames
    DIR/{split}/{k:05d}.tsv      'id<TAB>transcript' per utterance
    DIR/{split}/{k:05d}.json     the receipt, written last: counts, file sizes and SHA-256, and the float64 sums
                                 of the frames and of their squares per value (CMVN is summed from these)

Shard k holds utterances k x data.speech_shard_size ... of its split's list. As for text (tformer.data.prepared),
every file is written under a temporary name and renamed, a shard counts once its receipt is there, and a rerun
keeps the finished shards: an interrupted `tformer prepare` loses nothing. Before any features are computed, every
line of every list and every file's header is checked, and all problems are reported with their lines: a corpus with
a stereo or 8 kHz file is refused with nothing written. Reading maps the feature files; only the lengths
are held in memory, so memory does not grow with the corpus.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import shutil
from bisect import bisect_right
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from tformer.config import DataConfig
from tformer.data.audio import FbankOptions
from tformer.data import prepared
from tformer.data.prepared import MappedArray, _npy_bytes, read_receipt, sha256_file, write_file, write_manifest
from tformer.data.speech import Entry, check_files, read_list, split_list, utterance_features
from tformer.data.synthetic import SPLITS
from tformer.errors import DataError

log = logging.getLogger("tformer")

FORMAT = "tformer-features"
VERSION = 1
MANIFEST = prepared.MANIFEST


def identity(cfg: DataConfig, feature_dim: int) -> dict[str, Any]:
    """What decides a prepared speech corpus: each list's SHA-256, the features and how they are stored. The
    audio is identified by its list: a changed recording under the same id needs a new folder (or a rebuild)."""
    return {"format": FORMAT, "lists": {s: sha256_file(split_list(cfg, s)) for s in SPLITS
                                        if split_list(cfg, s).is_file()},
            "feature_dim": feature_dim, "fbank": FbankOptions(num_mel_bins=feature_dim).to_dict(),
            "dtype": cfg.feature_dtype, "max_frames": cfg.max_frames, "shard_size": cfg.speech_shard_size}


def inputs(entries: list[Entry]) -> str:
    """A digest of the files a list names, by size and modification time: a changed recording changes it."""
    h = hashlib.sha256()
    for e in entries:
        st = e.path.stat()
        h.update(f"{e.id}\t{e.path.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def identity_key(ident: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _shard(folder: str, k: int, entries: list[Entry], feature_dim: int, max_frames: int, dtype: str,
           tsv: str) -> dict[str, Any]:
    """Compute and write shard k (in a worker process); its receipt."""
    folder_p = Path(folder)
    frames, problems = [], []
    for e in entries:
        try:
            frames.append(utterance_features(e.path, feature_dim, max_frames))
        except DataError as err:
            problems.append(f"{tsv}, line {e.line}: utterance '{e.id}': {err}")
    if problems:
        raise DataError("\n  ".join(problems))
    lengths = np.array([f.shape[0] for f in frames], dtype=np.int32)
    offsets = np.zeros(len(frames), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    stacked = np.concatenate(frames)  # float32
    total = sum(f.astype(np.float64).sum(axis=0) for f in frames)
    total_sq = sum((f.astype(np.float64) ** 2).sum(axis=0) for f in frames)
    files = {"feat": _npy_bytes(stacked.astype(dtype)), "off": _npy_bytes(offsets), "len": _npy_bytes(lengths),
             "tsv": "".join(f"{e.id}\t{e.transcript}\n" for e in entries).encode("utf-8")}
    receipt: dict[str, Any] = {"utterances": len(entries), "frames": int(lengths.sum()),
                               "sum": total.tolist(), "sum_sq": total_sq.tolist(),
                               "files": {}}
    for name, data in files.items():
        path = folder_p / (f"{k:05d}.tsv" if name == "tsv" else f"{k:05d}.{name}.npy")
        write_file(path, data)
        receipt["files"][path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_file(folder_p / f"{k:05d}.json", json.dumps(receipt).encode("utf-8"))
    return receipt


def prepare_features(cfg: DataConfig, out: str | Path, feature_dim: int, splits: Iterable[str] = SPLITS,
                     progress: bool = False) -> "PreparedFeatures":
    """Compute the features of `splits` into `out` (see the module docstring); finished shards of an earlier
    run with the same identity are kept. A folder holding another corpus is refused."""
    out = Path(out)
    splits = list(splits)
    ident = identity(cfg, feature_dim)
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out)
    if manifest is not None and manifest["identity"] != ident:
        raise DataError(f"{out} holds features prepared with other settings or lists ({out / MANIFEST}); "
                        "choose another folder, or remove this one")
    manifest = manifest or {"format": FORMAT, "version": VERSION, "identity": ident, "splits": {}}
    lists = {s: split_list(cfg, s) for s in splits}
    entries = {s: read_list(lists[s]) for s in splits}  # every list's problems before any work
    for s in splits:
        check_files(lists[s], entries[s], feature_dim)
    workers = cfg.workers or os.cpu_count() or 1
    size = cfg.speech_shard_size
    for s in splits:
        folder = out / s
        folder.mkdir(exist_ok=True)
        n_shards = -(-len(entries[s]) // size)
        todo = [k for k in range(n_shards) if read_receipt(folder, k) is None]
        with cf.ProcessPoolExecutor(min(workers, max(len(todo), 1))) as pool, tqdm(
                total=len(entries[s]), unit="utt", desc=f"features {s}", disable=not progress) as bar:
            bar.update(len(entries[s]) - sum(len(entries[s][k * size : (k + 1) * size]) for k in todo))
            futures = {pool.submit(_shard, str(folder), k, entries[s][k * size : (k + 1) * size], feature_dim,
                                   cfg.max_frames, cfg.feature_dtype, str(lists[s])): k for k in todo}
            problems = []
            for f in cf.as_completed(futures):
                try:
                    bar.update(f.result()["utterances"])
                except DataError as e:
                    problems.append(str(e))
            if problems:
                raise DataError(f"problems in {lists[s]} (the shards without any are kept):\n  "
                                + "\n  ".join(problems))
        receipts = [read_receipt(folder, k) for k in range(n_shards)]
        manifest["splits"][s] = {"complete": True, "shards": n_shards, "utterances": len(entries[s]),
                                 "frames": sum(r["frames"] for r in receipts), "inputs": inputs(entries[s])}
        if s == "train":
            count = sum(r["frames"] for r in receipts)
            total = np.sum([r["sum"] for r in receipts], axis=0)
            total_sq = np.sum([r["sum_sq"] for r in receipts], axis=0)
            mean = total / count
            manifest["cmvn"] = {"frames": count, "mean": mean.tolist(),
                                "std": np.sqrt(np.maximum(total_sq / count - mean**2, 0.0)).tolist()}
        write_manifest(out, manifest)
    return PreparedFeatures.open(out)


class FrameShards(Sequence):
    """The frames of one split, utterance by utterance, as (S, F) float32 tensors read from the mapped shards."""

    def __init__(self, folder: Path, receipts: list[dict[str, Any]], feature_dim: int) -> None:
        self._feats, self._offsets, lengths = [], [], []
        for k, receipt in enumerate(receipts):
            feat = MappedArray(folder / f"{k:05d}.feat.npy", None, 2)
            off = MappedArray(folder / f"{k:05d}.off.npy", np.dtype(np.int64))
            n = np.array(MappedArray(folder / f"{k:05d}.len.npy", np.dtype(np.int32)).array)
            if len(n) != receipt["utterances"] or int(n.sum()) != receipt["frames"] or \
                    feat.array.shape != (receipt["frames"], feature_dim):
                raise DataError(f"{folder / f'{k:05d}.json'}: the shard's files disagree with it; run `tformer "
                                "prepare` with the same settings again to rebuild it")
            self._feats.append(feat)
            self._offsets.append(off)
            lengths.append(n)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
        self._starts = np.cumsum([0] + [len(n) for n in lengths]).tolist()

    def __len__(self) -> int:
        return self._starts[-1]

    def release(self) -> None:
        """Hand the mapped pages read so far back to the page cache, so a long epoch does not grow the process."""
        for m in self._feats + self._offsets:
            m.release()

    def __getitem__(self, i: int) -> Tensor:  # type: ignore[override]
        i = int(i) + (len(self) if int(i) < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(f"utterance {i} of {len(self)}")
        k = bisect_right(self._starts, i) - 1
        j = i - self._starts[k]
        o, n = int(self._offsets[k].array[j]), int(self.lengths[i])
        return torch.from_numpy(self._feats[k].array[o : o + n].astype(np.float32))


class SpeechExamples(Sequence):
    """(frames, target ids) of a prepared split: frames read from the shards when an example is asked for; the
    model's lengths known without reading any."""

    def __init__(self, frames: FrameShards, targets: list[list[int]]) -> None:
        self.frames, self.targets = frames, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Tensor, list[int]]:  # type: ignore[override]
        return self.frames[i], self.targets[i]

    def release(self) -> None:
        self.frames.release()

    def model_lengths(self, frame_rate: int = 1) -> tuple[np.ndarray, np.ndarray]:
        src = -(-self.frames.lengths.astype(np.int64) // frame_rate)
        return src, np.asarray([len(t) + 1 for t in self.targets], dtype=np.int64)


class PreparedFeatures:
    """A prepared speech corpus folder, opened for reading."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path, self.manifest = path, manifest

    @classmethod
    def open(cls, path: str | Path) -> "PreparedFeatures":
        path = Path(path)
        manifest = read_manifest(path)
        if manifest is None:
            raise DataError(f"{path} holds no prepared speech corpus (no {MANIFEST}); write one with `tformer "
                            f"prepare --config C --out {path}`")
        return cls(path, manifest)

    def entry(self, split: str) -> dict[str, Any]:
        entry = self.manifest["splits"].get(split)
        if not entry or not entry.get("complete"):
            raise DataError(f"{self.path} holds no complete '{split}' split; run `tformer prepare` with the same "
                            "settings on it to add it")
        return entry

    def _receipts(self, split: str) -> list[dict[str, Any]]:
        folder = self.path / split
        out = []
        for k in range(self.entry(split)["shards"]):
            receipt = read_receipt(folder, k)
            if receipt is None:
                raise DataError(f"{folder / f'{k:05d}.json'}: shard {k} of '{split}' is missing or incomplete; run "
                                "`tformer prepare` with the same settings again to rebuild it")
            out.append(receipt)
        return out

    def frames(self, split: str) -> FrameShards:
        return FrameShards(self.path / split, self._receipts(split), self.manifest["identity"]["feature_dim"])

    def texts(self, split: str) -> tuple[list[str], list[str]]:
        """Utterance ids and transcripts, in order."""
        ids, texts = [], []
        for k in range(self.entry(split)["shards"]):
            path = self.path / split / f"{k:05d}.tsv"
            for line in path.read_text(encoding="utf-8").splitlines():
                utt, _, text = line.partition("\t")
                ids.append(utt)
                texts.append(text)
        return ids, texts

    def verify(self) -> list[str]:
        """Every shard file checked against its receipt's SHA-256; the problems found (empty: all good)."""
        problems = []
        for split, entry in self.manifest["splits"].items():
            folder = self.path / split
            for k in range(entry["shards"]):
                receipt = read_receipt(folder, k)
                if receipt is None:
                    problems.append(f"{folder / f'{k:05d}.json'}: missing or incomplete shard")
                    continue
                problems += [f"{folder / name}: SHA-256 differs from its receipt" for name, info
                             in receipt["files"].items() if sha256_file(folder / name) != info["sha256"]]
        return problems

    @property
    def cmvn(self) -> tuple[Tensor, Tensor] | None:
        """The training frames' mean and std per value (F,), float32; None before the training split is prepared."""
        stats = self.manifest.get("cmvn")
        if not stats:
            return None
        return torch.tensor(stats["mean"], dtype=torch.float32), torch.tensor(stats["std"], dtype=torch.float32)


def read_manifest(path: Path) -> dict[str, Any] | None:
    return prepared.read_manifest(path, FORMAT, (("identity", dict), ("splits", dict)))


def prepared_features(cfg: DataConfig, feature_dim: int, splits: Iterable[str], progress: bool = False
                      ) -> PreparedFeatures:
    """`data.prepared` when set (its identity must match), else the cache's folder for this corpus, prepared now
    where a split is missing or its recordings changed (by size or modification time): a corpus is prepared
    once per machine."""
    from tformer.data.prepare import _locked
    from tformer.files import cache_dir

    splits = list(splits)
    ident = identity(cfg, feature_dim)
    folder = Path(cfg.prepared) if cfg.prepared else cache_dir() / "features" / identity_key(ident)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        manifest = read_manifest(folder)
        if manifest is not None and all((manifest["splits"].get(s) or {}).get("complete") for s in splits) and \
                manifest["identity"] == ident:
            stale = [] if cfg.prepared else [s for s in splits if manifest["splits"][s].get("inputs") != inputs(
                read_list(split_list(cfg, s)))]
            if not stale:
                log.info("prepared speech corpus: %s", folder)
                return PreparedFeatures(folder, manifest)
            log.warning("recordings of %s changed since their features were computed: computing them again",
                        ", ".join(stale))
            for s in stale:  # the cache's copy only; a folder given as data.prepared is the user's to rebuild
                shutil.rmtree(folder / s, ignore_errors=True)
                del manifest["splits"][s]
            write_manifest(folder, manifest)
        return prepare_features(cfg, folder, feature_dim, splits, progress)
