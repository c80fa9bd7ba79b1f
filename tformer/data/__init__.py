"""Data: synthetic tasks, parallel text, tokenizers, token-budget batching and collation."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from tformer.config import SYNTHETIC_TASKS, DataConfig
from tformer.data.batching import Batch, Example, collate, model_lengths, token_budget_batches
from tformer.data.synthetic import SPLITS, SYNTHETIC_SPLITS, UNIFORM_SPLIT, symbol_names, synthetic_split
from tformer.data.text import read_parallel
from tformer.data.tokenizer import SubwordTokenizer, Tokenizer, WordTokenizer
from tformer.data.vocab import Vocab
from tformer.errors import ConfigError, DataError
from tformer.languages import Directions

Pair = tuple[list[str], list[str]]
Tokenizers = tuple[Tokenizer, Tokenizer]

log = logging.getLogger("tformer")

__all__ = ["Batch", "Example", "Pair", "SPLITS", "SYNTHETIC_SPLITS", "SubwordTokenizer", "TaskData", "Tokenizer",
           "Tokenizers", "UNIFORM_SPLIT", "Vocab", "WordTokenizer", "collate", "load_pairs", "load_task",
           "model_lengths", "token_budget_batches"]


def check_split(cfg: DataConfig, split: str) -> None:
    """train, valid, test; and for the synthetic tasks test_uniform (every length in [min_len, max_len] alike)."""
    if split == UNIFORM_SPLIT and cfg.task not in SYNTHETIC_TASKS:
        raise DataError(f"split '{split}' exists for the synthetic tasks ({', '.join(SYNTHETIC_TASKS)}) only, not data.task "
                        f"'{cfg.task}'; choose one of {', '.join(SPLITS)}")
    if split not in SYNTHETIC_SPLITS:
        raise DataError(f"unknown split '{split}'; choose one of {', '.join(SPLITS)} "
                        f"(synthetic tasks: also {UNIFORM_SPLIT})")


def load_pairs(cfg: DataConfig, split: str) -> list[Pair]:
    """Token pairs of one split, from the synthetic generator or from cfg.dir (whitespace-tokenised)."""
    check_split(cfg, split)
    if cfg.task == "text":
        return read_parallel(cfg.dir, split)
    if cfg.task == "translation":
        raise ConfigError("load_pairs reads whitespace-tokenised tasks; 'translation' goes through load_task")
    return synthetic_split(cfg, split)


def build_tokenizers(cfg: DataConfig, train: list[Pair], joint: bool) -> Tokenizers:
    """From the training split only (never valid/test); synthetic tasks use their whole alphabet."""
    if cfg.task in SYNTHETIC_TASKS:
        v = WordTokenizer(Vocab(symbol_names(cfg.symbols)))
        return v, v
    if joint:
        v = WordTokenizer(Vocab.build([s for s, _ in train] + [t for _, t in train]))
        return v, v
    return WordTokenizer(Vocab.build(s for s, _ in train)), WordTokenizer(Vocab.build(t for _, t in train))


class LazyTexts(Mapping):
    """The texts of the splits loaded: each read on first use, (sources, references)."""

    def __init__(self, splits: Sequence[str], load: Callable[[str], tuple[list[str], list[str]]]) -> None:
        self._splits, self._load, self._read = tuple(splits), load, {}

    def __getitem__(self, split: str) -> tuple[list[str], list[str]]:
        if split not in self._splits:
            raise KeyError(split)
        if split not in self._read:
            self._read[split] = self._load(split)
        return self._read[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self._splits)

    def __len__(self) -> int:
        return len(self._splits)


@dataclass
class TaskData:
    tokenizers: Tokenizers
    texts: Mapping[str, tuple[list[str], list[str]]]  # per split: source and reference sentences (kept pairs)
    examples: dict[str, Sequence[Example]]  # ids, no specials; a prepared training split stays on disk (mmap)
    feature_stats: "tuple[Tensor, Tensor] | None" = None  # speech: the training frames' mean and std (F,) (CMVN)
    directions: "dict[str, Directions]" = field(default_factory=dict)  # data.pairs: per split, each example's

    @property
    def src_vocab(self) -> Vocab:
        return self.tokenizers[0].vocab

    @property
    def tgt_vocab(self) -> Vocab:
        return self.tokenizers[1].vocab


def load_task(cfg: DataConfig, splits: tuple[str, ...] = SPLITS, joint: bool = False,
              tokenizers: Tokenizers | None = None, feature_dim: int = 0, progress: bool = False) -> TaskData:
    """The splits asked for, as text and as ids. Without `tokenizers`, they are built from the training
    split (SentencePiece is trained for 'translation', whose corpus is prepared once: tformer.data.prepare;
    `progress` shows bars while it is). Speech tasks need `feature_dim` (model.feature_dim):
    their sources are frames (S, F), their texts (utterance ids, transcripts)."""
    for s in splits:
        check_split(cfg, s)
    if cfg.task == "translation":
        return _load_translation(cfg, splits, joint, tokenizers, progress)
    if cfg.task in ("speech", "synthetic_speech"):
        return _load_speech(cfg, splits, tokenizers, feature_dim, progress)
    pairs = {s: load_pairs(cfg, s) for s in splits}
    if tokenizers is None:
        train = pairs["train"] if "train" in pairs else load_pairs(cfg, "train")
        tokenizers = build_tokenizers(cfg, train, joint)
    src_v, tgt_v = tokenizers[0].vocab, tokenizers[1].vocab
    examples = {s: [(src_v.encode(a), tgt_v.encode(b)) for a, b in p] for s, p in pairs.items()}
    texts = {s: ([" ".join(a) for a, _ in p], [" ".join(b) for _, b in p]) for s, p in pairs.items()}
    return TaskData(tokenizers, texts, examples)


def _load_translation(cfg: DataConfig, splits: tuple[str, ...], joint: bool, tokenizers: Tokenizers | None,
                      progress: bool = False) -> TaskData:
    """From a prepared corpus (data.prepared, or the cache's, prepared now if needed): the training split stays
    in its memory-mapped shards, the others are read into lists; texts are read when first asked for."""
    from tformer.data.corpus_cache import prepared_corpus

    if joint and not cfg.joint_vocab:
        raise ConfigError("config key 'model.share_embeddings' needs one joint vocabulary: set data.joint_vocab=true")
    corpus = prepared_corpus(cfg, splits, tokenizers, progress)
    if joint and corpus.tokenizers[0].vocab != corpus.tokenizers[1].vocab:  # one id space (Marian: two SentencePiece
        # models, one table)
        raise ConfigError(f"config key 'model.share_embeddings' needs one joint vocabulary, but data.prepared="
                          f"{cfg.prepared} has one per side; prepare it with data.joint_vocab=true")
    examples = {s: corpus.examples(s) if s == "train" else list(corpus.examples(s)) for s in splits}
    directions = {s: d for s in splits if (d := corpus.directions(s)) is not None}
    return TaskData(corpus.tokenizers, LazyTexts(splits, corpus.texts), examples, directions=directions)


def _load_speech(cfg: DataConfig, splits: tuple[str, ...], tokenizers: Tokenizers | None, feature_dim: int,
                 progress: bool = False) -> TaskData:
    """A 'speech' corpus from its prepared features (tformer.data.features: computed once, memory-mapped), or the
    synthetic task generated in memory; targets encoded with the given tokenizer or one built from the training
    transcripts."""
    from tformer.data.speech import CharTokenizer, FrameInput, synthetic_speech_split
    from tformer.data.tokenizer import train_sentencepiece

    if feature_dim < 1:
        raise ConfigError("speech tasks need the model's feature dimension (model.feature_dim)")
    need = tuple(splits) if tokenizers is not None or "train" in splits else (*splits, "train")
    if cfg.task == "synthetic_speech":
        utts = {s: synthetic_speech_split(cfg, s, feature_dim) for s in need}
        frames = {s: u.frames for s, u in utts.items()}
        texts = {s: (list(u.ids), list(u.transcripts)) for s, u in utts.items()}
        stats = None
        if "train" in frames:
            every = torch.cat(frames["train"]).double()
            stats = every.mean(0).float(), every.std(0, unbiased=False).float()
    else:
        from tformer.data.features import SpeechExamples, prepared_features

        corpus = prepared_features(cfg, feature_dim, need, progress)
        frames = {s: corpus.frames(s) for s in need}
        texts = {s: corpus.texts(s) for s in need}
        stats = corpus.cmvn if "train" in need else None
    if tokenizers is None:
        train = texts["train"][1]
        if cfg.target_units == "char":
            target: Tokenizer = CharTokenizer.build(train)
        else:
            target = train_sentencepiece(train, cfg.vocab_size, cfg.subword, cfg.character_coverage,
                                         "the transcripts")
        tokenizers = (FrameInput(), target)
    tgt = tokenizers[1]
    examples: dict[str, Sequence[Example]] = {}
    for s in splits:
        targets = [tgt.encode(t) for t in texts[s][1]]
        if cfg.task == "synthetic_speech":
            examples[s] = list(zip(frames[s], targets))
        else:
            examples[s] = SpeechExamples(frames[s], targets) if s == "train" else list(zip(frames[s], targets))
    return TaskData(tokenizers, {s: texts[s] for s in splits}, examples, stats)
