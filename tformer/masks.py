"""Masks as pure functions.

Polarity, once for the whole package: **True = may attend** (a real token, an allowed query->key pair).
This is the polarity of `torch.nn.functional.scaled_dot_product_attention`'s boolean `attn_mask`, and the
opposite of `torch.nn.MultiheadAttention`'s `key_padding_mask` (there True = ignore).

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """lengths (B,) -> (B, L) bool, True at real tokens (positions < length)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)  # (L,)
    return positions[None, :] < lengths[:, None]  # (B, L)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where key j <= query i: each position sees itself and the past."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def encoder_mask(src_mask: Tensor) -> Tensor:
    """Source self-attention and target->source attention: (B, S) -> (B, 1, 1, S), any query, real keys."""
    return src_mask[:, None, None, :]


def decoder_mask(tgt_mask: Tensor) -> Tensor:
    """Target self-attention: (B, T) -> (B, 1, T, T), real keys at or before the query."""
    T = tgt_mask.shape[1]
    return causal_mask(T, tgt_mask.device)[None, None] & tgt_mask[:, None, None, :]  # (B, 1, T, T)
