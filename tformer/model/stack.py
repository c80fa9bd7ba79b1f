"""A stack of layers, each with its own weights: the encoder and decoder of "Attention Is All You Need".

An encoder or decoder (this, or the universal transformer's ACT stack, tformer.model.act) takes a prepared
side (`Side`: embedded rows, layout, structure, positional bias) and answers

    encode(side, need_weights)                    -> Encoded(x, self weights, ponder)
    decode(side, memory, cross_mask, need_weights) -> Decoded(x, self weights, cross weights, ponder)
    init_cache(memory, src_mask)                  -> DecoderCache
    step(side, cache)                             -> (x (N, 1, D), cache): one decoding position (a Step layout)

Outputs are after the stack's final LayerNorm (pre-norm; identity post-norm).
Notation: B batch, L length, S source length, N rows (hypotheses when decoding), D model dim.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from torch import Tensor, nn

from tformer.attention.kvbuffer import KVBuffer
from tformer.masks import Graph, PositionBias
from tformer.model.cache import DecoderCache
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.model.layout import Layout
from tformer.norms import build_norm

if TYPE_CHECKING:
    from tformer.model.act import Ponder
    from tformer.positions import Rotary


class Side(NamedTuple):
    """One side's input, prepared once for any kind of stack (Transformer.source / .target)."""

    x: Tensor  # (B, L, D) padded or (1, N, D) packed: embeddings (positions added unless `positions` holds them)
    positions: Tensor | None  # position vectors, shaped like x, for stacks that add them at every step
    layout: Layout
    mask: Tensor | Graph  # the self-attention structure
    bias: Tensor | PositionBias | None  # the positional self-attention bias (TUPE, relative, ALiBi)
    rotary: "Rotary | None" = None  # RoPE's angles for these rows' positions (model.positions rotary)


class Encoded(NamedTuple):
    x: Tensor
    weights: list[Tensor | None]  # per layer (or ACT step)
    ponder: "Ponder | None" = None  # ACT steps per position (B, L) (an ACT stack)


class Decoded(NamedTuple):
    x: Tensor
    self_weights: list[Tensor | None]
    cross_weights: list[Tensor | None]
    ponder: "Ponder | None" = None


def final_norm(cfg_norm: str, d_model: int, eps: float, norm_layer: str = "layernorm") -> nn.Module:
    return build_norm(norm_layer, d_model, eps) if cfg_norm == "pre" else nn.Identity()


class LayerStack(nn.Module):
    def __init__(self, layers: list[EncoderLayer] | list[DecoderLayer], norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def reset_parameters(self) -> None:
        """Nothing beyond the model's initialisation."""

    def encode(self, side: Side, need_weights: bool = False) -> Encoded:
        x, weights = side.x, []
        for layer in self.layers:
            x, w = layer(x, side.mask, bias=side.bias, need_weights=need_weights, rotary=side.rotary)
            weights.append(w)
        return Encoded(self.norm(x), weights)

    def decode(self, side: Side, memory: Tensor, cross_mask: Tensor | Graph, need_weights: bool = False) -> Decoded:
        x, self_w, cross_w = side.x, [], []
        for layer in self.layers:
            kv = layer.cross_attn.project_kv(memory)  # (B, H, S, Dh) each, or (1, H, Ns, Dh)
            out = layer(x, side.mask, kv, cross_mask, self_bias=side.bias, need_weights=need_weights,
                        layout=side.layout, rotary=side.rotary)
            x = out.x
            self_w.append(out.self_weights)
            cross_w.append(out.cross_weights)
        return Decoded(self.norm(x), self_w, cross_w)

    def init_cache(self, memory: Tensor, src_mask: Tensor) -> DecoderCache:
        """memory (B, S, D) per sentence -> every layer's cross-attention keys and values."""
        return DecoderCache.start(src_mask, [layer.cross_attn.memory_kv(memory) for layer in self.layers])

    def step(self, side: Side, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """side.x (N, 1, D) embedded tokens at position t = cache.t (side.layout a Step) -> (N, 1, D) and the
        cache with position t."""
        x, layout = side.x, side.layout
        self_mask, cross_mask = layout.self_mask(), layout.cross_mask()
        new = []
        for i, layer in enumerate(self.layers):
            past = (cache.self_kv[i] if cache.self_kv else None if not cache.preallocated
                    else KVBuffer(x.new_empty(0, dtype=layer.self_attn.cache_format(x))))
            out = layer(x, self_mask, cache.cross[i], cross_mask, past=past, self_bias=side.bias, layout=layout,
                        rotary=side.rotary)
            x = out.x  # (N, 1, D)
            new.append(out.self_kv)  # (N, H, t+1, Dh) each, or the buffer holding them
        return self.norm(x), replace(cache, self_kv=new)
