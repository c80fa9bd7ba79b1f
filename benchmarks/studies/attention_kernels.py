"""SDPA against the dense kernel (two matmuls and a softmax) on this CPU, forward only, for the shapes a
decoding step and a training batch give: why `sdpa_attention` hands fewer than SDPA_CPU_MIN_QUERIES queries
to the dense kernel over many rows x heads (SDPA_CPU_DENSE_HEAD_ROWS), and SDPA over few.

    python benchmarks/studies/attention_kernels.py [--heads 4] [--dtype fp32|bf16] [--record]

Rows: hypotheses/sentences x 4 heads x queries x keys x 64 dims, half of them with a padding mask. Each
shape is timed in alternating rounds (median of 7); the ratio is sdpa time / dense time (> 1: dense faster).
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

from tformer.attention.kernels import SDPA_CPU_DENSE_HEAD_ROWS, SDPA_CPU_MIN_QUERIES, dense_attention  # noqa: E402

SHAPES = [  # (what, rows, queries, keys)
    ("greedy step, self", 64, 1, 16), ("greedy step, cross", 64, 1, 16),
    ("beam 5 step, self", 320, 1, 16), ("beam 5 step, cross (beams folded)", 64, 5, 16),
    ("batch 1 step, self", 1, 1, 24), ("batch 4 step, self", 4, 1, 24), ("batch 8 step, self", 8, 1, 24),
    ("batch 16 step, self", 16, 1, 24), ("batch 32 step, self", 32, 1, 24),
    ("batch 1 step, cross", 1, 1, 16), ("batch 8 step, cross", 8, 1, 16), ("batch 8 beam 4, cross", 8, 4, 16),
    ("batch 32 beam 4, cross", 32, 4, 16),
    ("beam 5 step, self, long output", 320, 1, 64), ("beam 5 step, cross, long source", 64, 5, 64),
    ("8 queries", 64, 8, 32), ("training, 16 tokens", 256, 16, 16), ("training, 32 tokens", 128, 32, 32),
    ("training, 64 tokens", 64, 64, 64),
]


def timed(fn, reps: int) -> float:
    tic = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - tic) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    table = ["| shape | rows x queries x keys | mask | SDPA us | dense us | SDPA / dense |", "|---|---|---|---:|---:|---:|"]
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for what, n, tq, tk in SHAPES:
            dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
            q, k, v = (torch.randn(n, args.heads, t, 64, generator=g).to(dtype) for t in (tq, tk, tk))
            lengths = torch.randint(max(1, tk // 2), tk + 1, (n,), generator=g)
            for mask in (None, (torch.arange(tk) < lengths[:, None])[:, None, None, :]):
                sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
                dense = lambda: dense_attention(q, k, v, mask=mask)  # noqa: E731
                reps = max(3, int(2e6 // (n * tq * tk * 4 * 64 // 64 + 1)))
                timed(sdpa, 3), timed(dense, 3)
                a, b = [], []
                for _ in range(args.rounds):
                    a.append(timed(sdpa, reps))
                    b.append(timed(dense, reps))
                ratio = statistics.median(x / y for x, y in zip(a, b))
                table.append(f"| {what} | {n} x {tq} x {tk} | {'padding' if mask is not None else 'none'} | "
                             f"{statistics.median(a) * 1e6:,.0f} | {statistics.median(b) * 1e6:,.0f} | {ratio:.2f} |")
    notes = (f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.heads} heads x 64 dims, "
             f"{args.dtype}, forward only; `sdpa_attention` uses the dense kernel on a CPU below "
             f"{SDPA_CPU_MIN_QUERIES} queries over {SDPA_CPU_DENSE_HEAD_ROWS} rows x heads or more")
    report("Attention kernels: SDPA vs dense on this CPU", table, notes, args.record)


if __name__ == "__main__":
    main()
