"""The matrix library for inference on a CPU, chosen by a measurement when a model is loaded, not by CPU vendor.

PyTorch sends an fp32 `F.linear` to MKL and a bf16/fp16 one to oneDNN, which reorders the weight into its
blocked layout at every call. oneDNN with the weight reordered once ("prepacked", the ops inductor's CPU path
uses: `mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`) is faster for most shapes, but not all:
on a Xeon with AMX, prepacked fp32 ran a 512 -> 58k product 1.4-2x as fast as MKL from 4 rows up, while at 1-8
rows MKL ran the 512 x 512 products in half the time; on an AMD EPYC (Zen 4), whose MKL has no fast path,
prepacked ran 1.1-2.7x faster from 8 rows (benchmarks/RESULTS.md). So each distinct (in, out, format) shape
is timed both ways at the row counts 1, 2, 4, ..., 256, once per machine (saved: below), and a product of M
rows runs on the library that won at the count timed nearest to M. A rule "prepacked from the count where it
wins for good" was too coarse: on an AMD EPYC (Zen 3, AVX2) prepacked ran the 512 x 512 .. 2048 products
1.2-1.4x as fast as MKL at 8-32 rows but lost at 128-256, so greedy steps of 32 sentences ran on MKL. The
prepacked copy is made when a layer is put on the measured choice (never, where prepacked never wins), and
costs the layer's weight size again in memory (the plain weight stays: tied embeddings read it, and the counts
where MKL won use it).

Both libraries compute in the weights' format and accumulate in fp32, but in different orders: a layer's
output can differ in the last bits between the two, so the choice is made per shape for every process,
and within a process a sentence's result does not depend on its batch beyond those bits (the batch decides
the row count). TFORMER_PREPACK=0 keeps PyTorch's own choice everywhere.

The choices are saved (`saved_path()`: under $TFORMER_CACHE, one file per CPU model and flags and torch version)
and read back by later processes on the same machine, so a model loads without timing anything once its shapes
have been timed (an OPUS-MT-base model: 6 s less), and every process decodes on the same libraries. Delete the
file to time them again.

    prepack(model)    every nn.Linear, and every attention in-projection's parts, on the measured choice
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.files import cache_dir, replace_atomically

log = logging.getLogger("tformer")

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the row counts timed (powers of two): one sentence's greedy step
# up to a beam over a batch
NEVER = (False,) * len(ROWS)
Wins = tuple[bool, ...]  # per count of ROWS: whether the prepacked product beat the plain one there
Key = tuple[int, int, torch.dtype, int, bool]  # (in, out, dtype, threads, timed cold)
_CHOICES: dict[Key, Wins] = {}  # per process, and saved (saved_path)
_READ: set[Path] = set()  # the saved files read into _CHOICES in this process


def available() -> bool:
    """oneDNN's prepacked linear can run here (a CPU build with mkldnn), and TFORMER_PREPACK is not 0."""
    return (os.environ.get("TFORMER_PREPACK", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _reorder(weight: Tensor) -> Tensor:
    """The weight in oneDNN's blocked layout; RuntimeError where oneDNN has no kernel for its format here."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _faster(plain, fast, repeats: int = 5) -> bool:
    """Whether `fast()` beats `plain()`: one untimed call of each (first calls create the primitive), then
    `repeats` rounds that time each once, in turn; the medians decide. Taking turns, a burst of load from the
    machine's other work slows both alike: timed one after the other, a burst during one library's calls
    chose the other for the whole process (a 512 -> 58k product then ran at half speed)."""
    plain(), fast()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, kept in ((plain, times[0]), (fast, times[1])):
            tic = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - tic)
    return statistics.median(times[1]) < statistics.median(times[0])


_NEAREST = [min(len(ROWS) - 1, max(0, round(math.log2(max(m, 1))))) for m in range(2 * ROWS[-1])]


def nearest(rows: int) -> int:
    """The index in ROWS of the row count timed nearest to `rows` on a log scale (the last beyond it): looked up,
    as it is asked at every product."""
    return _NEAREST[rows] if rows < len(_NEAREST) else len(ROWS) - 1


@functools.cache
def _last_cache_bytes() -> int:
    """The size of this CPU's largest cache (its last level), from sysfs; 32 MiB where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip()
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError, KeyError):
            pass
    return max(sizes, default=32 << 20)


COLD_ROWS = 8  # up to this row count a product streams its weights from memory in a decoding step
MAX_COPIES = 256


def measure(in_features: int, out_features: int, dtype: torch.dtype, cold: bool = True) -> Wins:
    """Per count of ROWS, whether the prepacked product beat the plain one on random data of this shape and
    format; all False (NEVER) where oneDNN cannot pack this format here (bf16 on a CPU with neither AVX-512 nor
    AVX-NE-CONVERT). Cached per process.

    With `cold` (a model whose weights do not fit in the last-level cache), up to COLD_ROWS rows the weights are
    timed cold, as a decoding step reads them: a step of a few sentences streams every layer's weights from memory
    once (an OPUS-MT-base step reads 207 MB, which evicts each layer before its next use), so each timed call
    reads one of enough copies of the weight to fill twice the last-level cache. A model that fits in the cache
    (a d-128 student: 9 MB) is timed warm, as its step reads it. Timed warm (one copy, in cache), a 512 x 512
    layer's two libraries came within noise of each other at 1 row and the choice changed from process to process;
    cold, prepacked streamed at about twice MKL's rate on a Zen 4 (benchmarks/row_products.py)."""
    key = (in_features, out_features, dtype, torch.get_num_threads(), cold)
    if key not in _CHOICES:
        g = torch.Generator().manual_seed(0)
        weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        bias = torch.zeros(out_features, dtype=dtype)
        try:
            packed = _reorder(weight)
        except RuntimeError:  # oneDNN has no kernel for this format here: the plain product it is
            _CHOICES[key] = NEVER
            return NEVER
        bytes_ = weight.numel() * weight.element_size()
        n = min(MAX_COPIES, max(1, -(-2 * _last_cache_bytes() // bytes_))) if cold else 1  # copies timed in turn
        weights = [weight] + [weight.clone() for _ in range(n - 1)]
        packs = [packed] + [_reorder(w) for w in weights[1:]]
        wins = []
        with torch.inference_mode():
            for rows in ROWS:
                x = torch.randn(rows, in_features, generator=g).to(dtype)
                copies = range(n if rows <= COLD_ROWS else 1)

                def plain():
                    for i in copies:
                        F.linear(x, weights[i], bias)

                def fast():
                    for i in copies:
                        _packed_linear(x, packs[i], bias)

                wins.append(_faster(plain, fast))
        _CHOICES[key] = tuple(wins)
    return _CHOICES[key]


class Prepacked:
    """y = x W^T + b on the measured choice: x of M rows (all dimensions but the last) through oneDNN with W
    prepacked (packed when made, where any count wins) where the prepacked product won at the row count timed
    nearest to M (`wins`, per count of ROWS), through F.linear elsewhere. Inference only: with gradients enabled,
    or traced with a symbolic row count (an export), it is F.linear."""

    def __init__(self, weight: Tensor, bias: Tensor | None, wins: Wins) -> None:
        if len(wins) != len(ROWS):
            raise ValueError(f"wins has {len(wins)} entries, one per count of ROWS ({len(ROWS)}) expected")
        self.weight, self.bias, self.wins = weight, bias, tuple(wins)
        # packed now where any row count will use it: at the first product it cost a first request 130 ms (an
        # OPUS-MT-base model's 207 MB reordered)
        self.packed: Tensor | None = _reorder(weight.detach()) if any(self.wins) else None

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        if torch.is_grad_enabled() or not isinstance(rows, int) or not self.wins[nearest(rows)]:
            return F.linear(x, self.weight, self.bias)  # (symbolic rows: traced for export, which needs F.linear)
        if x.dim() == 2:
            return _packed_linear(x, self.packed, self.bias)
        # oneDNN's linear takes 3-d rows at a cost of its own (39 against 25 us for one row of 512 x 512, fp32):
        # given 2-d rows, it is the product alone
        return _packed_linear(x.reshape(rows, x.shape[-1]), self.packed, self.bias).view(*x.shape[:-1], -1)

    @classmethod
    def measured(cls, weight: Tensor, bias: Tensor | None, cold: bool = True) -> "Prepacked":
        out_features, in_features = weight.shape
        return cls(weight.detach(), None if bias is None else bias.detach(),
                   measure(in_features, out_features, weight.dtype, cold))


class PrepackedLinear(nn.Linear):
    """An nn.Linear (the same Parameters: its state dict, and a tied embedding, are unchanged) whose forward
    runs on the measured choice (`Prepacked`)."""

    def __init__(self, linear: nn.Linear, cold: bool = True) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.run = Prepacked.measured(linear.weight, linear.bias, cold)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


@functools.cache
def _machine_key() -> str:
    """This CPU (its model name and flags) and torch version, hashed."""
    cpu = ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = "|".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))
    except OSError:
        pass
    return hashlib.sha256(f"{cpu}|{os.uname().machine}|{torch.__version__}".encode()).hexdigest()[:16]


def saved_path() -> Path:
    """The file this machine's choices are saved in: one per CPU (its model name and flags) and torch version."""
    return cache_dir() / "matmul" / f"choices-{_machine_key()}.json"


def _name(key: Key) -> str:
    i, o, dtype, threads, cold = key
    return f"{i},{o},{str(dtype).removeprefix('torch.')},{threads},{'cold' if cold else 'warm'}"


def _read_saved(path: Path) -> None:
    """The choices saved in `path` into _CHOICES (where this process has none yet); nothing from a missing or
    unreadable file, or from its entries that are not well formed (those shapes are timed again, and saved)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        items = saved.items() if isinstance(saved, dict) else ()
    except (OSError, ValueError):
        return
    for name, wins in items:
        try:
            i, o, dtype, threads, cold = name.split(",")
            key = (int(i), int(o), getattr(torch, dtype), int(threads), {"cold": True, "warm": False}[cold])
        except (ValueError, AttributeError, KeyError):
            continue
        if (isinstance(key[2], torch.dtype) and isinstance(wins, list) and len(wins) == len(ROWS)
                and all(isinstance(w, bool) for w in wins)):
            _CHOICES.setdefault(key, tuple(wins))


def _save(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replace_atomically(path) as f:
            json.dump({_name(k): list(w) for k, w in sorted(_CHOICES.items(), key=lambda kw: _name(kw[0]))}, f)
    except OSError as e:  # a cache: decoding goes on, and the next process times again
        log.warning("matmul: could not save the product libraries' choices to %s (%s)", path, e)


def prepack(model: nn.Module) -> nn.Module:
    """Put every nn.Linear of `model` (on the CPU, in eval mode, its weights in their final format) and every
    attention's in-projection parts on the measured choice, in place; nothing where `available()` is False.
    Returns the model. A module with linear products of its own (MultiHeadAttention's in-projection parts) does
    them in its `prepack(cold)` method. The products are timed cold (`measure`) when the model's linear weights
    do not fit in the last-level cache. Choices saved by an earlier process on this machine are used, and new
    ones saved (`saved_path`)."""
    if not available() or next(model.parameters()).device.type != "cpu":
        return model
    path = saved_path()
    if path not in _READ:
        _READ.add(path)
        _read_saved(path)
    known, tic = len(_CHOICES), time.perf_counter()
    linears = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    cold = sum(w.numel() * w.element_size() for w in linears.values()) > _last_cache_bytes()
    for module in list(model.modules()):
        if callable(getattr(module, "prepack", None)):
            module.prepack(cold)
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PrepackedLinear(child, cold))
    if len(_CHOICES) > known:
        log.info("matmul: timed the product libraries for %d shapes in %.1f s; saved to %s", len(_CHOICES) - known,
                 time.perf_counter() - tic, path)
        _save(path)
    return model
