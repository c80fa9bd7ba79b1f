"""The matrix library for inference on a CPU, chosen by a measurement when a model is loaded, not by CPU vendor.

Three libraries can run a linear layer's product (`LIBRARIES`):

    plain       F.linear: PyTorch sends fp32 to MKL, and bf16/fp16 to oneDNN, which reorders the weight at every call
    prepacked   oneDNN with the weight reordered once into its blocked layout (the ops inductor's CPU path uses:
                `mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`)
    rows        a product of a few rows compiled on this machine (rows.c; fp32 and bf16 weights): each thread
                streams one range of the weight's rows once; offered up to COLD_ROWS rows, where a decoding step
                is bound by how fast its weights come from memory

None wins everywhere. On a Xeon with AMX, prepacked fp32 ran a 512 -> 58k product 1.4-2x as fast as MKL from
4 rows up, while at 1-8 rows MKL ran the 512 x 512 products in half the time; on an AMD EPYC (Zen 4), whose MKL
has no fast path, prepacked ran 1.1-2.7x faster from 8 rows, and the rows kernel streamed an OPUS-MT-base step's
weights at 1-2 rows 1.3-1.5x as fast as prepacked (benchmarks/RESULTS.md). So each distinct (in, out, format)
shape is timed on every library that can take it at the row counts 1, 2, 4, ..., 256, once per machine (saved:
below), and a product of M rows runs on the library that won at the count timed nearest to M. A rule "prepacked
from the count where it wins for good" was too coarse: on an AMD EPYC (Zen 3, AVX2) prepacked ran the 512 x 512
.. 2048 products 1.2-1.4x as fast as MKL at 8-32 rows but lost at 128-256, so greedy steps of 32 sentences ran on
MKL. The prepacked copy is made when a layer is put on the measured choice (never, where prepacked never wins),
and costs the layer's weight size again in memory (the plain weight stays: tied embeddings read it, and the
plain and rows libraries use it).

The libraries compute in the weights' format and accumulate in fp32, but in different orders: a layer's output
can differ in the last bits between them, so the choice is made per shape for every process, and within a
process a sentence's result does not depend on its batch beyond those bits (the batch decides the row count).
TFORMER_PREPACK=0 keeps PyTorch's own choice everywhere.

The choices are saved (`saved_path()`: under $TFORMER_CACHE, one file per CPU model and flags, torch version and
rows kernel) and read back by later processes on the same machine, so a model loads without timing anything once
its shapes have been timed (an OPUS-MT-base model: 6 s less), and every process decodes on the same libraries.
Delete the file to time them again. The rows kernel is compiled once per machine into the same cache
(`rows_kernel`); where it cannot be (no C compiler), the other two are timed. A model streamed from memory has its
weights put on huge pages (`huge_pages`).

    prepack(model)    every nn.Linear, and every attention in-projection's parts, on the measured choice
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.files import cache_dir, replace_atomically

log = logging.getLogger("tformer")

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the row counts timed (powers of two): one sentence's greedy step
# up to a beam over a batch
Choice = tuple[str, ...]  # per count of ROWS: the name of the library that ran fastest there
PLAIN: Choice = ("plain",) * len(ROWS)
Key = tuple[int, int, torch.dtype, int, bool]  # (in, out, dtype, threads, timed cold)
_CHOICES: dict[Key, Choice] = {}  # per process, and saved (saved_path)
_READ: set[Path] = set()  # the saved files read into _CHOICES in this process
COLD_ROWS = 8  # up to this row count a product streams its weights from memory in a decoding step
MAX_COPIES = 256


def available() -> bool:
    """oneDNN's prepacked linear can run here (a CPU build with mkldnn), and TFORMER_PREPACK is not 0."""
    return (os.environ.get("TFORMER_PREPACK", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _reorder(weight: Tensor) -> Tensor:
    """The weight in oneDNN's blocked layout; RuntimeError where oneDNN has no kernel for its format here."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


ROWS_SOURCE = Path(__file__).with_name("rows.c")


def _openmp_runtime() -> str | None:
    """The path of the OpenMP runtime this process loaded (PyTorch's), so the rows kernel's threads are PyTorch's
    threads: a second runtime would start threads of its own, competing with them. None where none is seen."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in maps:
        path = line.split(maxsplit=5)[-1]
        if Path(path).name.startswith(("libgomp", "libiomp5", "libomp")):
            return path
    return None


@functools.cache
def rows_kernel() -> dict[torch.dtype, Callable] | None:
    """rows.c's functions per weight format (fp32, bf16), compiled on this machine (`$CC`, else cc; -O3
    -march=native, with PyTorch's OpenMP runtime) into $TFORMER_CACHE/kernels, once per machine and source; None,
    logged, where it cannot be built or loaded."""
    runtime = _openmp_runtime()
    compiler = os.environ.get("CC") or "cc"
    flags = ["-O3", "-march=native", "-shared", "-fPIC"]
    if runtime:
        flags += ["-fopenmp", runtime, f"-Wl,-rpath,{Path(runtime).parent}"]
    source = ROWS_SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *flags, _machine_key()]).encode()).hexdigest()[:16]
    built = cache_dir() / "kernels" / f"rows-{key}.so"
    try:
        if not built.exists():
            if shutil.which(compiler) is None:
                raise OSError(f"no C compiler {compiler!r} on the PATH (set CC)")
            built.parent.mkdir(parents=True, exist_ok=True)
            tmp = built.with_name(f".{built.name}.tmp-{os.getpid()}")
            try:
                subprocess.run([compiler, *flags, str(ROWS_SOURCE), "-o", str(tmp)], check=True, capture_output=True,
                               text=True, timeout=120)
                os.replace(tmp, built)
            finally:
                tmp.unlink(missing_ok=True)
        library = ctypes.CDLL(str(built))
        functions = {torch.float32: library.rows_linear_f32, torch.bfloat16: library.rows_linear_bf16}
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        detail = getattr(e, "stderr", None) or e
        log.info("matmul: the rows kernel is not built (%s); products of few rows run on oneDNN or MKL",
                 str(detail).strip().splitlines()[-1] if str(detail).strip() else type(e).__name__)
        return None
    for function in functions.values():
        function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    functions[torch.float32].restype = None
    functions[torch.bfloat16].restype = ctypes.c_int
    return functions


