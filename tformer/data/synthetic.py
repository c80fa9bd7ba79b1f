"""Synthetic tasks, deterministic under a seed: copy (output = input), sort (output = sorted input) and reverse
(output = the input backwards, the Universal Transformer paper's third algorithmic task).

DGL's recipe: train/valid/test 9000/1000/1000, symbols 'a'..'z', lengths ~ Normal(15, 3) rounded down
and clipped (here to [min_len, max_len]); data.length_distribution=uniform draws the lengths of train and
valid uniformly from [min_len, max_len] instead. Each split draws from its own seeded generator, so changing
one split's size never changes another split.

The two test splits are benchmarks, the same whatever the training lengths: 'test' is always DGL's (Normal
lengths), and 'test_uniform' measures every length alike: test_size sequences, lengths uniform over
[min_len, max_len], from a generator of its own. Its short sequences may well appear in the training split too
(there are only `symbols` sequences of length 1).
"""

from __future__ import annotations

import string
from collections import Counter

import torch

from tformer.config import SYNTHETIC_TASKS, DataConfig
from tformer.errors import ConfigError

SPLITS = ("train", "valid", "test")
UNIFORM_SPLIT = "test_uniform"  # synthetic tasks only; not in SPLITS, so `tformer data` and training skip it
SYNTHETIC_SPLITS = (*SPLITS, UNIFORM_SPLIT)


def symbol_names(n: int) -> list[str]:
    """'a'..'z' for the first 26 symbols (DGL's alphabet), then 's26', 's27', ..."""
    return [string.ascii_lowercase[i] if i < 26 else f"s{i}" for i in range(n)]


def synthetic_lengths(cfg: DataConfig, size: int, uniform: bool, g: torch.Generator) -> list[int]:
    """`size` lengths in [min_len, max_len]: floor(Normal(length_mean, length_std)) clipped, or uniform."""
    if uniform:
        return torch.randint(cfg.min_len, cfg.max_len + 1, (size,), generator=g).tolist()
    lengths = (torch.randn(size, generator=g, dtype=torch.float64) * cfg.length_std + cfg.length_mean).floor()
    return lengths.clamp(cfg.min_len, cfg.max_len).long().tolist()


def synthetic_split(cfg: DataConfig, split: str) -> list[tuple[list[str], list[str]]]:
    """Pairs (source tokens, target tokens) of `split` (train, valid, test, test_uniform) of a synthetic task."""
    if cfg.task not in SYNTHETIC_TASKS:
        raise ConfigError(f"data.task '{cfg.task}' is not a synthetic task ({', '.join(SYNTHETIC_TASKS)})")
    size = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size,
            UNIFORM_SPLIT: cfg.test_size}[split]
    g = torch.Generator().manual_seed(cfg.seed * 1000 + SYNTHETIC_SPLITS.index(split))
    names = symbol_names(cfg.symbols)
    uniform = split == UNIFORM_SPLIT or (split != "test" and cfg.length_distribution == "uniform")
    pairs = []
    for n in synthetic_lengths(cfg, size, uniform, g):
        ids = torch.randint(cfg.symbols, (n,), generator=g).tolist()
        out = {"copy": ids, "sort": sorted(ids), "reverse": ids[::-1]}[cfg.task]
        pairs.append(([names[i] for i in ids], [names[i] for i in out]))
    return pairs


def exact_match_by_length(hypotheses: list[str], references: list[str]) -> dict[int, tuple[int, int]]:
    """Reference length in tokens (whitespace-separated) -> (exact matches, sequences), lengths ascending."""
    n, exact = Counter(), Counter()
    for h, r in zip(hypotheses, references, strict=True):
        length = len(r.split())
        n[length] += 1
        exact[length] += h.split() == r.split()
    return {length: (exact[length], n[length]) for length in sorted(n)}
