"""What TUPE's positional bias costs in one self-attention call (forward + backward), per kernel.

    python benchmarks/studies/tupe_kernels.py [--rounds 7] [--record]

A batch of sentences with Multi30k-like lengths (Normal(14, 5) clipped to 3..40, 3000 tokens padded), 4 heads
of 64. Kernels: dense and sdpa on the padded batch (bias (1, H, L, L) broadcast), the graph kernel on the
packed batch with the bias as a PositionBias (segments: one slice per sentence shape; blocks and edges: one
value gathered per edge). Every case runs with and without the bias; the cases take turns within each
round, and the table reports medians. Ratios are against dense without bias.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import append_results  # noqa: E402

from tformer.attention.graph import graph_attention  # noqa: E402
from tformer.attention.kernels import dense_attention, sdpa_attention  # noqa: E402
from tformer.masks import PositionBias, padding_mask, self_graph  # noqa: E402
from tformer.structures import FULL  # noqa: E402


def batch_lengths(budget: int = 3000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while True:
        n = int((torch.randn(1, generator=g) * 5 + 14).clamp(3, 40))
        if max(lengths + [n]) * (len(lengths) + 1) > budget:
            return torch.tensor(sorted(lengths))
        lengths.append(n)


def cases(lengths: torch.Tensor, H: int = 4, Dh: int = 64):
    B, L = len(lengths), int(lengths.max())
    real = padding_mask(lengths)
    mask = real[:, None, None, :]
    table = torch.randn(H, L, L, requires_grad=True)
    padded = [torch.randn(B, H, L, Dh, requires_grad=True) for _ in range(3)]
    packed = [torch.randn(1, H, int(lengths.sum()), Dh, requires_grad=True) for _ in range(3)]

    def run_padded(kernel, bias):
        def f():
            out, _ = kernel(*padded, mask, table[None] if bias else None)
            out.sum().backward()
        return f

    def run_graph(method, bias):
        def f():
            graph = self_graph(lengths, FULL, causal=False)  # built per call, as in a forward
            out, _ = graph_attention(*packed, graph, PositionBias(table) if bias else None, method=method)
            out.sum().backward()
        return f

    out = {}
    for bias in (False, True):
        tag = "+ bias" if bias else "no bias"
        out[f"dense, {tag}"] = run_padded(dense_attention, bias)
        out[f"sdpa, {tag}"] = run_padded(sdpa_attention, bias)
        for method in ("segments", "blocks", "edges"):
            out[f"graph {method}, {tag}"] = run_graph(method, bias)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    lengths = batch_lengths()
    fns = cases(lengths)
    for f in fns.values():  # warm up
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, f in fns.items():
            tic = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - tic)
    base = statistics.median(times["dense, no bias"])
    rows = ["| kernel | bias | ms (median) | vs dense without bias | bias costs |", "|---|---|---|---|---|"]
    for name, ts in times.items():
        kernel, tag = name.split(", ")
        med = statistics.median(ts)
        plain = statistics.median(times[f"{kernel}, no bias"])
        rows.append(f"| {kernel} | {tag} | {1000 * med:.1f} | {med / base:.2f}x | "
                    + (f"{med / plain:.2f}x |" if tag == "+ bias" else "- |"))
    table = "\n".join(rows)
    print(f"{len(lengths)} sentences, {int(lengths.sum())} tokens, longest {int(lengths.max())}\n\n{table}")
    if args.record:
        append_results("TUPE bias per kernel: one self-attention call, forward + backward", table,
                       f"{len(lengths)} sentences of Multi30k-like lengths ({int(lengths.sum())} tokens, longest "
                       f"{int(lengths.max())}; {len(lengths) * int(lengths.max())} padded), 4 heads of 64, "
                       f"{args.rounds} rounds, cases taking turns; graph cases include building the graph.")


if __name__ == "__main__":
    main()
