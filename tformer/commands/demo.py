"""tformer demo: train the copy task, then show its test accuracy and a few decoded examples."""

from __future__ import annotations

import argparse

from tformer.commands import common

USUAL_UPDATES = (1000, 2000)  # where runs of the shipped recipe (seeds 1-5) reached 100% (benchmarks/RESULTS.md)


def add_parser(sub) -> None:
    sp = sub.add_parser("demo", help="train the copy task and show what it learned (a few minutes on a CPU)")
    sp.add_argument("--run-dir", help="run folder (default: a new folder under runs/)")
    sp.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides of the copy recipe")
    common.progress(sp)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from tformer.api import load
    from tformer.recipes import find_recipe
    from tformer.training.start import train, train_config

    recipe = find_recipe("copy")
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"demo-copy-{time.strftime('%Y%m%d-%H%M%S')}"
    t = train_config(recipe, overrides=args.overrides).train
    print(f"training the copy task ({recipe}) into {run_dir}: {plan(t, usual=not args.overrides)} ...", flush=True)
    result = train(recipe, run_dir, overrides=args.overrides, progress=args.progress)
    translator = load(run_dir, device="cpu")
    test, uniform = translator.evaluate("test"), translator.evaluate("test_uniform")
    m, u = test.metrics, uniform.metrics
    low, high = translator.config.data.min_len, translator.config.data.max_len
    print(f"\ntrained {result.step} steps in {result.elapsed:.0f}s; best checkpoint {translator.path}")
    if result.shortfall:
        print(f"SHORT OF THE TARGET: {result.shortfall}\n(the scores below are of a model still learning)")
    print(f"test ({m['n']} sequences, DGL's lengths): exact match {m['exact_match']:.4f} (free-running greedy), "
          f"token accuracy {m['token_acc']:.4f} (teacher-forced)")
    print(f"test_uniform ({u['n']} sequences, every length {low}-{high} alike): exact match {u['exact_match']:.4f}")
    common.show_examples(test.sources, test.references, test.outputs, 5)
    if result.shortfall:
        print(f"\nshort of the target (validation exact match {train_score(result)}, the target "
              f"{t.target_exact_match:g}): see above for the limit that stopped it and how to train on")
    print(f"\nnext: tformer translate --checkpoint {run_dir}   (type a line of letters, e.g. 'h e l l o')")
    print(f"      tformer animate {run_dir}   (GIFs of the attention over training)   tformer plot {run_dir}")
    print(f"      tformer explore --checkpoint {run_dir}   (a local page: translations and attention)")
    return 130 if result.interrupted else 0


def plan(t, usual: bool) -> str:
    """What ends the demo's training (`t`: its TrainConfig), and how long the recipe as shipped usually takes."""
    limits = [f"{t.max_steps:,} updates (train.max_steps)" if t.max_steps else f"{t.epochs} epochs (train.epochs)"]
    if t.max_hours:
        limits.append(f"{t.max_hours:g} hours (train.max_hours)")
    text = f"at most {' or '.join(limits)}"
    if t.target_exact_match:
        text = f"until validation is {t.target_exact_match:.0%} exact, {text}"
    if usual:
        text += f" (runs of this recipe got there in {USUAL_UPDATES[0]:,}-{USUAL_UPDATES[1]:,} updates)"
    return text


def train_score(result) -> str:
    best = result.best or {}
    return f"{best['exact_match']:.4f}" if "exact_match" in best else "not measured"
