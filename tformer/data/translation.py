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
from tformer.languages import parse_pairs

log = logging.getLogger("tformer")

def _file_for(folder: Path, prefix: str, lang: str) -> Path:
    plain = folder / f"{prefix}.{lang}"
    for p in (plain, folder / f"{prefix}.{lang}.gz"):
        if p.exists():
            return p
    raise DataError(f"neither {plain} nor {plain}.gz exists; check data.dir and data.{{train,valid,test}}_prefix "
                    f"(tformer data multi30k --out DIR downloads Multi30k)")


def pair_files(cfg: DataConfig, split: str) -> list[tuple[str, Path, Path]]:
    """Each direction of a corpus in files, (name, source file, target file): the one pair src_lang-tgt_lang,
    or every one of data.pairs. A direction's files are in {dir}/{SRC}-{TGT}/ when that folder exists (pairs
    from different corpora), else in {dir} (a multi-way corpus, one file per language: Multi30k)."""
    prefix = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}[split]
    out = []
    for src, tgt in parse_pairs(cfg.pairs) if cfg.pairs else ((cfg.src_lang, cfg.tgt_lang),):
        folder = Path(cfg.dir) / f"{src}-{tgt}"
        folder = folder if folder.is_dir() else Path(cfg.dir)
        out.append((f"{src}-{tgt}", _file_for(folder, prefix, src), _file_for(folder, prefix, tgt)))
    return out


def corpus_files(cfg: DataConfig, split: str) -> list[Path]:
    """The files a split is read from, each once."""
    if cfg.format == "tsv":
        if not Path(cfg.tsv).is_file():
            raise DataError(f"{cfg.tsv} does not exist; check data.tsv")
        return [Path(cfg.tsv)]
    return list(dict.fromkeys(f for _, s, t in pair_files(cfg, split) for f in (s, t)))


def language_files(cfg: DataConfig, split: str) -> dict[str, list[Path]]:
    """Each language's files of a split (the text a shared tokenizer learns from), each file once."""
    out: dict[str, list[Path]] = {}
    for name, s, t in pair_files(cfg, split):
        for lang, path in zip(name.split("-"), (s, t)):
            if path not in out.setdefault(lang, []):
                out[lang].append(path)
    return out


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


def train_tokenizers(cfg: DataConfig, train: Corpus, symbols: tuple[str, ...] = ()
                     ) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """SentencePiece on the training split only: one joint model, or one per side. `symbols` (the target-language
    tokens of a multilingual model) are pieces of their own."""
    kw = dict(vocab_size=cfg.vocab_size, model_type=cfg.subword, character_coverage=cfg.character_coverage,
              symbols=symbols)
    log.info("training %s SentencePiece (%s, %d pieces) on %d training pairs", "a joint" if cfg.joint_vocab
             else "source and target", cfg.subword, cfg.vocab_size, len(train))
    if cfg.joint_vocab:
        tok = train_sentencepiece(train.src + train.tgt, seed_name="the joint vocabulary", **kw)
        return tok, tok
    return (train_sentencepiece(train.src, seed_name="the source side", **kw),
            train_sentencepiece(train.tgt, seed_name="the target side", **kw))
