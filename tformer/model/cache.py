"""The decoder's cache between decoding steps, typed: what a search reorders and an exporter flattens.

Rows: per sentence (B) for what depends on the source alone, per hypothesis (N = B x K, a sentence's K
hypotheses in consecutive rows) for what depends on the target so far. Notation: S source length, t
positions decoded, H heads, Dh head dim, D model dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from tformer.attention.kvbuffer import KV, KVBuffer


@dataclass(frozen=True)
class DecoderCache:
    src_mask: Tensor  # (B, S) bool, per sentence
    cross: list[KV]  # per layer: the memory's cross-attention keys and values, (B, H, S, Dh) each, per sentence
    # self-attention keys and values of the positions decoded, per hypothesis: one entry per layer (a stack: a
    # KVBuffer, or (k, v) tensors when traced for export), or per ACT step (universal: (N, H, m_s, Dh), m_s <= t;
    # positions past m_s never ran step s and are computed from their final state when a later position needs them)
    self_kv: list[KV | KVBuffer] = field(default_factory=list)
    anchors: Tensor | None = None  # universal: (N, t, D) each position's final state plus its position vector
    steps: Tensor | None = None  # universal: (N, t) ACT steps each position took
    preallocated: bool = True  # a stack's first step starts KVBuffers; False: (k, v) tensors, concatenated (export)
    full_sources: bool = False  # every source is its full width (no padding), so cross-attention needs no mask

    @classmethod
    def start(cls, src_mask: Tensor, cross: list[KV]) -> "DecoderCache":
        """The cache before the first position, `full_sources` read from the mask once per batch (a sentence
        alone, or sentences of one length: their steps skip the mask, 0.1-0.3 ms of a 7 ms OPUS-MT-base step at
        one sentence, benchmarks/RESULTS.md). Never while traced (an export): its batch's padding is an input."""
        traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
        return cls(src_mask, cross, full_sources=not traced and bool(src_mask.all()))

    @property
    def t(self) -> int:
        """Positions decoded so far."""
        if self.anchors is not None:
            return self.anchors.shape[1]
        if not self.self_kv:
            return 0
        kv = self.self_kv[0]
        return kv.t if isinstance(kv, KVBuffer) else kv[0].shape[2]

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "DecoderCache":
        """Keep, reorder or repeat hypotheses (`hyp_rows` (N',)) and, if given, sentences (`sentence_rows`)."""
        def hyps(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.index_select(0, hyp_rows)

        def hyp_kv(kv: KV | KVBuffer) -> KV | KVBuffer:
            return kv.reorder(hyp_rows) if isinstance(kv, KVBuffer) else (hyps(kv[0]), hyps(kv[1]))

        def sentences(x: Tensor) -> Tensor:
            return x if sentence_rows is None else x.index_select(0, sentence_rows)

        return replace(self, src_mask=sentences(self.src_mask),
                       cross=[(sentences(k), sentences(v)) for k, v in self.cross],
                       self_kv=[hyp_kv(kv) for kv in self.self_kv],
                       anchors=hyps(self.anchors), steps=hyps(self.steps))

