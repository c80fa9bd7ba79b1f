"""tformer demo: train the copy task, then show its test accuracy and a few decoded examples."""

from __future__ import annotations

import argparse

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("demo", help="train the copy task and show what it learned (a few minutes on a CPU)")
    sp.add_argument("--run-dir", help="run folder (default: a new folder under runs/)")
    sp.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides of the copy recipe")
    common.progress(sp)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from tformer.api import load, train
    from tformer.recipes import find_recipe

    recipe = find_recipe("copy")
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"demo-copy-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"training the copy task ({recipe}) into {run_dir} ...", flush=True)
    result = train(recipe, run_dir, overrides=args.overrides, progress=args.progress)
    translator = load(run_dir, device="cpu")
    test, uniform = translator.evaluate("test"), translator.evaluate("test_uniform")
    m, u = test.metrics, uniform.metrics
    low, high = translator.config.data.min_len, translator.config.data.max_len
    print(f"\ntrained {result.step} steps in {result.elapsed:.0f}s; best checkpoint {translator.path}")
    print(f"test ({m['n']} sequences, DGL's lengths): exact match {m['exact_match']:.4f} (free-running greedy), "
          f"token accuracy {m['token_acc']:.4f} (teacher-forced)")
    print(f"test_uniform ({u['n']} sequences, every length {low}-{high} alike): exact match {u['exact_match']:.4f}")
    common.show_examples(test.sources, test.references, test.outputs, 5)
    print(f"\nnext: tformer translate --checkpoint {run_dir}   (type a line of letters, e.g. 'h e l l o')")
    print(f"      tformer animate {run_dir}   (GIFs of the attention over training)   tformer plot {run_dir}")
    print(f"      tformer explore --checkpoint {run_dir}   (a local page: translations and attention)")
    return 130 if result.interrupted else 0
