"""Encoder and decoder layers with residual connections and LayerNorm, post-norm or pre-norm.

    post (the paper):                 x = norm(x + dropout(sublayer(x)))
    pre  (Annotated Transformer/DGL): x = x + dropout(sublayer(norm(x)))   (+ a final norm on the stack)

Notation: B batch, S source length, T target length, D model dim, F FFN dim, H heads, Dh head dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn

from tformer.attention import MultiHeadAttention
from tformer.config import ModelConfig
from tformer.dropout import Dropout
from tformer.norms import build_norm
from tformer.positions import TUPE

if TYPE_CHECKING:
    from tformer.attention.kvbuffer import KVBuffer
    from tformer.model.layout import Layout
    from tformer.positions import Rotary


def self_attention_scale(cfg: ModelConfig, side: str) -> float | None:
    """TUPE scales content scores by 1/sqrt(2 Dh), like its position scores; others use the default."""
    return (2 * cfg.d_model // cfg.n_heads) ** -0.5 if cfg.side_positions(side) in TUPE else None


class FeedForward(nn.Module):
    """Position-wise FFN: linear (D -> F), activation, dropout, linear (F -> D). Gated (`glu`): linear1 gives
    (D -> 2F) the two halves a (x W) and b (x V), and the FFN is linear2(dropout(activation(a) * b))."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float, glu: bool = False) -> None:
        super().__init__()
        self.glu = glu
        self.linear1 = nn.Linear(d_model, 2 * d_ff if glu else d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (B, L, F) or (B, L, 2F)
        if self.glu:
            a, b = h.chunk(2, dim=-1)  # (B, L, F) each
            return self.linear2(self.dropout(self.activation(a) * b))  # (B, L, D)
        return self.linear2(self.dropout(self.activation(h)))  # (B, L, D)


def feed_forward(cfg: ModelConfig) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.ffn_dropout, cfg.ffn == "glu")


class Residual(nn.Module):
    """A sublayer's residual connection and its norm, placed before (pre) or after (post)."""

    def __init__(self, d_model: int, norm: str, eps: float, dropout: float, norm_layer: str = "layernorm") -> None:
        super().__init__()
        self.norm = build_norm(norm_layer, d_model, eps)
        self.pre = norm == "pre"
        self.dropout = Dropout(dropout)

    def inp(self, x: Tensor) -> Tensor:
        """What the sublayer reads."""
        return self.norm(x) if self.pre else x

    def out(self, x: Tensor, y: Tensor) -> Tensor:
        """Residual sum of the input x and the sublayer's output y."""
        x = x + self.dropout(y)
        return x if self.pre else self.norm(x)


def rotated_kv(kv: tuple[Tensor, Tensor], rotary: "Rotary | None") -> tuple[Tensor, Tensor]:
    k, v = kv
    return (k if rotary is None else rotary(k)), v


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, eps = cfg.d_model, cfg.layer_norm_eps
        self.self_attn = MultiHeadAttention(d, cfg.n_heads, cfg.attention_dropout, cfg.attention,
                                            self_attention_scale(cfg, "encoder"), cfg.qk_norm, cfg.kv_heads)
        self.ffn = feed_forward(cfg)
        self.res_attn = Residual(d, cfg.norm, eps, cfg.dropout, cfg.norm_layer)
        self.res_ffn = Residual(d, cfg.norm, eps, cfg.dropout, cfg.norm_layer)

    def self_kv(self, x: Tensor, rotary: "Rotary | None" = None) -> tuple[Tensor, Tensor]:
        """The self-attention keys and values that rows x (B, S, D) offer: (B, H, S, Dh) each; the keys turned
        by RoPE's angles for these rows when given."""
        return rotated_kv(self.self_attn.project_kv(self.res_attn.inp(x)), rotary)

    def forward(
        self, x: Tensor, mask: Tensor, bias: Tensor | None = None, need_weights: bool = False,
        keys: tuple[Tensor, Tensor] | None = None, rotary: "Rotary | None" = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S) -> (B, S, D) and self-attention weights (B, H, S, S). `keys`: the
        self-attention keys and values from `self_kv` of a larger set of rows than the queries x (the
        positions an ACT step still runs read every position); None: x's own."""
        a = self.self_attn(self.res_attn.inp(x), mask=mask, bias=bias, static_kv=keys, need_weights=need_weights,
                           rotary=rotary)
        x = self.res_attn.out(x, a.out)
        x = self.res_ffn.out(x, self.ffn(self.res_ffn.inp(x)))
        return x, a.weights


