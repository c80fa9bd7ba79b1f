"""tformer plot: a run's training curves (loss, validation score, learning rate, tokens/s) as PNG and SVG."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    sp = sub.add_parser("plot", help="training curves of a run: loss, validation score, learning rate, tokens/s",
                        description="Draw the run's metrics.jsonl as one figure (PNG and SVG): train and "
                        "validation loss, validation BLEU/chrF, exact match or CER/WER, the learning rate, "
                        "tokens per second and, for universal transformers, the mean ACT steps. Works on a "
                        "run that is still training. For TensorBoard, train with train.tensorboard=true.")
    sp.add_argument("run_dir", metavar="RUN_DIR", help="run folder")
    sp.add_argument("--out", help="folder for curves.png / curves.svg (default: RUN_DIR/plots)")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.viz.curves import plot_curves

    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "plots"
    _, panels = plot_curves(run_dir, out / "curves")
    print(f"wrote {out / 'curves.png'} and {out / 'curves.svg'}: {', '.join(panels)}")
    return 0