def _rows_ready(weight: Tensor) -> Tensor:
    """The weight as the rows kernel reads it (contiguous, fp32 or bf16); RuntimeError where it cannot run it
    here."""
    if weight.dtype not in (torch.float32, torch.bfloat16) or weight.device.type != "cpu":
        raise RuntimeError(f"the rows kernel takes fp32 or bf16 weights on the CPU, not {weight.dtype} on "
                           f"{weight.device}")
    if rows_kernel() is None:
        raise RuntimeError("the rows kernel is not built here")
    return weight.contiguous()


def _rows_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (M, K) times the weight (N, K), in the weight's format (bf16: summed in fp32, rounded once at the end)."""
    # (each conversion asked only where needed: a no-op .to is still a dispatch, 1-2 us, and a step has ~40 products)
    if x.dtype != weight.dtype:
        x = x.to(weight.dtype)
    if not x.is_contiguous():
        x = x.contiguous()  # (M, K)
    y = torch.empty(x.shape[0], weight.shape[0], dtype=weight.dtype)  # (M, N)
    if bias is not None and bias.dtype != weight.dtype:
        bias = bias.to(weight.dtype)
    if rows_kernel()[weight.dtype](x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                                   y.data_ptr(), x.shape[0], x.shape[1], weight.shape[0], torch.get_num_threads()):
        raise MemoryError(f"no memory to widen {x.shape[0]} x {x.shape[1]} bf16 rows")
    return y


@dataclasses.dataclass(frozen=True)
class Library:
    """One way to run y = x W^T + b: `ready(W)` is the weight as `run(x, ready, b)` reads it (x 2-d, M rows),
    made once per layer; it raises RuntimeError where this library cannot take the weight's format here. Timed
    up to `most_rows` rows (and so chosen only at counts up to it, and those nearest it)."""

    name: str
    ready: Callable[[Tensor], Tensor]
    run: Callable[[Tensor, Tensor, Tensor | None], Tensor]
    most_rows: int = ROWS[-1]


LIBRARIES = {library.name: library for library in (  # called through the module's names, which tests replace
    Library("plain", lambda w: w, lambda x, w, b: F.linear(x, w, b)),
    Library("prepacked", lambda w: _reorder(w), lambda x, p, b: _packed_linear(x, p, b)),
    Library("rows", lambda w: _rows_ready(w), lambda x, w, b: _rows_linear(x, w, b), most_rows=COLD_ROWS),
)}


