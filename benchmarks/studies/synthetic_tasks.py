"""Copy and sort: train a recipe, then report free-running whole-sequence exact match on the test split.

    python benchmarks/studies/synthetic_tasks.py copy sort sort_universal [--generalise] [--record]
        [--overrides section.key=value ...] [--from-run RUN_DIR ...]

For each recipe: `tformer train --config RECIPE` into runs/bench-RECIPE (or, with --from-run, one run folder
per recipe that `tformer train --config RECIPE` already trained), then the best checkpoint (chosen on
validation) is evaluated on test (DGL's split, Normal(15, 3) lengths) and on test_uniform (every length in
[min_len, max_len] alike). The table reports the wall time of training (evaluations included), the step and
time at which validation first reached its best, test metrics, and for a universal transformer the mean ACT
steps per position on test and their distribution.

--generalise trains on lengths up to 20 (data.max_len=20) and also tests on 1000 sequences of lengths 21-40
(lengths ~ Normal(30, 5) clipped, another seed): length generalisation, into runs/bench-RECIPE-gen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from collections import Counter
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import HERE, append_results  # noqa: E402

from tformer.config import load_config  # noqa: E402
from tformer.data import load_task  # noqa: E402
from tformer.evaluation import evaluate, ponder_steps  # noqa: E402
from tformer.inference import load_model  # noqa: E402
from tformer.recipes import find_recipe  # noqa: E402
from tformer.training.loop import train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="+", choices=("copy", "sort", "copy_universal", "sort_universal"))
    ap.add_argument("--generalise", action="store_true", help="train on lengths <= 20, test also on 21-40")
    ap.add_argument("--overrides", nargs="*", default=[], metavar="section.key=value")
    ap.add_argument("--from-run", nargs="*", type=Path, default=[], metavar="RUN_DIR",
                    help="evaluate these run folders (one per recipe, in order) instead of training")
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    if args.from_run and len(args.from_run) != len(args.tasks):
        ap.error(f"--from-run names {len(args.from_run)} run folders for {len(args.tasks)} recipes")
    rows = ["| recipe | steps | train wall time | valid exact match (best) | best reached at | test exact match "
            "| test_uniform exact match | test token acc |" + (" test 21-40 exact match |" if args.generalise else "")
            + " ACT steps on test |",
            "|---|---|---|---|---|---|---|---|" + ("---|" if args.generalise else "") + "---|"]
    for i, task in enumerate(args.tasks):
        if args.from_run:
            run_dir = args.from_run[i]
        else:
            overrides = list(args.overrides) + (["data.max_len=20"] if args.generalise else [])
            cfg = load_config(find_recipe(task), overrides)
            run_dir = HERE.parent / "runs" / (f"bench-{task}-gen" if args.generalise else f"bench-{task}")
            shutil.rmtree(run_dir, ignore_errors=True)
            train(cfg, run_dir)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        steps, elapsed = max(r["step"] for r in records), max(r["elapsed"] for r in records)
        valid = [r for r in records if r["kind"] == "valid"]
        best = max(valid, key=lambda r: (r["exact_match"], -r["loss"]))
        first_best = next(r for r in valid if r["exact_match"] == best["exact_match"])
        ckpt, model = load_model(run_dir, which="best")
        data = load_task(ckpt.cfg.data, ("test", "test_uniform"), tokenizers=ckpt.tokenizers)
        test, _ = evaluate(model, data.examples["test"], ckpt.cfg)
        uniform, _ = evaluate(model, data.examples["test_uniform"], ckpt.cfg)
        row = (f"| {task} | {steps} | {elapsed:.0f} s | {best['exact_match']:.4f} | step "
               f"{first_best['step']}, {first_best['elapsed']:.0f} s | **{test['exact_match']:.4f}** | "
               f"**{uniform['exact_match']:.4f}** | {test['token_acc']:.4f} |")
        if args.generalise:
            long_cfg = dataclasses.replace(ckpt.cfg.data, min_len=21, max_len=40, length_mean=30.0, length_std=5.0,
                                           seed=ckpt.cfg.data.seed + 1000)
            long = load_task(long_cfg, ("test",), tokenizers=ckpt.tokenizers)
            long_metrics, _ = evaluate(model, long.examples["test"], ckpt.cfg)
            row += f" **{long_metrics['exact_match']:.4f}** |"
        if ckpt.cfg.model.kind == "universal":
            src_steps, tgt_steps = ponder_steps(model, data.examples["test"])
            flat = [x for rows_ in (src_steps, tgt_steps) for r in rows_ for x in r]
            counts = Counter(flat)
            row += (f" mean {sum(flat) / len(flat):.2f}; "
                    + ", ".join(f"{k}: {counts[k] / len(flat):.0%}" for k in sorted(counts)) + " |")
        else:
            row += " - |"
        rows.append(row)
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    if args.record:
        title = "Copy and sort: free-running exact match on test (DGL splits 9000/1000/1000)"
        if args.generalise:
            title = "Length generalisation: trained on lengths <= 20, tested on 21-40"
        append_results(title, table,
                       "Exact match: the greedy output equals the reference as a whole sequence. Checkpoint "
                       "chosen on validation exact match; test and test_uniform read once at the end.")


if __name__ == "__main__":
    main()
