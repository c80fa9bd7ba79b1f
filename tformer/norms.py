"""Normalisation layers the model is built from besides torch's LayerNorm.

Notation: D the normalised dimension (d_model, or Dh for QK-norm).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g over the last dimension (Zhang and Sennrich 2019): LayerNorm without the
    centring and the bias. Computed in float32 (as torch.nn.RMSNorm, which torch < 2.4 lacks)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def build_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """model.norm_layer: LayerNorm or RMSNorm over D."""
    return RMSNorm(d_model, eps) if kind == "rmsnorm" else nn.LayerNorm(d_model, eps=eps)
