"""How much faster a bf16 matrix product runs than an fp32 one on this CPU: the figure tformer.precision and the
docs quote for a CPU's bf16 units.

    python benchmarks/studies/matmul_formats.py [--threads 1] [--rows 1 32 256] [--record]

Times y = x W^T (F.linear, PyTorch's choice of library, and oneDNN with the weight prepacked, as
tformer.model.matmul runs inference) in fp32 and bf16 for the layer shapes of a base Transformer (512 -> 512,
512 -> 2048, 2048 -> 512, 512 -> 32000) and a 1024 x 1024 square, at a few row counts; the median of 9 rounds
that take turns. Also prints which kernels this process dispatches to (torch's CPU capability), and the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import report  # noqa: E402

SHAPES = [(512, 512), (512, 2048), (2048, 512), (512, 32000), (1024, 1024)]


def cpu_name() -> str:
    model, family, number = "", "", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        model = model or (value if key == "model name" else "")
        family = family or (value if key == "cpu family" else "")
        number = number or (value if key == "model" else "")
    return f"{model} (family {family}, model {number})"


def timed(fns: dict, rounds: int = 9) -> dict:
    """The median seconds of each of `fns`, the calls taking turns round by round (after one untimed call
    each), so that a burst of the machine's other work falls on all of them alike."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            tic = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - tic)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tformer.model import matmul

    rows_out = []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for n_in, n_out in SHAPES:
            w32 = torch.randn(n_out, n_in, generator=g) * 0.02
            w16 = w32.bfloat16()
            packed = {}
            for name, w in (("fp32", w32), ("bf16", w16)):
                try:
                    packed[name] = matmul._reorder(w)
                except RuntimeError:
                    packed[name] = None
            for rows in args.rows:
                x32 = torch.randn(rows, n_in, generator=g)
                x16 = x32.bfloat16()
                fns = {"fp32": lambda: F.linear(x32, w32), "bf16": lambda: F.linear(x16, w16)}
                for name, x in (("fp32", x32), ("bf16", x16)):
                    if packed[name] is not None:
                        fns[f"{name} prepacked"] = (lambda x=x, p=packed[name]: matmul._packed_linear(x, p, None))
                t = timed(fns)
                best32 = min(v for k, v in t.items() if k.startswith("fp32"))
                best16 = min(v for k, v in t.items() if k.startswith("bf16"))
                rows_out.append([f"{n_in} -> {n_out}", rows, f"{t['fp32'] * 1e3:.3f}", f"{t['bf16'] * 1e3:.3f}",
                                 f"{t['fp32'] / t['bf16']:.2f}x",
                                 f"{t['fp32 prepacked'] * 1e3:.3f}" if "fp32 prepacked" in t else "-",
                                 f"{t['bf16 prepacked'] * 1e3:.3f}" if "bf16 prepacked" in t else "-",
                                 f"{best32 / best16:.2f}x"])
    header = ["product", "rows", "fp32 ms", "bf16 ms", "bf16 speed-up (F.linear)", "fp32 prepacked ms",
              "bf16 prepacked ms", "bf16 speed-up (best of each)"]
    note = (f"CPU: {cpu_name()}; torch {torch.__version__} dispatches to its "
            f"{torch.backends.cpu.get_cpu_capability()} kernels; {args.threads} thread(s); median of 9 rounds.")
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    table += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows_out]
    report("Matrix products: bf16 against fp32 on this CPU", table, note, args.record)

if __name__ == "__main__":
    main()
