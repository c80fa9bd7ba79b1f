"""Synthetic tasks, deterministic under a seed: copy (output = input) and sort (output = sorted input).

DGL's recipe: train/valid/test 9000/1000/1000, symbols 'a'..'z', lengths ~ Normal(15, 3) rounded down
and clipped (here to [min_len, max_len]). Each split draws from its own seeded generator, so changing one
split's size never changes another split.
"""

from __future__ import annotations

import string

import torch

from tformer.config import DataConfig
from tformer.errors import ConfigError

SPLITS = ("train", "valid", "test")


def symbol_names(n: int) -> list[str]:
    """'a'..'z' for the first 26 symbols (DGL's alphabet), then 's26', 's27', ..."""
    return [string.ascii_lowercase[i] if i < 26 else f"s{i}" for i in range(n)]


def synthetic_split(cfg: DataConfig, split: str) -> list[tuple[list[str], list[str]]]:
    """Pairs (source tokens, target tokens) of `split` for task copy or sort."""
    if cfg.task not in ("copy", "sort"):
        raise ConfigError(f"data.task '{cfg.task}' is not a synthetic task (copy, sort)")
    size = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size}[split]
    g = torch.Generator().manual_seed(cfg.seed * 1000 + SPLITS.index(split))
    names = symbol_names(cfg.symbols)
    lengths = (torch.randn(size, generator=g, dtype=torch.float64) * cfg.length_std + cfg.length_mean).floor()
    lengths = lengths.clamp(cfg.min_len, cfg.max_len).long().tolist()
    pairs = []
    for n in lengths:
        ids = torch.randint(cfg.symbols, (n,), generator=g).tolist()
        out = sorted(ids) if cfg.task == "sort" else ids
        pairs.append(([names[i] for i in ids], [names[i] for i in out]))
    return pairs