class DecoderLayerOutput(NamedTuple):
    x: Tensor  # (B, T, D)
    self_kv: "tuple[Tensor, Tensor] | KVBuffer"  # (B, H, T_total, Dh) each, or the buffer: what the cache keeps
    self_weights: Tensor | None  # (B, H, T, T_total)
    cross_weights: Tensor | None  # (B, H, T, S)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, eps = cfg.d_model, cfg.layer_norm_eps
        self.self_attn = MultiHeadAttention(d, cfg.n_heads, cfg.attention_dropout, cfg.attention,
                                            self_attention_scale(cfg, "decoder"), cfg.qk_norm, cfg.kv_heads)
        self.cross_attn = MultiHeadAttention(d, cfg.n_heads, cfg.attention_dropout, cfg.attention,
                                             qk_norm=cfg.qk_norm, kv_heads=cfg.kv_heads)
        self.ffn = feed_forward(cfg)
        self.res_self = Residual(d, cfg.norm, eps, cfg.dropout, cfg.norm_layer)
        self.res_cross = Residual(d, cfg.norm, eps, cfg.dropout, cfg.norm_layer)
        self.res_ffn = Residual(d, cfg.norm, eps, cfg.dropout, cfg.norm_layer)

    def self_kv(self, x: Tensor, rotary: "Rotary | None" = None) -> tuple[Tensor, Tensor]:
        """The self-attention keys and values that rows x (B, T, D) offer: (B, H, T, Dh) each (keys turned by
        RoPE when given)."""
        return rotated_kv(self.self_attn.project_kv(self.res_self.inp(x)), rotary)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None,
        cross_kv: tuple[Tensor, Tensor],
        cross_mask: Tensor,
        past: tuple[Tensor, Tensor] | None = None,
        self_bias: Tensor | None = None,
        cross_bias: Tensor | None = None,
        need_weights: bool = False,
        keys: tuple[Tensor, Tensor] | None = None,
        layout: "Layout | None" = None,
        rotary: "Rotary | None" = None,
    ) -> DecoderLayerOutput:
        """x (B, T, D); self_mask (B, 1, T, T_total) or None (one new position sees all the past);
        cross_kv: the memory's keys/values from `cross_attn.project_kv`; cross_mask (B, 1, 1, S). x may hold
        N = B x K rows (K hypotheses per sentence, consecutive) against B rows of memory: the layout folds
        them into their sentence's queries where its kernel needs it. `keys`: self-attention keys and values
        given whole (from `self_kv`, `past` then unused), for queries that are a subset of the rows."""
        a = self.self_attn(self.res_self.inp(x), mask=self_mask, bias=self_bias, past=past, static_kv=keys,
                           need_weights=need_weights, rotary=rotary)
        x = self.res_self.out(x, a.out)
        q = self.res_cross.inp(x)  # (N, T, D)
        if layout is not None:
            q = layout.fold(q, cross_kv[0].shape[0])  # (B, K*T, D) where the kernel reads per sentence
        c = self.cross_attn(q, static_kv=cross_kv, mask=cross_mask, bias=cross_bias, need_weights=need_weights)
        x = self.res_cross.out(x, c.out.reshape(x.shape))
        x = self.res_ffn.out(x, self.ffn(self.res_ffn.inp(x)))
        return DecoderLayerOutput(x, a.kv, a.weights, c.weights)
