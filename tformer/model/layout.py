"""How a batch lies in memory, as one object the model and its layers receive (no `if packed` branches).

    Padded   sentences padded to (B, L); structures are boolean masks (dense, sdpa kernels)
    Packed   every real token of the batch in one row (1, N), no padding; attention is message passing over
             graphs (tformer.masks.Graph; the graph kernel): the DGL seed's layout
    Step     one decoding position for N hypotheses (rows of B sentences, K each), either way

A layout answers what a side needs: where its tokens are (`take`, `positions`), its self-attention structure
(`self_mask`), its attention to the other side (`cross_mask`), TUPE's bias in its form (`bias`), and, for the
universal transformer, the structures restricted to the positions still running (`select`).
Notation: B batch, L length, N real tokens (or hypotheses), D model dim, H heads, R rows kept.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tformer.masks import (Graph, PositionBias, Segments, bipartite_graph, decoder_mask, encoder_mask,
                           packed_positions, padding_mask, self_graph)
from tformer.model.embeddings import Span
from tformer.structures import Structure


class Selection(NamedTuple):
    """Attention restricted to some query rows (the positions an ACT step still runs)."""

    rows: Tensor | None  # (R,) rows kept, in order; None = every row (the layout computes all of them)
    self_mask: Tensor | Graph | None
    cross_mask: Tensor | Graph | None
    hyp_rows: Tensor | None = None  # decoding, padded: cached self keys/values to gather per kept row
    sentence_rows: Tensor | None = None  # decoding, padded: memory rows to gather per kept row


def structured(mask: Tensor, pattern: Tensor, real: Tensor) -> Tensor:
    """A padding mask (B, 1, 1 or L, L) narrowed by a structure's (L, L) pattern. Padding positions also see
    themselves, so no row is empty (an empty row would put NaN into the padding, and from there into every
    value the next layer multiplies, even by a weight of 0)."""
    eye = torch.eye(pattern.shape[0], dtype=torch.bool, device=mask.device)
    return (mask & pattern) | (~real[:, None, :, None] & eye)  # (B, 1, L, L)


class Padded:
    packed = False

    def __init__(self, lengths: Tensor, length: int, index: Tensor | None = None) -> None:
        self.lengths, self.mask = lengths, padding_mask(lengths, length)  # (B,), (B, L)
        self.index = index  # (L,) the position of each slot 0 .. L-1 when not the slot itself (randomised positions)

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def take(self, x: Tensor) -> Tensor:
        """Padded (B, L, ...) -> this layout's rows: unchanged."""
        return x

    def positions(self) -> Tensor | Span:
        """The position of every row in its sentence: 0 .. L-1 for every sentence alike (or the index's)."""
        return Span(0, self.length) if self.index is None else self.index

    def slot_positions(self, n: int) -> Tensor:
        """The positions (n,) of a sentence's first n slots: what a bias table is computed over."""
        return torch.arange(n, device=self.mask.device) if self.index is None else self.index[:n]

    def self_mask(self, structure: Structure, causal: bool) -> Tensor:
        real = self.mask
        mask = decoder_mask(real) if causal else encoder_mask(real)  # (B, 1, L, L) or (B, 1, 1, L)
        if not structure.is_full:
            mask = structured(mask, structure.mask(self.length, causal).to(real.device), real)
        return mask

    def cross_mask(self, keys: "Padded") -> Tensor:
        return encoder_mask(keys.mask)  # (B, 1, 1, S)

    def bias(self, table: Tensor | None) -> Tensor | None:
        """TUPE's (H, Lq, Lk) table -> (1, H, Lq, Lk)."""
        return None if table is None else table[None]

    def select(self, running: Tensor, self_mask, cross_mask) -> Selection:
        """Padded kernels compute every row; halted ones are frozen by the caller."""
        return Selection(None, self_mask, cross_mask)

    def real(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (N, D), the real positions sentence after sentence."""
        return x[self.mask]

    def padded(self, x: Tensor) -> Tensor:
        return x

    def flat(self, x: Tensor) -> Tensor:
        """(B, L, ...) per-position values, as stored by this layout (the ACT bookkeeping's shape)."""
        return x

    def fold(self, q: Tensor, n_sentences: int) -> Tensor:
        """Queries (N, T, D) of N = B x K hypotheses against B sentences' memory -> (B, K*T, D)."""
        return q if q.shape[0] == n_sentences else q.reshape(n_sentences, -1, q.shape[-1])


class Packed(Padded):
    packed = True

    def __init__(self, lengths: Tensor, length: int, index: Tensor | None = None) -> None:
        super().__init__(lengths, length, index)
        self.n = int(lengths.sum())

    def take(self, x: Tensor) -> Tensor:
        """Padded (B, L, ...) -> (1, N, ...): the real tokens back to back."""
        return x[self.mask][None]

    def positions(self) -> Tensor:
        slots = packed_positions(self.lengths)  # (N,)
        return (slots if self.index is None else self.index[slots])[None]  # (1, N)

    def self_mask(self, structure: Structure, causal: bool) -> Graph:
        return self_graph(self.lengths, structure, causal=causal)

    def cross_mask(self, keys: "Packed") -> Graph:
        return bipartite_graph(self.lengths, keys.lengths)

    def bias(self, table: Tensor | None) -> PositionBias | None:
        return None if table is None else PositionBias(table)

    def select(self, running: Tensor, self_mask: Graph, cross_mask: Graph | None) -> Selection:
        """running (1, N) bool -> the rows still running and the graphs restricted to their queries."""
        rows = running.reshape(-1).nonzero()[:, 0]  # (R,)
        return Selection(rows, self_mask.restrict(rows), None if cross_mask is None else cross_mask.restrict(rows))

    def real(self, x: Tensor) -> Tensor:
        return x[0]

    def padded(self, x: Tensor) -> Tensor:
        out = x.new_zeros(*self.mask.shape, *x.shape[2:])
        out[self.mask] = x[0]
        return out

    def flat(self, x: Tensor) -> Tensor:
        return x[self.mask][None]

    def fold(self, q: Tensor, n_sentences: int) -> Tensor:
        return q  # a graph's edges say which memory each query reads


class Step:
    """Position t of N hypotheses, K per sentence in consecutive rows, against B sentences' memory laid out
    per sentence (B, S, D). Self-attention keys are each hypothesis's cached positions 0 .. t."""

    def __init__(self, n_hyps: int, t: int, src_mask: Tensor, structure: Structure, packed: bool,
                 full_sources: bool = False) -> None:
        self.n, self.t, self.src_mask, self.structure, self.packed = n_hyps, t, src_mask, structure, packed
        self.full_sources = full_sources  # no source padded (DecoderCache.full_sources): no cross mask

    def positions(self) -> Span:
        return Span(self.t, self.t + 1)

    def self_mask(self, structure: Structure | None = None, causal: bool = True) -> Tensor | Graph | None:
        """Dense: None (every earlier position) or the (t+1,) row the structure allows; packed: a graph from
        query node n to key nodes n * (t+1) + j."""
        structure, t, device = self.structure, self.t, self.src_mask.device
        row = None if structure.is_full else structure.row(t).to(device)
        if not self.packed:
            if row is None:
                return None
            mask = torch.zeros(t + 1, dtype=torch.bool, device=device)
            mask[row] = True
            return mask  # (t+1,) broadcast
        n = torch.arange(self.n, device=device)
        ones = torch.ones(self.n, dtype=torch.long, device=device)
        pattern = None if row is None else (lambda lq, lk: torch.stack([torch.zeros_like(row), row], 1))  # (k, 2)
        return Graph(self.n, self.n * (t + 1), segments=Segments(n, ones, n * (t + 1), ones * (t + 1), pattern))

    def cross_mask(self, keys: object = None) -> Tensor | Graph | None:
        """Hypothesis n, of sentence b = n // K, to the real tokens of sentence b (key nodes b * S + j); dense
        with no source padded: None (every key)."""
        if not self.packed:
            return None if self.full_sources else encoder_mask(self.src_mask)  # (B, 1, 1, S)
        B, S = self.src_mask.shape
        device = self.src_mask.device
        b, K = torch.arange(B, device=device), self.n // B
        return bipartite_graph(torch.full((B,), K, device=device), self.src_mask.sum(1), q_offsets=b * K,
                               k_offsets=b * S, n_queries=self.n, n_keys=B * S)

    def bias(self, table: Tensor | None) -> Tensor | PositionBias | None:
        """The (H, 1, t+1) row of position t."""
        if table is None:
            return None
        return PositionBias(table) if self.packed else table[None]

    def select(self, running: Tensor, self_mask, cross_mask) -> Selection:
        """running (N, 1) bool -> the hypotheses still running; packed: the graphs restricted to them;
        padded: the rows of cached keys/values and of memory each one reads."""
        rows = running.reshape(-1).nonzero()[:, 0]  # (R,)
        if self.packed:
            return Selection(rows, self_mask.restrict(rows), cross_mask.restrict(rows))
        sentences = torch.div(rows, self.n // self.src_mask.shape[0], rounding_mode="floor")
        return Selection(rows, self_mask, encoder_mask(self.src_mask.index_select(0, sentences)), rows, sentences)

    def flat(self, x: Tensor) -> Tensor:
        return x

    def fold(self, q: Tensor, n_sentences: int) -> Tensor:
        if self.packed or q.shape[0] == n_sentences:
            return q
        return q.reshape(n_sentences, -1, q.shape[-1])


Layout = Padded | Packed | Step
