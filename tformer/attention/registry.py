"""The attention kernels by name: dense, sdpa and graph are peers behind one contract (kernels.Kernel).
This module holds the only lookup table in the package, KERNELS."""

from __future__ import annotations

from tformer.attention.graph import graph_attention
from tformer.attention.kernels import Kernel, dense_attention, sdpa_attention

KERNELS: dict[str, Kernel] = {"dense": dense_attention, "sdpa": sdpa_attention, "graph": graph_attention}


def get_kernel(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown attention kernel '{name}'; choose one of {', '.join(KERNELS)}") from None
