"""The output projection restricted to some rows of the vocabulary (a lexical shortlist, tformer.shortlist).

    project = restricted_linear(model.generator, ids)    # ids (K,) target ids
    logits = project(hidden)                              # (N, K): exactly the full projection's columns `ids`

Whatever form the generator has by then: a plain or tied nn.Linear (fp32, bf16, fp16), one on the measured matrix
library (tformer.model.matmul.MeasuredLinear: the rows run on the library it measured fastest for the full
shape: oneDNN's prepacked product, MKL's or the rows kernel), or PyTorch's dynamic int8 Linear (decode.quantize=int8). The int8
rows keep the full layer's weight scale, and the input is quantised per call as the full layer does it, so the
restricted product equals the full one's columns. The rows are copied once per batch (K x D values), not per step;
an int8 layer's weights are unpacked once per layer (`_unpacked`), not per batch.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.model.matmul import MeasuredLinear, Product

Projection = Callable[[Tensor], Tensor]


def restricted_linear(linear: nn.Module, ids: Tensor) -> Projection:
    """x (..., D) -> (..., K): `linear`'s outputs at the rows `ids` (K,) only."""
    if isinstance(linear, torch.ao.nn.quantized.dynamic.Linear):
        weight, bias = _unpacked(linear)
        packed = torch.ops.quantized.linear_prepack(weight.index_select(0, ids),
                                                    None if bias is None else bias.index_select(0, ids))
        reduce_range = linear.version is not None and linear.version >= 4  # as the layer's own forward

        def int8(x: Tensor) -> Tensor:
            return torch.ops.quantized.linear_dynamic(x, packed, reduce_range).to(x.dtype)

        return int8
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"cannot restrict an output layer of type {type(linear).__name__}")
    weight = linear.weight.detach().index_select(0, ids)
    bias = None if linear.bias is None else linear.bias.detach().index_select(0, ids)
    if isinstance(linear, MeasuredLinear):  # the library the full layer measured fastest, at each row count
        return Product(weight, bias, linear.run.choice)
    return lambda x: F.linear(x, weight, bias)


_UNPACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _unpacked(linear: nn.Module) -> tuple[Tensor, Tensor | None]:
    """A dynamic int8 Linear's (int8 weight, bias), unpacked from its prepacked form once per layer (a few
    milliseconds for a 6000-row generator, which every batch paid before); again after set_weight_bias."""
    packed = linear._packed_params._packed_params
    seen = _UNPACKED.get(linear)
    if seen is None or seen[0] is not packed:
        seen = _UNPACKED[linear] = (packed, *linear._packed_params._weight_bias())
    return seen[1], seen[2]
