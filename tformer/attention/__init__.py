"""Attention: one contract for every kernel (kernels.Kernel), the kernels by name (registry) and the
multi-head module around them."""

from tformer.attention.kernels import Kernel, dense_attention, sdpa_attention
from tformer.attention.multihead import MultiHeadAttention
from tformer.attention.registry import KERNELS, get_kernel

__all__ = ["KERNELS", "Kernel", "MultiHeadAttention", "dense_attention", "get_kernel", "sdpa_attention"]
