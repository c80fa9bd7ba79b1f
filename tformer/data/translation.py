"""The 'translation' task: raw parallel text -> normalised sentences -> SentencePiece ids, cached on disk.

Tokenizers are trained on the training split only. Encoded splits are cached under `cache_dir()` in files
named by a SHA-256 of everything that decides their content: the raw bytes of the corpus files, the
normalisation, the split settings, the tokenizer model and the filter settings.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from tformer.config import DataConfig
from tformer.data.corpus import NORMALIZATION, Corpus, filter_pairs, read_aligned, read_tsv, split_corpus
from tformer.data.tokenizer import SubwordTokenizer, train_sentencepiece
from tformer.errors import DataError

log = logging.getLogger("tformer")

Example = tuple[list[int], list[int]]


def cache_dir() -> Path:
    """$TFORMER_CACHE, else $XDG_CACHE_HOME/tformer, else ~/.cache/tformer."""
    if os.environ.get("TFORMER_CACHE"):
        return Path(os.environ["TFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tformer"


def _file_for(folder: Path, prefix: str, lang: str) -> Path:
    plain = folder / f"{prefix}.{lang}"
    for p in (plain, folder / f"{prefix}.{lang}.gz"):
        if p.exists():
            return p
    raise DataError(f"neither {plain} nor {plain}.gz exists; check data.dir and data.{{train,valid,test}}_prefix "
                    f"(tformer data multi30k --out DIR downloads Multi30k)")


def corpus_files(cfg: DataConfig, split: str) -> list[Path]:
    if cfg.format == "tsv":
        return [Path(cfg.tsv)]
    prefix = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}[split]
    return [_file_for(Path(cfg.dir), prefix, cfg.src_lang), _file_for(Path(cfg.dir), prefix, cfg.tgt_lang)]


@functools.lru_cache(maxsize=2)
def _tsv_splits(path: Path, columns: tuple[int, int], valid_size: int, test_size: int, seed: int,
                mtime_ns: int) -> dict[str, Corpus]:
    """Read and split a TSV file once for all its splits (keyed by its modification time too)."""
    return split_corpus(read_tsv(path, *columns), valid_size, test_size, seed)


def read_split(cfg: DataConfig, split: str) -> Corpus:
    files = corpus_files(cfg, split)
    if cfg.format == "tsv":
        path = files[0].resolve()
        if not path.is_file():
            raise DataError(f"{files[0]} does not exist; check data.tsv")
        corpus = _tsv_splits(path, cfg.tsv_columns, cfg.valid_size, cfg.test_size, cfg.seed,
                             path.stat().st_mtime_ns)[split]
    else:
        corpus = read_aligned(*files)
    if not len(corpus):
        raise DataError(f"{corpus.origin}: the {split} split holds no sentence pairs (empty file); give "
                        f"{split} data, one sentence per line")
    if split != "train":  # evaluation keeps every pair (comparable scores), but an empty side is suspicious
        empty = [n for n, s, t in zip(corpus.lines, corpus.src, corpus.tgt) if not s or not t]
        if empty:
            log.warning("%s: %d %s pair(s) with an empty side (line %s); they are kept and score as written",
                        corpus.origin, len(empty), split, ", ".join(map(str, empty[:5])) + (" ..." if len(empty) > 5 else ""))
    return corpus


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def train_tokenizers(cfg: DataConfig, train: Corpus) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """SentencePiece on the training split only: one joint model, or one per side."""
    kw = dict(vocab_size=cfg.vocab_size, model_type=cfg.subword, character_coverage=cfg.character_coverage)
    log.info("training %s SentencePiece (%s, %d pieces) on %d training pairs", "a joint" if cfg.joint_vocab
             else "source and target", cfg.subword, cfg.vocab_size, len(train))
    if cfg.joint_vocab:
        tok = train_sentencepiece(train.src + train.tgt, seed_name="the joint vocabulary", **kw)
        return tok, tok
    return (train_sentencepiece(train.src, seed_name="the source side", **kw),
            train_sentencepiece(train.tgt, seed_name="the target side", **kw))


def _pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter((i for s in seqs for i in s), dtype=np.int32, count=int(lens.sum()))
    return flat, np.concatenate([[0], np.cumsum(lens)])


def _unpack(flat: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [flat[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def encode_split(cfg: DataConfig, split: str, corpus: Corpus, tokenizers: tuple[SubwordTokenizer, SubwordTokenizer]
                 ) -> tuple[list[Example], list[int]]:
    """Ids of every pair of `corpus` and the indices kept (training pairs are filtered; valid/test keep every
    pair so their scores compare with published ones), from the cache when the inputs are unchanged."""
    src_tok, tgt_tok = tokenizers
    key_data = {
        "version": 1, "normalization": NORMALIZATION, "split": split, "format": cfg.format,
        "files": [_sha256_file(p) for p in corpus_files(cfg, split)],
        "tsv": [list(cfg.tsv_columns), cfg.valid_size, cfg.test_size, cfg.seed] if cfg.format == "tsv" else None,
        "tokenizers": [src_tok.fingerprint(), tgt_tok.fingerprint()],
        "filter": [cfg.filter_max_len, cfg.filter_max_ratio] if split == "train" else None,
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:32]
    path = cache_dir() / "encoded" / f"{key}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                src, tgt, keep = _unpack(z["src"], z["src_off"]), _unpack(z["tgt"], z["tgt_off"]), z["keep"].tolist()
            if len(src) == len(corpus):
                log.info("%s: %d encoded pairs from the cache %s", split, len(keep), path)
                return [(src[i], tgt[i]) for i in keep], keep
        except (OSError, ValueError, KeyError, EOFError):
            pass  # a damaged cache entry is rebuilt below
        log.warning("ignoring a damaged cache entry %s", path)
    src = src_tok.encode_batch(corpus.src)
    tgt = tgt_tok.encode_batch(corpus.tgt)
    if split == "train":
        keep, report = filter_pairs([len(s) for s in src], [len(t) for t in tgt], cfg.filter_max_len,
                                    cfg.filter_max_ratio)
        log.info("%s: %s", corpus.origin, report)
        if not keep:
            raise DataError(f"{corpus.origin}: every training pair was filtered out ({report}); check the files "
                            "or raise data.filter_max_len / data.filter_max_ratio")
    else:
        keep = list(range(len(src)))
    tmp = path.with_name(f".{path.stem}-{os.getpid()}.npz")
    (s_flat, s_off), (t_flat, t_off) = _pack(src), _pack(tgt)
    try:  # the cache only saves time: a read-only or full cache folder must not stop the run
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, src=s_flat, src_off=s_off, tgt=t_flat, tgt_off=t_off, keep=np.asarray(keep, dtype=np.int64))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.warning("could not cache the encoded %s split in %s (%s); going on without the cache (set "
                    "TFORMER_CACHE to a writable folder to keep it)", split, path.parent, e.strerror or e)
    return [(src[i], tgt[i]) for i in keep], keep
