"""Would fp32 training gain from oneDNN's prepacked products on this CPU? Training's shapes, forward and backward.

    python benchmarks/training_matmul.py [--rows 1024 4096] [--repeats 5]

Inference packs each weight once (tformer.model.matmul); training changes the weights at every update, so a
packed forward pays the reorder once per update. Per shape (the small and base models of
benchmarks/train_throughput.py: projections, FFN, an 8,000-entry generator) and per row count (tokens in a
batch), this times, one product each, median of --repeats after a warm-up:
    forward   F.linear (what training runs: MKL here)  against  reorder + oneDNN prepacked (`_linear_pointwise`)
    backward  dX = dY W and dW = dY^T X with torch.mm (what autograd runs); no static weight to pack in dW
and prints the forward ratio, with and without the reorder, and the share of the three products' time the
forward is (the most a faster forward could save).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tformer.model.matmul import _packed_linear, _reorder, _seconds, available

SHAPES = {"small": [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)],
          "base": [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 8000)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not available():
        raise SystemExit("no oneDNN prepacked linear in this PyTorch build")
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| model | in -> out | rows | F.linear fwd (ms) | prepacked fwd (ms) | reorder (ms) | fwd ratio | "
          "fwd ratio with reorder | dX + dW (ms) | forward's share of fwd+bwd |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for model, shapes in SHAPES.items():
        for d_in, d_out in shapes:
            w = torch.randn(d_out, d_in, generator=g) * 0.02
            b = torch.zeros(d_out)
            for rows in args.rows:
                x = torch.randn(rows, d_in, generator=g)
                dy = torch.randn(rows, d_out, generator=g)
                with torch.no_grad():
                    plain = _seconds(lambda: F.linear(x, w, b), args.repeats)
                    packed_w = _reorder(w)
                    packed = _seconds(lambda: _packed_linear(x, packed_w, b), args.repeats)
                    reorder = _seconds(lambda: _reorder(w), args.repeats)
                    backward = _seconds(lambda: (torch.mm(dy, w), torch.mm(dy.t(), x)), args.repeats)
                print(f"| {model} | {d_in} -> {d_out} | {rows} | {1e3 * plain:.2f} | {1e3 * packed:.2f} | "
                      f"{1e3 * reorder:.2f} | {plain / packed:.2f}x | {plain / (packed + reorder):.2f}x | "
                      f"{1e3 * backward:.2f} | {100 * plain / (plain + backward):.0f}% |")


if __name__ == "__main__":
    main()
