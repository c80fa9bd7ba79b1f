"""Attention structures: which positions of a sentence may attend to which, as edge lists.

A structure is data for the attention kernels, not a model class. `edges(L, causal)` lists the allowed
(query position, key position) pairs of a sentence of length L; the graph kernel shifts them onto packed
tokens (`tformer.masks.self_graph`) and the dense kernels read the same pairs as a boolean mask
(`mask(L, causal)`), so both compute the same attention. Built in:

    full                 every position (the seed's complete / causal graphs)
    window w             keys within +-w positions (local attention)
    window w, dilation d keys i + k*d for |k| <= w (dilated); window 0 with dilation d: every d-th key
    global_tokens g      the first g positions attend to, and are attended by, every position (added to
                         the pattern above, as in Longformer)
    edges FILE           "query key" position pairs, one per line ('#' comments): a sentence of length L
                         uses the pairs with both positions < L
    edges module:fn      fn(L) -> (E, 2) pairs of positions in [0, L)

Decoder self-attention keeps only the causal pairs (key <= query). Patterns must be prefix-consistent (the
pairs among the first L positions may not depend on the sentence length): padded batches and step-by-step
decoding rely on it, and every built-in pattern is. Notation: L length, E edges.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tformer.config import StructureConfig
from tformer.errors import ConfigError, DataError


@dataclass(frozen=True)
class Structure:
    window: int = 0
    dilation: int = 1
    global_tokens: int = 0
    edges_from: str = ""  # a file, or module:function

    @property
    def is_full(self) -> bool:
        return self.window == 0 and self.dilation == 1 and not self.edges_from

    def edges(self, length: int, causal: bool = False) -> Tensor:
        """(E, 2) int64 (query, key) positions of a sentence of `length`, sorted, no duplicates."""
        return _edges(self, length, causal)

    def mask(self, length: int, causal: bool = False) -> Tensor:
        """(L, L) bool, True = may attend: the same pairs as `edges`, for the dense kernels."""
        e = self.edges(length, causal)
        mask = torch.zeros(length, length, dtype=torch.bool)
        mask[e[:, 0], e[:, 1]] = True
        return mask

    def row(self, position: int) -> Tensor:
        """(k,) key positions that a decoder query at `position` sees (causal): one decoding step."""
        return _row(self, position)

    def describe(self) -> str:
        if self.edges_from:
            return f"edges from {self.edges_from}"
        if self.is_full:
            return "full"
        parts = []
        if self.window:
            parts.append(f"window +-{self.window}" + (f" dilation {self.dilation}" if self.dilation > 1 else ""))
        elif self.dilation > 1:
            parts.append(f"dilation {self.dilation}")
        if self.global_tokens:
            parts.append(f"{self.global_tokens} global")
        return ", ".join(parts)


FULL = Structure()


def build_structure(cfg: StructureConfig) -> Structure:
    s = Structure(cfg.window, cfg.dilation, cfg.global_tokens, cfg.edges)
    if s.edges_from:
        _user_pairs(s.edges_from)  # fail now, with the file and line, not at the first batch
    return s


@functools.lru_cache(maxsize=512)
def _edges(s: Structure, length: int, causal: bool) -> Tensor:
    if s.edges_from:
        pairs = _user_edges(s.edges_from, length)  # (E, 2)
    else:
        i = torch.arange(length)
        if s.window:
            offsets = torch.arange(-s.window, s.window + 1) * s.dilation  # (2w+1,)
        else:
            offsets = torch.arange(-((length - 1) // s.dilation), (length - 1) // s.dilation + 1) * s.dilation
        j = i[:, None] + offsets[None, :]  # (L, 2w+1)
        ok = (j >= 0) & (j < length)
        pairs = torch.stack([i[:, None].expand_as(j)[ok], j[ok]], 1)  # (E, 2)
        g = min(s.global_tokens, length)
        if g:
            grid_q = torch.arange(g)[:, None].expand(g, length)  # global queries see every key
            grid_k = torch.arange(g)[None, :].expand(length, g)  # every query sees the global keys
            pairs = torch.cat([pairs, torch.stack([grid_q.reshape(-1), i.repeat(g)], 1),
                               torch.stack([i.repeat_interleave(g), grid_k.reshape(-1)], 1)])
    if causal:
        pairs = pairs[pairs[:, 1] <= pairs[:, 0]]
    flat = torch.unique(pairs[:, 0] * length + pairs[:, 1])  # sorted, duplicates gone
    return torch.stack([flat // length, flat % length], 1)


@functools.lru_cache(maxsize=2048)
def _row(s: Structure, position: int) -> Tensor:
    e = s.edges(position + 1, causal=True)
    return e[e[:, 0] == position, 1]


# --------------------------------------------------------------------------- user-supplied edge lists


def _user_edges(spec: str, length: int) -> Tensor:
    if ":" in spec and not Path(spec).exists():
        module, _, name = spec.partition(":")
        fn = getattr(importlib.import_module(module), name)
        pairs = torch.as_tensor(fn(length), dtype=torch.long).reshape(-1, 2)
        bad = (pairs < 0) | (pairs >= length)
        if bad.any():
            i = int(bad.any(1).nonzero()[0, 0])
            raise DataError(f"structure function {spec} returned the pair {pairs[i].tolist()}, outside a sentence "
                            f"of length {length}; return positions in [0, {length})")
        return pairs
    pairs = _user_pairs(spec)
    return pairs[(pairs < length).all(1)]


@functools.lru_cache(maxsize=16)
def _user_pairs(spec: str) -> Tensor:
    """The (E, 2) pairs of an edge-list file, or a check that `module:function` can be imported."""
    path = Path(spec)
    if ":" in spec and not path.exists():
        module, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"structure edges '{spec}': cannot import function {name} from {module} ({e}); "
                              "give a file of 'query key' pairs or an importable module:function") from None
        if not callable(fn):
            raise ConfigError(f"structure edges '{spec}' is not a function")
        return torch.zeros(0, 2, dtype=torch.long)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"structure edge file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise DataError(f"structure edge file {path} is not UTF-8 text (byte {e.start})") from None
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise DataError(f"{path}:{n}: expected two non-negative integers 'query key', got {line!r}")
        pairs.append((int(fields[0]), int(fields[1])))
    if not pairs:
        raise DataError(f"structure edge file {path} has no edges")
    return torch.tensor(pairs, dtype=torch.long)
