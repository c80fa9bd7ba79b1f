"""Data: synthetic tasks, parallel text, tokenizers, token-budget batching and collation."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tformer.config import DataConfig
from tformer.data.batching import Batch, Example, collate, model_lengths, token_budget_batches
from tformer.data.synthetic import SPLITS, symbol_names, synthetic_split
from tformer.data.text import read_parallel
from tformer.data.tokenizer import SubwordTokenizer, Tokenizer, WordTokenizer
from tformer.data.vocab import Vocab
from tformer.errors import ConfigError, DataError

Pair = tuple[list[str], list[str]]
Tokenizers = tuple[Tokenizer, Tokenizer]

log = logging.getLogger("tformer")

__all__ = ["Batch", "Example", "Pair", "SPLITS", "SubwordTokenizer", "TaskData", "Tokenizer", "Tokenizers",
           "Vocab", "WordTokenizer", "collate", "load_pairs", "load_task", "model_lengths", "token_budget_batches"]


def load_pairs(cfg: DataConfig, split: str) -> list[Pair]:
    """Token pairs of one split, from the synthetic generator or from cfg.dir (whitespace-tokenised)."""
    if split not in SPLITS:
        raise DataError(f"unknown split '{split}'; choose one of {', '.join(SPLITS)}")
    if cfg.task == "text":
        return read_parallel(cfg.dir, split)
    if cfg.task == "translation":
        raise ConfigError("load_pairs reads whitespace-tokenised tasks; 'translation' goes through load_task")
    return synthetic_split(cfg, split)


def build_tokenizers(cfg: DataConfig, train: list[Pair], joint: bool) -> Tokenizers:
    """From the training split only (never valid/test); synthetic tasks use their whole alphabet."""
    if cfg.task in ("copy", "sort"):
        v = WordTokenizer(Vocab(symbol_names(cfg.symbols)))
        return v, v
    if joint:
        v = WordTokenizer(Vocab.build([s for s, _ in train] + [t for _, t in train]))
        return v, v
    return WordTokenizer(Vocab.build(s for s, _ in train)), WordTokenizer(Vocab.build(t for _, t in train))


@dataclass
class TaskData:
    tokenizers: Tokenizers
    texts: dict[str, tuple[list[str], list[str]]]  # per split: source and reference sentences (kept pairs)
    examples: dict[str, list[Example]]  # ids, no specials

    @property
    def src_vocab(self) -> Vocab:
        return self.tokenizers[0].vocab

    @property
    def tgt_vocab(self) -> Vocab:
        return self.tokenizers[1].vocab


def load_task(cfg: DataConfig, splits: tuple[str, ...] = SPLITS, joint: bool = False,
              tokenizers: Tokenizers | None = None, feature_dim: int = 0) -> TaskData:
    """The splits asked for, as text and as ids. Without `tokenizers`, they are built from the training
    split (SentencePiece is trained for 'translation'). Speech tasks need `feature_dim` (model.feature_dim):
    their sources are frames (S, F), their texts (utterance ids, transcripts)."""
    for s in splits:
        if s not in SPLITS:
            raise DataError(f"unknown split '{s}'; choose one of {', '.join(SPLITS)}")
    if cfg.task == "translation":
        return _load_translation(cfg, splits, joint, tokenizers)
    if cfg.task in ("speech", "synthetic_speech"):
        return _load_speech(cfg, splits, tokenizers, feature_dim)
    pairs = {s: load_pairs(cfg, s) for s in splits}
    if tokenizers is None:
        train = pairs["train"] if "train" in pairs else load_pairs(cfg, "train")
        tokenizers = build_tokenizers(cfg, train, joint)
    src_v, tgt_v = tokenizers[0].vocab, tokenizers[1].vocab
    examples = {s: [(src_v.encode(a), tgt_v.encode(b)) for a, b in p] for s, p in pairs.items()}
    texts = {s: ([" ".join(a) for a, _ in p], [" ".join(b) for _, b in p]) for s, p in pairs.items()}
    return TaskData(tokenizers, texts, examples)


def _load_translation(cfg: DataConfig, splits: tuple[str, ...], joint: bool, tokenizers: Tokenizers | None
                      ) -> TaskData:
    from tformer.data.translation import encode_split, read_split, train_tokenizers

    if joint and not cfg.joint_vocab:
        raise ConfigError("config key 'model.share_embeddings' needs one joint vocabulary: set data.joint_vocab=true")
    corpora = {s: read_split(cfg, s) for s in splits}
    if tokenizers is None:
        train = corpora["train"] if "train" in corpora else read_split(cfg, "train")
        tokenizers = train_tokenizers(cfg, train)
    texts, examples = {}, {}
    for s, corpus in corpora.items():
        examples[s], keep = encode_split(cfg, s, corpus, tokenizers)
        texts[s] = ([corpus.src[i] for i in keep], [corpus.tgt[i] for i in keep])
    return TaskData(tokenizers, texts, examples)


def _load_speech(cfg: DataConfig, splits: tuple[str, ...], tokenizers: Tokenizers | None, feature_dim: int
                 ) -> TaskData:
    from tformer.data.speech import CharTokenizer, FrameInput, load_utterances
    from tformer.data.tokenizer import train_sentencepiece

    if feature_dim < 1:
        raise ConfigError("speech tasks need the model's feature dimension (model.feature_dim)")
    utts = {s: load_utterances(cfg, s, feature_dim) for s in splits}
    if tokenizers is None:
        train = utts["train"] if "train" in utts else load_utterances(cfg, "train", feature_dim)
        if cfg.target_units == "char":
            target: Tokenizer = CharTokenizer.build(train.transcripts)
        else:
            target = train_sentencepiece(train.transcripts, cfg.vocab_size, cfg.subword, cfg.character_coverage,
                                         "the transcripts")
        tokenizers = (FrameInput(), target)
    tgt = tokenizers[1]
    examples = {s: [(f, tgt.encode(t)) for f, t in zip(u.frames, u.transcripts)] for s, u in utts.items()}
    texts = {s: (list(u.ids), list(u.transcripts)) for s, u in utts.items()}
    return TaskData(tokenizers, texts, examples)
