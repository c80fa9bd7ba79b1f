"""Attention kernels behind one contract.

    kernel(q, k, v, mask=None, bias=None, dropout_p=0.0, scale=None, need_weights=False)
        -> (out, weights | None)

    q (B, H, T, Dh), k and v (B, H, S, Dh)      queries, keys, values, heads split
    mask  bool, broadcastable to (B, H, T, S)    the structure: True = may attend (see tformer.masks);
          or a tformer.masks.Graph for the graph kernel (attention/graph.py), whose bias is per edge
    bias  float, broadcastable to (B, H, T, S)   added to the scores before the softmax (positions)
    out   (B, H, T, Dh); weights (B, H, T, S) after the softmax, before dropout, when asked for

`dense_attention` is the reference: every other kernel is tested against it. The graph kernel
(attention/graph.py) is a peer that builds on these; tformer.attention.registry names them all.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from tformer.dropout import dropout



class Kernel(Protocol):
    """The contract every attention kernel keeps (see the module docstring)."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[object] = None,
                 bias: Optional[object] = None, dropout_p: float = 0.0, scale: Optional[float] = None,
                 need_weights: bool = False) -> "tuple[Tensor, Optional[Tensor]]": ...


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale + bias, masked) v, written out: the reference for every kernel. In a reduced
    precision on a CPU, without gradients, it computes in float64 and rounds once (`sums_in_fp64`)."""
    if sums_in_fp64(q):
        out, weights = dense_attention(q.double(), k.double(), v.double(), mask,
                                       None if bias is None else bias.double(), dropout_p, scale, need_weights)
        return out.to(q.dtype), (None if weights is None else weights.to(q.dtype))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    bias = _like(bias, q)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    dropped = dropout(weights, dropout_p)
    out = torch.matmul(dropped, v)  # (B, H, T, Dh)
    return out, (weights if need_weights else None)


# A sentence's result must not depend on its batch (tformer.inference), yet a batch decides how wide the padded
# keys are and, below, which kernel runs. In float32 that moves a result in its last bits (~1e-7). In bf16 or fp16
# every kernel rounds its intermediate sums to 8 (11) bits, in an order that depends on the padded width and the
# kernel, so the same sentence alone and in a batch of 16 differed by ~1e-2 in log-probability, and an AVX2 CPU's
# SDPA kernel changed greedy tokens. So in a reduced precision on a CPU, at inference, attention computes in
# float64 (the dense kernel; padded keys add exact zeros) and rounds once to the model's format: the order of the
# sums no longer shows in the result. Products of the weights (the linear layers) keep the reduced precision.
def sums_in_fp64(q: Tensor) -> bool:
    """Whether attention over `q` computes in float64: a bf16/fp16 query on a CPU, with gradients off."""
    return q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu" and not torch.is_grad_enabled()


def cache_format(kernel: "Kernel", x: Tensor) -> torch.dtype:
    """The format a decoder keeps the keys and values it attends to at every step (its cache) in, for rows
    like `x`: float64 where `kernel` sums in float64 (the dense and SDPA kernels, `sums_in_fp64`), so that a
    step converts its new position only, not the whole history and the memory again (in bf16 at one sentence,
    those conversions took 2.7 ms of an 11.3 ms step: benchmarks/RESULTS.md); the values are the same (bf16 and
    fp16 are exact in float64). Otherwise x's own format."""
    return torch.float64 if kernel in (dense_attention, sdpa_attention) and sums_in_fp64(x) else x.dtype


# A decoding step's self-attention has 1 query per hypothesis and no mask: on a CPU, unmasked attention with
# fewer queries than this, over many heads' rows, runs faster through the dense kernel's two matmuls than through
# SDPA's flash kernel (up to 1.8x for 320 hypotheses x 16 keys). Over few rows SDPA's one call wins: at one
# sentence (8 heads, one query) it took 8 us where the dense kernel's seven calls took 16, and it stayed ahead up
# to 64 rows x heads (Zen 4). Beam search's cross-attention folds a sentence's K hypotheses into
# K queries against its padded source: with 2-8 queries over 16 sentences or more, the dense kernel ran 1.4-2.1x
# as fast as SDPA on a Xeon and 1.7-3.2x on an AMD EPYC (Zen 3), mask or not; with one query (greedy), or few
# sentences, SDPA is as fast or faster (benchmarks/attention_kernels.py).
SDPA_CPU_MIN_QUERIES = 9
SDPA_CPU_FOLDED_ROWS = 16
SDPA_CPU_DENSE_HEAD_ROWS = 128  # unmasked, few queries: the dense kernel from this many (rows x heads) on


# On a GPU, SDPA's cuDNN backend (PyTorch's first choice for bf16 and fp16) builds a cuDNN graph for every new
# shape, and decoding (a cache one position longer each step, fewer live rows) and token-budget batches bring a new
# shape almost every call: on an H100 (torch 2.11) a bf16 beam search ran 8-12x slower than fp32, 82% of its time in
# aten::_cudnn_attention_forward, until every shape had been seen. The flash and memory-efficient kernels plan
# nothing, so they run instead (benchmarks/RESULTS.md, "Decoding and training on a GPU")
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _like(bias: Tensor | None, q: Tensor) -> Tensor | None:
    """A position bias (computed in float32) in the queries' format: a bf16 model's scores are bf16."""
    return bias if bias is None or bias.dtype == q.dtype else bias.to(q.dtype)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """PyTorch's fused scaled_dot_product_attention; weights are only available from the dense kernel."""
    cpu = q.device.type == "cpu"
    # a decoding step's few queries per row over few rows x heads (one sentence, or a few): SDPA's one call. Never
    # read while tracing: an export's dynamic batch and a compiled training forward's lengths stay symbolic (a
    # comparison would guard on them, and recompile)
    few_rows = (not torch.compiler.is_compiling() and q.shape[-2] < SDPA_CPU_MIN_QUERIES
                and q.shape[0] * q.shape[1] < SDPA_CPU_DENSE_HEAD_ROWS)
    if mask is None:  # a decoding step's self-attention (or cross-attention, no source padded)
        dense = cpu and q.shape[-2] < SDPA_CPU_MIN_QUERIES and not few_rows
    else:  # beams folded into queries
        dense = (cpu and not torch.compiler.is_compiling() and 1 < q.shape[-2] < SDPA_CPU_MIN_QUERIES
                 and q.shape[0] >= SDPA_CPU_FOLDED_ROWS)
    wide = sums_in_fp64(q)
    if need_weights or (dropout_p > 0 and cpu) or dense or (wide and not few_rows):
        # weights exist only in the dense kernel; with dropout on a CPU, torch 2.13 picks SDPA's MATH
        # backend (torch._fused_sdp_choice == SDPBackend.MATH): the dense kernel's computation, but with
        # torch's slower dropout mask; a decoding step's few queries over many rows run faster as two matmuls;
        # and a reduced precision on a CPU computes in float64 (sums_in_fp64), where the dense kernel's matmuls
        # beat SDPA but over a step's few rows (13 against 24 us at one sentence, 8 heads, Zen 4)
        return dense_attention(q, k, v, mask, bias, dropout_p, scale, need_weights)
    if wide:  # in float64, rounded once, as the dense kernel does (sums_in_fp64); the cache holds float64 already
        out, _ = sdpa_attention(q.double(), k.double(), v.double(), mask, bias, dropout_p, scale)
        return out.to(q.dtype), None
    attn_mask, bias = mask, _like(bias, q)
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    with sdpa_kernel(CUDA_SDPA_BACKENDS) if q.is_cuda else nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return out, None  # (B, H, T, Dh)
