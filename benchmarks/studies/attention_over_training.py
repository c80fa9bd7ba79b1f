"""The copy task's attention over training: does the decoder learn to look at the matching source token?

    python benchmarks/studies/attention_over_training.py --run-dir runs/copy-attention [--figures docs/figures] [--record]

Trains the copy recipe with train.attention_examples=2 into --run-dir (unless it already holds a finished
run), then reads the recorded attention and prints, for every evaluation, the validation exact match and the
share of the cross-attention (mean over heads and the two recorded examples) that a target position puts on
the source token it copies (position i produces y_i = x_i, so the matching key is source position i).
With --figures it writes the README's animation (one head, and the head grid) there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import append_results  # noqa: E402

from tformer.config import load_config  # noqa: E402
from tformer.recipes import find_recipe  # noqa: E402
from tformer.training.loop import train  # noqa: E402
from tformer.viz.record import animate_attention, animate_head_grid, load_recording  # noqa: E402


def matching_mass(w: np.ndarray) -> float:
    """w (H, T, S) cross-attention of a copy pair (T = S: n tokens + </s>): mean weight on key i for query i."""
    n = min(w.shape[1], w.shape[2])
    return float(np.mean([w[:, i, i].mean() for i in range(n)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/copy-attention")
    ap.add_argument("--figures", help="write the README's GIFs into this folder")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    run = Path(args.run_dir)
    if not (run / "checkpoints" / "latest").exists():
        cfg = load_config(find_recipe("copy"), ["train.attention_examples=2"])
        train(cfg, run)
    rec = load_recording(run)
    valid = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "valid"}
    layer = rec.maps[0][0].layers("cross") - 1
    table = ["| step | validation exact match | cross-attention on the matching source token (last layer, mean of "
             "heads) |", "|---:|---:|---:|"]
    for step, frame in zip(rec.steps, rec.maps):
        mass = np.mean([matching_mass(m.weights["cross"][layer]) for m in frame])
        em = valid.get(step, {}).get("exact_match")
        table.append(f"| {step} | {'-' if em is None else f'{em:.3f}'} | {mass:.3f} |")
    print("\n".join(table))
    if args.figures:
        out = Path(args.figures)
        print(animate_attention(rec, 0, "cross", layer, 0, out / "copy_cross_attention.gif", ms_per_frame=350, dpi=70))
        print(animate_head_grid(rec, 0, "cross", layer, out / "copy_cross_attention_heads.gif", ms_per_frame=350,
                                dpi=55))
    notes = (f"the copy recipe (1+1 layers, 4 heads, d=128), validation examples 0 and 1 recorded at every "
             f"evaluation ({len(rec.steps)} recordings, step 0 = untrained). A uniform spread over the ~15 source "
             "tokens would put ~0.07 on each.")
    print(notes)
    if args.record:
        append_results("Copy task: attention over training", "\n".join(table), notes)


if __name__ == "__main__":
    main()
