"""Products of 1-8 rows against the machine's read bandwidth: which library and weight format streams a decoding
step's weights fastest (issue 64).

A decoding step of one sentence multiplies a few rows by every weight of the decoder once: it reads them all,
and is bound by how fast memory gives them. Here the weights of an OPUS-MT-base-shaped step (d 512, 6 decoder
layers, a 58k output: 207 MB in fp32) are multiplied in the step's order, one pass after another, so each
weight comes cold from memory, by each candidate:

    mkl fp32        F.linear on the plain fp32 weight (PyTorch sends it to MKL)
    onednn fp32     oneDNN's linear on the weight reordered once (what tformer.model.matmul calls prepacked)
    mv fp32         torch.mv, one row only
    onednn bf16     prepacked bf16 weights and rows (half the bytes; CPUs with bf16 units run it natively)
    int8 weights    torch._weight_int8pack_mm: int8 weights with a scale per output, bf16 rows (a quarter)
    rows fp32       tformer's rows kernel (tformer/model/rows.c, compiled on this machine), plain fp32 weights
    rows bf16       the same on bf16 weights and rows

Each candidate's rate is its weights' bytes (in its own format) over the time of a pass, against the read
bandwidth measured in the same run (common.read_bandwidth, the same thread count). Candidates take turns,
round after round.

    python benchmarks/studies/row_products.py [--rows 1 2 4 8] [--rounds 5] [--threads 2] [--record]
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
from common import read_bandwidth, report  # noqa: E402

D, FFN, LAYERS, VOCAB = 512, 2048, 6, 58102


def step_shapes() -> list[tuple[int, int]]:
    """(in, out) of every product of a decoding step, in its order: per layer the self-attention's fused q/k/v
    and its output, the cross-attention's query and output, the two feed-forward layers; then the generator."""
    layer = [(D, 3 * D), (D, D), (D, D), (D, D), (D, FFN), (FFN, D)]
    return layer * LAYERS + [(D, VOCAB)]


def candidates(weights: list[torch.Tensor]) -> dict[str, tuple[list, int, torch.dtype]]:
    """Each candidate: (one callable per product taking the rows, its weights' bytes, the rows' dtype)."""
    out: dict[str, tuple[list, int, torch.dtype]] = {}
    fp32_bytes = sum(w.numel() * 4 for w in weights)
    out["mkl fp32"] = ([lambda x, w=w: F.linear(x, w) for w in weights], fp32_bytes, torch.float32)
    out["mv fp32"] = ([lambda x, w=w: torch.mv(w, x[0])[None] for w in weights], fp32_bytes, torch.float32)
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        def packed(dtype):
            ws = [torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), None) for w in weights]
            return [lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in ws]

        out["onednn fp32"] = (packed(torch.float32), fp32_bytes, torch.float32)
        try:
            out["onednn bf16"] = (packed(torch.bfloat16), fp32_bytes // 2, torch.bfloat16)
        except RuntimeError:  # no bf16 kernel here
            pass
    from tformer.model import matmul

    if matmul.rows_kernel() is not None:
        for dtype in (torch.float32, torch.bfloat16):
            ws = [w.to(dtype) for w in weights]
            out[f"rows {str(dtype).removeprefix('torch.').replace('float32', 'fp32').replace('bfloat16', 'bf16')}"] = (
                [lambda x, w=w: matmul._rows_linear(x, w, None) for w in ws], fp32_bytes // (4 // ws[0].element_size()),
                dtype)
    if hasattr(torch, "_weight_int8pack_mm"):
        int8 = []
        for w in weights:
            scale = w.abs().amax(1).clamp(min=1e-8) / 127  # (out,)
            q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
            int8.append((q, scale.to(torch.bfloat16)))
        out["int8 weights"] = ([lambda x, q=q, s=s: torch._weight_int8pack_mm(x, q, s) for q, s in int8],
                               sum(q.numel() + 2 * s.numel() for q, s in int8), torch.bfloat16)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) / i ** 0.5 for i, o in step_shapes()]  # (out, in), as nn.Linear's
    cands = candidates(weights)
    bandwidth = read_bandwidth(args.threads)
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for r in range(args.rounds + 1):  # round 0 warms up, untimed
            names = list(cands)[r % len(cands):] + list(cands)[: r % len(cands)]
            for name in names:
                fns, _, dtype = cands[name]
                for m in args.rows:
                    if name == "mv fp32" and m != 1:
                        continue
                    xs = {d: torch.randn(m, d, generator=g).to(dtype) for d in (D, FFN)}
                    tic = time.perf_counter()
                    for fn, (i, _) in zip(fns, step_shapes()):
                        fn(xs[i])
                    if r:
                        times.setdefault((name, m), []).append(time.perf_counter() - tic)
    table = ["| rows | candidate | ms per pass | weights (MB) | streamed (GB/s) | of the read bandwidth | vs mkl fp32 |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for m in args.rows:
        base = statistics.median(times[("mkl fp32", m)])
        for name, (_, size, _) in cands.items():
            if (name, m) not in times:
                continue
            t = statistics.median(times[(name, m)])
            rate = size / t / 1e9
            table.append(f"| {m} | {name} | {t * 1000:.2f} | {size / 1e6:.0f} | {rate:.1f} | {rate / bandwidth:.0%} | "
                         f"{base / t:.2f}x |")
    notes = (f"The {len(weights)} products of an OPUS-MT-base-shaped decoding step (d {D}, {LAYERS} decoder layers, "
             f"vocabulary {VOCAB}), one pass after another so each weight is read cold; median of {args.rounds} "
             f"rounds taking turns; {args.threads} threads; read bandwidth {bandwidth:.1f} GB/s (common.read_bandwidth, "
             f"{args.threads} threads, this run). \"vs mkl fp32\": speed against F.linear on fp32 weights.")
    report("Products of 1-8 rows against the read bandwidth", table, notes, args.record)


if __name__ == "__main__":
    main()
