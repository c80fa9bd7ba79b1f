"""The 'translation' task's raw side: where a split's files are, reading a split, training SentencePiece.

Tokenizers are trained on the training split only. Encoding into ids happens once, into a prepared corpus
(tformer.data.prepare), kept under `cache_dir()` unless `data.prepared` names one.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from tformer.config import DataConfig
from tformer.data.corpus import Corpus, read_aligned, read_tsv, split_corpus
from tformer.data.tokenizer import SubwordTokenizer, train_sentencepiece
from tformer.errors import DataError

log = logging.getLogger("tformer")

def _file_for(folder: Path, prefix: str, lang: str) -> Path:
    plain = folder / f"{prefix}.{lang}"
    for p in (plain, folder / f"{prefix}.{lang}.gz"):
        if p.exists():
            return p
    raise DataError(f"neither {plain} nor {plain}.gz exists; check data.dir and data.{{train,valid,test}}_prefix "
                    f"(tformer data multi30k --out DIR downloads Multi30k)")


def corpus_files(cfg: DataConfig, split: str) -> list[Path]:
    if cfg.format == "tsv":
        if not Path(cfg.tsv).is_file():
            raise DataError(f"{cfg.tsv} does not exist; check data.tsv")
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
        path = files[0].resolve()  # corpus_files checked that it exists
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
