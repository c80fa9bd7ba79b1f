"""Multi-head attention: projections, head split/merge and the key/value cache around a kernel.

Notation: B batch, T query length, S key length, D model dim, H heads, Dh = D / H head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.attention.registry import get_kernel


class AttentionOutput(NamedTuple):
    out: Tensor  # (B, T, D)
    weights: Tensor | None  # (B, H, T, S) when asked for
    kv: tuple[Tensor, Tensor]  # keys and values used, (B, H, S, Dh) each: what a cache keeps


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads.

    The query/key/value projections live in one (3D, D) matrix, rows in that order, the layout of
    `torch.nn.MultiheadAttention.in_proj_weight`: self-attention projects with one matrix multiply.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, kernel: str = "sdpa",
                 scale: float | None = None) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.scale = scale  # of q . k; None = 1 / sqrt(Dh) (TUPE: 1 / sqrt(2 Dh))
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.set_kernel(kernel)

    def set_kernel(self, name: str) -> None:
        self.kernel = get_kernel(name)

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, D): computed once per sentence for cross-attention."""
        w, b = self.in_proj.weight[self.d_model :], self.in_proj.bias[self.d_model :]
        k, v = F.linear(memory, w, b).chunk(2, dim=-1)  # (B, S, D) each
        return self._split(k), self._split(v)  # (B, H, S, Dh) each

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        past: tuple[Tensor, Tensor] | None = None,
        static_kv: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Self-attention when `memory` and `static_kv` are None; cross-attention otherwise.

        query (B, T, D); memory (B, S, D); past: cached self-attention (k, v) of earlier positions, to
        which this call's keys and values are appended; static_kv: keys and values given whole (k, v), from
        `project_kv`. mask / bias: see tformer.attention.kernels.
        """
        D = self.d_model
        if memory is None and static_kv is None:
            q, k, v = self.in_proj(query).chunk(3, dim=-1)  # (B, T, D) each
            q, k, v = self._split(q), self._split(k), self._split(v)  # (B, H, T, Dh)
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, H, S, Dh), S = past + T
                v = torch.cat([past[1], v], dim=2)
        else:
            q = self._split(F.linear(query, self.in_proj.weight[:D], self.in_proj.bias[:D]))  # (B, H, T, Dh)
            k, v = static_kv if static_kv is not None else self.project_kv(memory)  # (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        out, weights = self.kernel(q, k, v, mask=mask, bias=bias, dropout_p=p, scale=self.scale,
                                   need_weights=need_weights)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, (k, v))
