"""tformer ponder: a universal transformer's ACT steps on a split, over training, and for one sentence."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("ponder", help="a universal transformer's ACT steps: histogram, curve, step map",
                        description="For a model.kind=universal checkpoint: the steps each position takes on "
                        "a split (histogram and shares), mean ponder over training (from the run's "
                        "metrics.jsonl) and, with --sentence (or --audio for a speech model), a per-position step map "
                        "of its translation.")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    sp.add_argument("--split", default="test", choices=("train", "valid", "test"))
    source = sp.add_mutually_exclusive_group()
    source.add_argument("--sentence", help="a source sentence to decode and map, step by step")
    source.add_argument("--audio", help="a speech model's input (16 kHz wav/flac/ogg or .npy frames) to decode and "
                        "map, its model frames labelled by the time they start at")
    sp.add_argument("--out", required=True, help="folder for the pictures")
    sp.set_defaults(func=run, overrides=[])


def run(args: argparse.Namespace) -> int:
    from tformer.errors import ConfigError, DataError
    from tformer.evaluation import ponder_steps
    from tformer.viz.ponder import plot_ponder_curve, plot_step_histogram, plot_step_map

    translator = common.load_translator(args)
    cfg = translator.config
    if cfg.model.kind != "universal":
        raise ConfigError(f"{args.checkpoint} is a {cfg.model.kind} transformer; pondering needs "
                          "model.kind=universal")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    max_steps = cfg.model.max_steps
    data = translator.load_split(args.split)
    src_steps, tgt_steps = ponder_steps(translator.model, data.examples[args.split])
    plot_step_histogram(src_steps, tgt_steps, max_steps, out / "steps_histogram.png")
    for name, steps in (("source", src_steps), ("target", tgt_steps)):
        counts = Counter(x for row in steps for x in row)
        total = sum(counts.values())
        share = "  ".join(f"{k}:{counts[k] / total:.1%}" for k in range(1, max_steps + 1))
        print(f"{name} positions ({args.split}, {total}): mean {sum(k * c for k, c in counts.items()) / total:.2f} "
              f"steps;  {share}")
    written = ["steps_histogram.png"]
    run_dir = Path(args.checkpoint)
    for metrics in (run_dir / "metrics.jsonl", run_dir.parent.parent / "metrics.jsonl"):
        if metrics.exists():
            plot_ponder_curve(metrics, out / "ponder_curve.png")
            written.append("ponder_curve.png")
            break
    if args.sentence is not None or args.audio is not None:
        if translator.reads_frames != (args.audio is not None):
            raise DataError(f"{args.checkpoint} reads " + ("speech: give --audio FILE" if translator.reads_frames
                                                           else "text: give --sentence"))
        if args.sentence is not None and not args.sentence.strip():
            raise DataError("--sentence is empty")
        translation = translator.translate([args.audio or args.sentence], return_attention=True)[0]
        s_steps, t_steps = translation.attention.steps
        source = translation.attention.source if args.audio else translation.source_tokens + ["</s>"]
        plot_step_map(source, ["<s>"] + translation.tokens, s_steps, t_steps, max_steps, out / "step_map.png")
        written.append("step_map.png")
        print(f"output: {translation.text}\nsteps per source token: {s_steps}\nsteps per target token: {t_steps}")
    print(f"wrote {', '.join(str(out / w) for w in written)}")
    return 0