def _fastest(calls: dict[str, Callable[[], object]], repeats: int = 5) -> str:
    """The name of the fastest of `calls`: one untimed call of each (first calls create primitives), then
    `repeats` rounds that time each once, in turn; the medians decide. Taking turns, a burst of load from the
    machine's other work slows all alike: timed one after the other, a burst during one library's calls chose
    another for the whole process (a 512 -> 58k product then ran at half speed)."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            tic = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - tic)
    return min(calls, key=lambda name: statistics.median(times[name]))


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


def measure(in_features: int, out_features: int, dtype: torch.dtype, cold: bool = True) -> Choice:
    """Per count of ROWS, the name of the library (LIBRARIES) that ran a product of this shape and format fastest
    on random data, among those that can take it here: "plain" everywhere (PLAIN) where no other can (bf16 on a
    CPU with neither AVX-512 nor AVX-NE-CONVERT, and no rows kernel for it). Cached per process.

    With `cold` (a model whose weights do not fit in the last-level cache), up to COLD_ROWS rows the weights are
    timed cold, as a decoding step reads them: a step of a few sentences streams every layer's weights from memory
    once (an OPUS-MT-base step reads 207 MB, which evicts each layer before its next use), so each timed call
    reads one of enough copies of the weight to fill twice the last-level cache. A model that fits in the cache
    (a d-128 student: 9 MB) is timed warm, as its step reads it. Timed warm (one copy, in cache), a 512 x 512
    layer's libraries came within noise of each other at 1 row and the choice changed from process to process;
    cold, prepacked streamed at about twice MKL's rate on a Zen 4 (benchmarks/row_products.py)."""
    key = (in_features, out_features, dtype, torch.get_num_threads(), cold)
    if key not in _CHOICES:
        g = torch.Generator().manual_seed(0)
        weight = (torch.randn(out_features, in_features, generator=g) * 0.02).to(dtype)
        bias = torch.zeros(out_features, dtype=dtype)
        bytes_ = weight.numel() * weight.element_size()
        n = min(MAX_COPIES, max(1, -(-2 * _last_cache_bytes() // bytes_))) if cold else 1  # copies timed in turn
        weights = [weight] + [weight.clone() for _ in range(n - 1)]
        ready: dict[str, list[Tensor]] = {}
        for library in LIBRARIES.values():
            try:
                ready[library.name] = [library.ready(w) for w in weights]
            except RuntimeError:  # this library cannot take this format here
                pass
        if cold:  # on huge pages, as the model's own weights are (prepack): the plain and rows forms are these
            huge_pages(weights)
        choice = []
        with torch.inference_mode():
            for rows in ROWS:
                x = torch.randn(rows, in_features, generator=g).to(dtype)
                copies = range(n if rows <= COLD_ROWS else 1)

                def timed(library: Library):
                    def call():
                        for i in copies:
                            library.run(x, ready[library.name][i], bias)
                    return call

                calls = {name: timed(LIBRARIES[name]) for name in ready if rows <= LIBRARIES[name].most_rows}
                choice.append(_fastest(calls) if len(calls) > 1 else next(iter(calls)))
        _CHOICES[key] = tuple(choice)
    return _CHOICES[key]


class Product:
    """y = x W^T + b on the measured choice: x of M rows (all dimensions but the last) through the library that
    won at the row count timed nearest to M (`choice`, per count of ROWS). Each library's form of W is made when
    this is made (a prepacked copy at the first product cost a first request 130 ms: an OPUS-MT-base model's
    207 MB reordered), for the libraries the choice names only; a library that cannot take W's format here
    (a choice saved where it could) leaves its counts to F.linear. Inference only: with gradients enabled, or
    traced with a symbolic row count (an export), it is F.linear."""

    def __init__(self, weight: Tensor, bias: Tensor | None, choice: Choice) -> None:
        if len(choice) != len(ROWS) or not set(choice) <= set(LIBRARIES):
            raise ValueError(f"choice {choice!r}: one library of {sorted(LIBRARIES)} per count of ROWS "
                             f"({len(ROWS)}) expected")
        self.weight, self.bias = weight, bias
        self.ready: dict[str, Tensor] = {}
        for name in sorted(set(choice) - {"plain"}):
            try:
                self.ready[name] = LIBRARIES[name].ready(weight.detach())
            except RuntimeError as e:
                log.info("matmul: %s cannot take a %s weight here (%s); F.linear runs its row counts", name,
                         tuple(weight.shape), e)
        self.choice = tuple(name if name in self.ready else "plain" for name in choice)
        self._runs = tuple(None if name == "plain" else LIBRARIES[name].run for name in self.choice)

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        if torch.is_grad_enabled() or not isinstance(rows, int):  # (symbolic rows: traced for export)
            return F.linear(x, self.weight, self.bias)
        i = nearest(rows)
        run = self._runs[i]
        if run is None:
            return F.linear(x, self.weight, self.bias)
        ready = self.ready[self.choice[i]]
        if x.dim() == 2:
            return run(x, ready, self.bias)
        # oneDNN's linear takes 3-d rows at a cost of its own (39 against 25 us for one row of 512 x 512, fp32):
        # given 2-d rows, it is the product alone
        return run(x.reshape(rows, x.shape[-1]), ready, self.bias).view(*x.shape[:-1], self.weight.shape[0])

    @classmethod
    def measured(cls, weight: Tensor, bias: Tensor | None, cold: bool = True) -> "Product":
        out_features, in_features = weight.shape
        return cls(weight.detach(), None if bias is None else bias.detach(),
                   measure(in_features, out_features, weight.dtype, cold))


class MeasuredLinear(nn.Linear):
    """An nn.Linear (the same Parameters: its state dict, and a tied embedding, are unchanged) whose forward
    runs on the measured choice (`Product`)."""

    def __init__(self, linear: nn.Linear, cold: bool = True) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.run = Product.measured(linear.weight, linear.bias, cold)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # Linux's madvise advice (MADV_COLLAPSE: kernel 6.1 and later)


def huge_pages(tensors: list[Tensor]) -> int:
    """Put each tensor's memory (the whole 2 MiB pages inside it) on huge pages now: Linux's madvise
    MADV_HUGEPAGE, then MADV_COLLAPSE. A step that streams its weights from memory then misses the TLB 512 times
    less often: the rows kernel read a 512 -> 58k weight at 34 GB/s against 26 on 4 KiB pages (AMD EPYC Zen 4,
    benchmarks/RESULTS.md). The values do not change. Returns the bytes now on huge pages: 0 off Linux, where the
    kernel refuses (older than 6.1, file-backed memory), or for a tensor with no storage to advise (oneDNN's
    prepacked weights), which changes nothing else."""
    if sys.platform != "linux":
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    done = 0
    for t in tensors:
        try:
            start = t.data_ptr()
        except RuntimeError:  # no storage of its own to advise (oneDNN's prepacked weights): left as it is
            continue
        first, end = -(-start // HUGE_PAGE) * HUGE_PAGE, (start + t.numel() * t.element_size()) // HUGE_PAGE * HUGE_PAGE
        if end > first and madvise(first, end - first, _MADV_HUGEPAGE) == 0 \
                and madvise(first, end - first, _MADV_COLLAPSE) == 0:
            done += end - first
    return done


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
    """The file this machine's choices are saved in: one per CPU (its model name and flags), torch version and
    rows kernel (rows.c: a new one is timed anew)."""
    kernel = hashlib.sha256(ROWS_SOURCE.read_bytes()).hexdigest()[:8]
    return cache_dir() / "matmul" / f"choices-{_machine_key()}-{kernel}.json"


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
    for name, choice in items:
        try:
            i, o, dtype, threads, cold = name.split(",")
            key = (int(i), int(o), getattr(torch, dtype), int(threads), {"cold": True, "warm": False}[cold])
        except (ValueError, AttributeError, KeyError):
            continue
        if (isinstance(key[2], torch.dtype) and isinstance(choice, list) and len(choice) == len(ROWS)
                and all(isinstance(c, str) and c in LIBRARIES for c in choice)):
            _CHOICES.setdefault(key, tuple(choice))


def _save(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replace_atomically(path) as f:
            json.dump({_name(k): list(c) for k, c in sorted(_CHOICES.items(), key=lambda kw: _name(kw[0]))}, f)
    except OSError as e:  # a cache: decoding goes on, and the next process times again
        log.warning("matmul: could not save the product libraries' choices to %s (%s)", path, e)


def prepack(model: nn.Module) -> nn.Module:
    """Put every nn.Linear of `model` (on the CPU, in eval mode, its weights in their final format) and every
    attention's in-projection parts on the measured choice, in place; nothing where `available()` is False.
    Returns the model. A module with linear products of its own (MultiHeadAttention's in-projection parts) does
    them in its `prepack(cold)` method. The products are timed cold (`measure`) when the model's linear weights
    do not fit in the last-level cache, and then those weights are put on huge pages (`huge_pages`). Choices saved
    by an earlier process on this machine are used, and new ones saved (`saved_path`)."""
    if not available() or next(model.parameters()).device.type != "cpu":
        return model
    path = saved_path()
    if path not in _READ:
        _READ.add(path)
        _read_saved(path)
    known, tic = len(_CHOICES), time.perf_counter()
    linears = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    cold = sum(w.numel() * w.element_size() for w in linears.values()) > _last_cache_bytes()
    if cold:  # streamed from memory at every step of a few sentences
        tic = time.perf_counter()
        on_huge = huge_pages([w.detach() for w in linears.values()])
        log.info("matmul: %.0f MB of weights on huge pages in %.2f s", on_huge / 1e6, time.perf_counter() - tic)
    for module in list(model.modules()):
        if callable(getattr(module, "prepack", None)):
            module.prepack(cold)
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, MeasuredLinear(child, cold))
    if len(_CHOICES) > known:
        log.info("matmul: timed the product libraries for %d shapes in %.1f s; saved to %s", len(_CHOICES) - known,
                 time.perf_counter() - tic, path)
        _save(path)
    return model
