"""The prepared corpus a run reads (`prepared_corpus`): `data.prepared` when set, else the one in the cache,
under `cache_dir()/prepared/` in a folder named by the corpus's identity (tformer.data.prepare.identity), so
that a corpus is prepared once per machine and found again by every run and evaluation that reads it.

Nothing in the cache is removed or rewritten unless its corpus files are there: a split whose files changed
is encoded again, and an entry found damaged (tformer.data.prepared.DamagedCorpusError) is moved aside in one
rename, removed and rebuilt. Corpus files that cannot be found (a run's relative data.dir read from another
folder, a machine without the corpus) are an error, and the entry stays as it is; so does one that another
tformer version wrote or that cannot be read (the corpus is then prepared in a temporary folder).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

from tformer.config import DataConfig
from tformer.data.prepare import identity, identity_key, prepare, source_inputs
from tformer.data.prepared import DamagedCorpusError, PreparedCorpus, read_manifest
from tformer.data.tokenizer import Tokenizer
from tformer.files import cache_dir
from tformer.errors import DataError

log = logging.getLogger("tformer")


def prepared_corpus(cfg: DataConfig, splits: Iterable[str],
                    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
                    progress: bool = False) -> PreparedCorpus:
    """The prepared corpus for `splits`: `data.prepared` when set (checked against `tokenizers`), else the
    cache's, prepared now where anything is missing. A checkpoint's `tokenizers` reuse the corpus its run was
    trained on when the training split is asked for; otherwise they get a corpus of their own."""
    splits = list(splits)
    if cfg.prepared:
        corpus = PreparedCorpus.open(cfg.prepared)
        if tokenizers is not None and [t.fingerprint() for t in tokenizers] != corpus.manifest["tokenizer"]["fingerprints"]:
            raise DataError(f"data.prepared={cfg.prepared} was encoded with another tokenizer than the checkpoint's; "
                            "point data.prepared at the corpus the run was trained on (or leave it empty)")
        for split in splits:
            corpus.entry(split)
        return corpus
    root = cache_dir() / "prepared"
    if tokenizers is not None and "train" in splits:
        ident = identity(cfg)
        folder = root / identity_key(ident)
        try:
            manifest = read_manifest(folder)
        except DataError:
            manifest = None
        if manifest and (manifest.get("tokenizer") or {}).get("fingerprints") == [t.fingerprint() for t in tokenizers]:
            return _prepare_cached(cfg, folder, splits, None, progress)
    ident = identity(cfg, tokenizers)
    return _prepare_cached(cfg, root / identity_key(ident), splits, tokenizers, progress)


def _prepare_cached(cfg: DataConfig, folder: Path, splits: list[str],
                    tokenizers: tuple[Tokenizer, Tokenizer] | None, progress: bool) -> PreparedCorpus:
    """The cache entry `folder`, used as it is when it holds `splits` of the files `cfg` names, else continued or
    rebuilt (see the module docstring)."""
    inputs = {s: source_inputs(cfg, s) for s in splits}  # first: files not found leave the entry untouched
    try:
        corpus = _cached(folder, splits, inputs)
        if corpus is not None:
            log.info("prepared corpus: %s", folder)
            return corpus
    except DamagedCorpusError as e:  # inconsistent with itself, and its corpus is at hand: rebuilt, not trusted
        log.warning("rebuilding the damaged cache entry %s (%s)", folder, e)
        if not _discard(folder):
            return prepare(cfg, _scratch(folder, "it could not be moved aside"), splits, tokenizers, progress)
    except DataError as e:  # another version's, or unreadable: not ours to change
        return prepare(cfg, _scratch(folder, str(e)), splits, tokenizers, progress)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        folder = _scratch(folder, e.strerror or str(e))
    return prepare(cfg, folder, splits, tokenizers, progress)


def _cached(folder: Path, splits: list[str], inputs: dict[str, list[dict[str, Any]]]) -> PreparedCorpus | None:
    """The entry at `folder` when every split in `splits` is complete, encoded from `inputs` and whole; None when
    one is missing, unfinished or from other files (`prepare` continues it). DamagedCorpusError when the entry
    disagrees with itself."""
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    entries = [manifest["splits"].get(s) or {} for s in splits]
    if not manifest.get("tokenizer") and not any(e.get("complete") for e in manifest["splits"].values()):
        return None  # stopped before its tokenizer was trained
    corpus = PreparedCorpus.open(folder)
    if not all(e.get("complete") and e.get("inputs") == inputs[s] for s, e in zip(splits, entries)):
        return None
    for s in splits:
        corpus.examples(s)  # every shard there and of its size
    return corpus


def _discard(folder: Path) -> bool:
    """Remove a cache entry: renamed aside first, so that an interruption leaves it whole or gone (never a
    half-removed folder that looks like a corpus). False when it cannot be renamed (it is left as it is)."""
    aside = folder.with_name(f".{folder.name}.removing-{os.getpid()}")
    try:
        os.replace(folder, aside)
    except OSError:
        return False
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _scratch(folder: Path, why: str) -> Path:
    """A temporary folder to prepare in, for this process only, when the cache entry `folder` cannot be used."""
    out = Path(tempfile.mkdtemp(prefix="tformer-prepared-"))
    atexit.register(shutil.rmtree, out, True)
    log.warning("could not prepare the corpus in the cache %s (%s); preparing it in %s for this process only "
                "(set TFORMER_CACHE to a writable folder, or use tformer prepare and data.prepared, to keep it)",
                folder, why, out)
    return out
