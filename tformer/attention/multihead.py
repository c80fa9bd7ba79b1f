"""Multi-head attention: projections, head split/merge and the key/value cache around a kernel.

Notation: B batch, T query length, S key length, D model dim, H heads, Dh = D / H head dim, G key/value heads
(grouped-query attention: each serves H / G query heads; G = H is multi-head, G = 1 multi-query attention).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.attention.kernels import cache_format
from tformer.attention.kvbuffer import KVBuffer
from tformer.attention.registry import get_kernel
from tformer.norms import RMSNorm


class AttentionOutput(NamedTuple):
    out: Tensor  # (B, T, D)
    weights: Tensor | None  # (B, H, T, S) when asked for
    kv: tuple[Tensor, Tensor] | KVBuffer  # keys and values used, (B, G, S, Dh) each, or the buffer holding them


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads.

    The query/key/value projections live in one (D + 2 G Dh, D) matrix, rows in that order, the layout of
    `torch.nn.MultiheadAttention.in_proj_weight` (3D rows when G = H): self-attention projects with one matrix
    multiply. With G < H key/value heads (grouped-query attention, Ainslie et al. 2023), query heads h read
    key/value head h // (H / G), and what is cached holds G heads. They are
    used whole (q, k, v), or in parts (q; k, v) for cross-attention: `project` names the part. After
    `quantize_int8` (inference on a CPU) each part is its own dynamic int8 layer and in_proj is gone.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, kernel: str = "sdpa",
                 scale: float | None = None, qk_norm: bool = False, kv_heads: int = 0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.kv_heads = kv_heads or n_heads
        if n_heads % self.kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of kv_heads={kv_heads}")
        self.kv_dim = self.kv_heads * self.head_dim
        self.dropout = dropout
        self.scale = scale  # of q . k; None = 1 / sqrt(Dh) (TUPE: 1 / sqrt(2 Dh))
        # QK-norm: each head's queries and keys RMS-normalised over Dh (one learned gain per side, shared by the
        # heads) before their dot product; keys are cached normalised
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else None
        self.in_proj = nn.Linear(d_model, d_model + 2 * self.kv_dim)
        self.out_proj = nn.Linear(d_model, d_model)
        self.int8: nn.ModuleDict | None = None  # the parts as dynamic int8 layers (quantize_int8)
        self.prepacked: dict[str, Callable[[Tensor], Tensor]] | None = None  # "q", "kv" on the measured library
        self.set_kernel(kernel)

    def set_kernel(self, name: str) -> None:
        self.kernel = get_kernel(name)

    def _split(self, x: Tensor) -> Tensor:
        B, L, width = x.shape
        return x.view(B, L, width // self.head_dim, self.head_dim).transpose(1, 2)  # (B, H or G, L, Dh)

    def _rows(self, part: str) -> slice:
        D, KV = self.d_model, 2 * self.kv_dim
        return {"qkv": slice(0, D + KV), "q": slice(0, D), "kv": slice(D, D + KV)}[part]

    def project(self, x: Tensor, part: str) -> Tensor:
        """x (B, L, D) through the in-projection's rows for `part`: "qkv" (B, L, D + 2 G Dh), "q" (B, L, D) or
        "kv" (B, L, 2 G Dh)."""
        if self.int8 is not None:
            return self.int8[part](x)
        if part == "qkv":
            return self.in_proj(x)
        if self.prepacked is not None:
            return self.prepacked[part](x)
        rows = self._rows(part)
        return F.linear(x, self.in_proj.weight[rows], self.in_proj.bias[rows])

    def prepack(self, cold: bool = True) -> None:
        """Run the "q" and "kv" parts on the matrix library measured fastest for their shapes
        (tformer.model.matmul; "qkv" is in_proj, an nn.Linear, which `prepack` converts as any other): for
        inference on a CPU, with the weights in their final format, timed `cold` or not as the model's size asks
        (matmul.prepack). Their weights stay views of in_proj's."""
        from tformer.model.matmul import Product

        self.prepacked = {part: Product.measured(self.in_proj.weight[self._rows(part)],
                                                   self.in_proj.bias[self._rows(part)], cold) for part in ("q", "kv")}

    def quantize_int8(self) -> None:
        """Replace the in-projection by one dynamic int8 layer per part (PyTorch's quantization: int8 weights
        per tensor, activations quantized on the fly), for inference on a CPU. The out-projection is an
        nn.Linear, which `torch.ao.quantization.quantize_dynamic` converts as any other."""
        from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
        from torch.ao.quantization import default_dynamic_qconfig

        parts = {}
        for part in ("qkv", "q", "kv"):
            rows = self._rows(part)
            dense = nn.Linear(self.d_model, rows.stop - rows.start)
            with torch.no_grad():
                dense.weight.copy_(self.in_proj.weight[rows])
                dense.bias.copy_(self.in_proj.bias[rows])
            dense.qconfig = default_dynamic_qconfig
            parts[part] = DynamicInt8Linear.from_float(dense)
        self.int8 = nn.ModuleDict(parts)
        del self.in_proj

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, D): computed once per sentence for cross-attention."""
        k, v = self.project(memory, "kv").chunk(2, dim=-1)  # (B, S, G Dh) each
        return self._keys(self._split(k)), self._split(v)  # (B, G, S, Dh) each

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """`project_kv` for a decoder's cache, which every decoding step reads: each (B, G, S, Dh) in memory of
        its own, contiguous. `project_kv`'s are strided views of one projection, and a matmul over them copies
        them first, at every step (the dense kernel, which beam search's folded cross-attention runs, took 3.7-4x
        as long on them at 32 sentences: benchmarks/RESULTS.md)."""
        k, v = self.project_kv(memory)
        cached = self.cache_format(memory)
        return k.contiguous().to(cached), v.contiguous().to(cached)

    def cache_format(self, x: Tensor) -> torch.dtype:
        """The format of the keys and values a decoder caches for this attention (kernels.cache_format)."""
        return cache_format(self.kernel, x)

    def _grouped(self, x: Tensor) -> Tensor:
        """(B, G, S, Dh) keys or values -> (B, H, S, Dh): each key/value head serves its group of query heads."""
        return x if self.kv_heads == self.n_heads else x.repeat_interleave(self.n_heads // self.kv_heads, dim=1)

    def _queries(self, q: Tensor) -> Tensor:
        return q if self.q_norm is None else self.q_norm(q)  # (B, H, T, Dh)

    def _keys(self, k: Tensor) -> Tensor:
        return k if self.k_norm is None else self.k_norm(k)  # (B, H, S, Dh)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        past: tuple[Tensor, Tensor] | KVBuffer | None = None,
        static_kv: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
        rotary: Callable[[Tensor], Tensor] | None = None,
    ) -> AttentionOutput:
        """Self-attention when `memory` and `static_kv` are None; cross-attention otherwise.

        query (B, T, D); memory (B, S, D); past: cached self-attention (k, v) of earlier positions, to
        which this call's keys and values are appended (a KVBuffer: in place, T = 1); static_kv: keys and
        values given whole (k, v), from `project_kv`. mask / bias: see tformer.attention.kernels. rotary:
        self-attention only, RoPE (tformer.positions.Rotary) for this call's rows, applied to their queries and
        keys (keys are cached rotated); with `static_kv`, to the queries alone (the keys come rotated by their
        own positions: the universal transformer's steps, where the queries are a subset of the rows).
        """
        D = self.d_model
        if memory is None and static_kv is None:
            q, k, v = self.project(query, "qkv").split([D, self.kv_dim, self.kv_dim], dim=-1)  # (B, T, D|G Dh)
            q, k, v = self._queries(self._split(q)), self._keys(self._split(k)), self._split(v)  # (B, H|G, T, Dh)
            if rotary is not None:
                q, k = rotary(q), rotary(k)  # (B, H|G, T, Dh): turned by their positions
            if isinstance(past, KVBuffer):
                k, v = past.append(k, v)  # (B, G, S, Dh), S = past + 1
            elif past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, G, S, Dh), S = past + T
                v = torch.cat([past[1], v], dim=2)
        else:
            q = self._queries(self._split(self.project(query, "q")))  # (B, H, T, Dh)
            if rotary is not None:
                q = rotary(q)
            k, v = static_kv if static_kv is not None else self.project_kv(memory)  # (B, G, S, Dh)
        p = self.dropout if self.training else 0.0
        out, weights = self.kernel(q, self._grouped(k), self._grouped(v), mask=mask, bias=bias, dropout_p=p,
                                   scale=self.scale, need_weights=need_weights)  # (B, H, T, Dh)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, past if isinstance(past, KVBuffer) else (k, v))
