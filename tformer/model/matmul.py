"""The matrix library for inference on a CPU, chosen by a measurement when a model is loaded, not by CPU vendor.

PyTorch sends an fp32 `F.linear` to MKL and a bf16/fp16 one to oneDNN, which reorders the weight into its
blocked layout at every call. oneDNN with the weight reordered once ("prepacked", the ops inductor's CPU path
uses: `mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`) is faster for most shapes, but not all:
on a Xeon with AMX, prepacked fp32 ran a 512 -> 58k product 1.4-2x as fast as MKL from 4 rows up, while at 1-8
rows MKL ran the 512 x 512 products in half the time; on an AMD EPYC (Zen 4), whose MKL has no fast path,
prepacked ran 1.1-2.7x faster from 8 rows (benchmarks/RESULTS.md). So each distinct (in, out, format) shape
is timed both ways at a few row counts, once per process, and a layer uses the prepacked weight from the
row count where it wins on (`min_rows`; never, when it never wins). The prepacked copy is made then, and
costs the layer's weight size again in memory (the plain weight stays: tied embeddings read it, and small
batches use it).

Both libraries compute in the weights' format and accumulate in fp32, but in different orders: a layer's
output can differ in the last bits between the two, so the choice is made per shape for the whole process,
and within a process a sentence's result does not depend on its batch beyond those bits (the batch decides
the row count). TFORMER_PREPACK=0 keeps PyTorch's own choice everywhere.

    prepack(model)    every nn.Linear, and every attention in-projection's parts, on the measured choice
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NEVER = 1 << 62
ROWS = (1, 4, 16, 64, 256)  # the row counts timed: one sentence's greedy step up to a beam over a batch
_CHOICES: dict[tuple[int, int, torch.dtype, int], int] = {}  # (in, out, dtype, threads) -> min_rows, per process


def available() -> bool:
    """oneDNN's prepacked linear can run here (a CPU build with mkldnn), and TFORMER_PREPACK is not 0."""
    return (os.environ.get("TFORMER_PREPACK", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _seconds(fn, repeats: int = 3) -> float:
    fn()  # warm: first calls create the primitive
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def measure(in_features: int, out_features: int, dtype: torch.dtype) -> int:
    """The fewest rows (of ROWS) from which the prepacked product beats the plain one at every larger count
    timed, on random data of this shape and format; NEVER when it does not win at the largest. Cached."""
    key = (in_features, out_features, dtype, torch.get_num_threads())
    if key not in _CHOICES:
        g = torch.Generator().manual_seed(0)
        weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        bias = torch.zeros(out_features, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        wins = []
        with torch.inference_mode():
            for rows in ROWS:
                x = torch.randn(rows, in_features, generator=g).to(dtype)
                plain = _seconds(lambda: F.linear(x, weight, bias))
                fast = _seconds(lambda: _packed_linear(x, packed, bias))
                wins.append(fast < plain)
        choice = NEVER
        for rows, win in zip(reversed(ROWS), reversed(wins)):
            if not win:
                break
            choice = rows
        _CHOICES[key] = choice
    return _CHOICES[key]


class Prepacked:
    """y = x W^T + b on the measured choice: x with at least `min_rows` rows (all dimensions but the last)
    through oneDNN with W prepacked (packed at the first such call), fewer through F.linear. Inference only:
    with gradients enabled it is F.linear."""

    def __init__(self, weight: Tensor, bias: Tensor | None, min_rows: int) -> None:
        self.weight, self.bias, self.min_rows = weight, bias, min_rows
        self.packed: Tensor | None = None

    def __call__(self, x: Tensor) -> Tensor:
        if x.numel() < self.min_rows * x.shape[-1] or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        if self.packed is None:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        return _packed_linear(x, self.packed, self.bias)

    @classmethod
    def measured(cls, weight: Tensor, bias: Tensor | None) -> "Prepacked":
        out_features, in_features = weight.shape
        return cls(weight.detach(), None if bias is None else bias.detach(),
                   measure(in_features, out_features, weight.dtype))


class PrepackedLinear(nn.Linear):
    """An nn.Linear (the same Parameters: its state dict, and a tied embedding, are unchanged) whose forward
    runs on the measured choice (`Prepacked`)."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.run = Prepacked.measured(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


def prepack(model: nn.Module) -> nn.Module:
    """Put every nn.Linear of `model` (on the CPU, in eval mode, its weights in their final format) and every
    attention's in-projection parts on the measured choice, in place; nothing where `available()` is False.
    Returns the model. A module with linear products of its own (MultiHeadAttention's in-projection parts) does
    them in its `prepack()` method."""
    if not available() or next(model.parameters()).device.type != "cpu":
        return model
    for module in list(model.modules()):
        if callable(getattr(module, "prepack", None)):
            module.prepack()
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PrepackedLinear(child))
    return model
