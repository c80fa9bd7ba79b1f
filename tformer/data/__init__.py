"""Data: synthetic tasks, parallel text, vocabularies, token-budget batching and collation."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.config import DataConfig
from tformer.data.batching import Batch, Example, collate, model_lengths, token_budget_batches
from tformer.data.synthetic import SPLITS, symbol_names, synthetic_split
from tformer.data.text import read_parallel
from tformer.data.vocab import Vocab

Pair = tuple[list[str], list[str]]

__all__ = ["Batch", "Example", "Pair", "SPLITS", "TaskData", "Vocab", "collate", "load_pairs",
           "load_task", "model_lengths", "token_budget_batches"]


def load_pairs(cfg: DataConfig, split: str) -> list[Pair]:
    """Token pairs of one split, from the synthetic generator or from cfg.dir."""
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; choose one of {', '.join(SPLITS)}")
    if cfg.task == "text":
        return read_parallel(cfg.dir, split)
    return synthetic_split(cfg, split)


def build_vocabs(cfg: DataConfig, train: list[Pair], joint: bool) -> tuple[Vocab, Vocab]:
    """From the training split only (never valid/test); synthetic tasks use their whole alphabet."""
    if cfg.task in ("copy", "sort"):
        v = Vocab(symbol_names(cfg.symbols))
        return v, v
    if joint:
        v = Vocab.build([s for s, _ in train] + [t for _, t in train])
        return v, v
    return Vocab.build(s for s, _ in train), Vocab.build(t for _, t in train)


@dataclass
class TaskData:
    src_vocab: Vocab
    tgt_vocab: Vocab
    pairs: dict[str, list[Pair]]  # tokens, as read
    examples: dict[str, list[Example]]  # ids, no specials


def load_task(cfg: DataConfig, splits: tuple[str, ...] = SPLITS, joint: bool = False,
              vocabs: tuple[Vocab, Vocab] | None = None) -> TaskData:
    pairs = {s: load_pairs(cfg, s) for s in splits}
    if vocabs is None:
        train = pairs["train"] if "train" in pairs else load_pairs(cfg, "train")
        vocabs = build_vocabs(cfg, train, joint)
    src_v, tgt_v = vocabs
    examples = {s: [(src_v.encode(a), tgt_v.encode(b)) for a, b in p] for s, p in pairs.items()}
    return TaskData(src_v, tgt_v, pairs, examples)
