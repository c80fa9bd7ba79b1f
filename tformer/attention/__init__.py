"""Attention: one contract for every kernel (see kernels.py) and the multi-head module around it."""

from tformer.attention.kernels import KERNELS, dense_attention, get_kernel, sdpa_attention
from tformer.attention.multihead import MultiHeadAttention

__all__ = ["KERNELS", "MultiHeadAttention", "dense_attention", "get_kernel", "sdpa_attention"]
