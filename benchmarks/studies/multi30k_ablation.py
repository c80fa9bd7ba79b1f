"""Multi30k en-de: what each ingredient of the small-model recipe is worth, at an equal training budget.

    python benchmarks/studies/multi30k_ablation.py [--hours 1.6] [--parallel 2] [--seeds 3] [--base "+ EMA"]
                                           [--len-penalty 0.6 1 1.5] [--record]

Rows, each trained for the same wall-clock budget (`train.max_hours`) on one CPU thread, `--parallel` runs
side by side (one per core), then decoded with beam 5:

    baseline             the multi30k_en_de recipe (d 256, 3+3 layers, dropout 0.1)
    + tiny               the multi30k_tiny recipe (4+4 layers, d 128, FFN 256, dropout 0.3) without its EMA
    + EMA                + train.ema=0.999, as the recipe has it (validation and inference use the average)
    + subword sampling   + data.subword_sampling=0.1 (BPE-dropout on the training side)
    + averaging          the --base row's run, its last / best 10 checkpoints averaged
    + ensemble           that configuration trained with `--seeds` seeds, each seed's choice decoded as one

Rows 1-4 decode their best checkpoint (chosen on validation during training). The last two rows build on
`--base`: by default the multi30k_tiny recipe as shipped (the "+ EMA" row), so that every row measures an
ingredient of that recipe; `--base best` builds on the row with the best validation sacreBLEU instead (and trains
its extra seeds). Which averaging each seed uses is chosen by validation sacreBLEU (beam 5); test2016 is read
only to report. Runs live in runs/ablation/NAME-sSEED and resume where they stopped (a run that has spent its budget
is not trained again), so the script can be stopped with Ctrl-C and run again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import HERE, report  # noqa: E402
from multi30k_quality import candidates, scores, training_record, tuned  # noqa: E402

from tformer.viz.curves import read_metrics  # noqa: E402

ROWS = {  # name: (recipe, overrides), each adding to the one before
    "baseline": ("multi30k_en_de", []),
    "+ tiny": ("multi30k_tiny", ["train.ema=0"]),
    "+ EMA": ("multi30k_tiny", ["train.ema=0.999"]),
    "+ subword sampling": ("multi30k_tiny", ["train.ema=0.999", "data.subword_sampling=0.1"]),
}
ROOT = HERE.parent / "runs" / "ablation"


def run_dir(name: str, seed: int) -> Path:
    slug = name.strip("+ ").replace(" ", "-").lower()
    return ROOT / f"{slug}-s{seed}"


def ema_gain(path: Path) -> float:
    """What the moving average adds at equal updates: its greedy validation BLEU minus the raw weights', averaged
    over the evaluations of the run's second half (each one scores both on the same step)."""
    valid = [r for r in read_metrics(path) if r.get("kind") == "valid" and "raw_bleu" in r]
    late = [r for r in valid if r["step"] >= valid[-1]["step"] / 2]
    return sum(r["bleu"] - r["raw_bleu"] for r in late) / len(late)


def train_all(jobs: list[tuple[str, int]], hours: float, parallel: int) -> None:
    """Train (or resume) each (row, seed), `parallel` at a time, one thread each."""
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < parallel:
            name, seed = pending.pop(0)
            recipe, overrides = ROWS[name]
            out = run_dir(name, seed)
            out.parent.mkdir(parents=True, exist_ok=True)
            resume = ["--resume"] if (out / "checkpoints").is_dir() else []
            cmd = [sys.executable, "-m", "tformer", "train", "--config", recipe, "--run-dir", str(out), *resume,
                   "--no-progress", *overrides, f"train.seed={seed}", "train.threads=1", f"train.max_hours={hours}"]
            print("$", " ".join(cmd), flush=True)
            log = open(out.with_suffix(".log"), "a")
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), name, seed, log))
        time.sleep(5)
        for job in list(running):
            proc, name, seed, log = job
            if proc.poll() is not None:
                log.close()
                running.remove(job)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} seed {seed} failed (exit {proc.returncode}); see "
                                     f"{run_dir(name, seed).with_suffix('.log')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1.6, help="training budget of every run (train.max_hours)")
    ap.add_argument("--parallel", type=int, default=2, help="runs trained side by side, one thread each")
    ap.add_argument("--seeds", type=int, default=3, help="runs in the ensemble")
    ap.add_argument("--base", choices=[*ROWS, "best"], default="+ EMA",
                    help="the row the averaging and ensemble rows build on (default: the multi30k_tiny recipe as "
                         "shipped); 'best': the row validation prefers")
    ap.add_argument("--average", type=int, default=10)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--len-penalty", type=float, nargs="+", metavar="ALPHA",
                    help="length penalties (GNMT alpha) tried on validation for every decoded row, which keeps the "
                         "one validation prefers (default: each recipe's decode.len_penalty)")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    train_all([(name, 1) for name in ROWS], args.hours, args.parallel)

    table = ["| row | training | len penalty | valid sacreBLEU (chooses) | test2016 sacreBLEU | tok BLEU | "
             "**lc tok BLEU** | chrF |", "|---|---|---|---|---|---|---|---|"]

    def row(name: str, training: str, paths: Path | list[Path], valid: dict) -> None:
        test = scores(paths, "test", args.beam, valid["len_penalty"])
        table.append(f"| {name} | {training} | {valid['len_penalty']:g} | {valid['bleu']:.2f} | {test['bleu']:.2f} | "
                     f"{test['tok_bleu']:.2f} | **{test['tok_bleu_lc']:.2f}** | {test['chrf']:.2f} |")
        print(table[-1], flush=True)

    def trained(path: Path) -> str:
        step, elapsed, _ = training_record(path)
        return f"{elapsed / 60:.0f} min, {step} updates"

    valid_of = {}
    for name in ROWS:
        path = run_dir(name, 1)  # its best-validated checkpoint
        valid_of[name] = tuned(path, args.beam, args.len_penalty)
        row(name, trained(path), path, valid_of[name])
    preferred = max(valid_of, key=lambda name: valid_of[name]["bleu"])
    base = preferred if args.base == "best" else args.base

    out = ROOT / "averaged"
    out.mkdir(parents=True, exist_ok=True)
    choices, total = [], 0.0
    train_all([(base, seed) for seed in range(2, args.seeds + 1)], args.hours, args.parallel)
    for seed in range(1, args.seeds + 1):
        found = candidates(run_dir(base, seed), args.average, out)
        valid = {name: (valid_of[base] if name == "best" and seed == 1 else tuned(p, args.beam, args.len_penalty))
                 for name, p in found.items()}
        pick = max(valid, key=lambda name: valid[name]["bleu"])
        choices.append(found[pick])
        total += training_record(run_dir(base, seed))[1]
        if seed == 1:
            row(f"+ averaging ({base}: {pick})", trained(run_dir(base, 1)), found[pick], valid[pick])
    if len(choices) > 1:
        row(f"+ ensemble of {len(choices)} seeds ({base}, each seed's choice)",
            f"{total / 60:.0f} min in all ({len(choices)} runs)", choices, tuned(choices, args.beam, args.len_penalty))
    penalty = (f"(GNMT alpha) chosen on validation among {', '.join(f'{a:g}' for a in args.len_penalty)}"
               if args.len_penalty else "from each recipe")
    notes = (f"Every run: train.max_hours={args.hours} on one thread of the 2-core CPU, {args.parallel} runs side by "
             f"side. Beam {args.beam}, length penalty {penalty}. The averaging and ensemble rows build on "
             f"'{base}' ({'validation' if args.base == 'best' else '--base'}'s choice; validation prefers "
             f"'{preferred}' of the single runs); each seed's averaging (best checkpoint, last or best N averaged) "
             "is chosen on validation. "
             "EMA at equal updates (the moving average's greedy validation BLEU minus the raw weights' at the same "
             "step, mean over each run's second half): "
             + ", ".join(f"seed {seed} {ema_gain(run_dir('+ EMA', seed)):+.2f}" for seed in range(1, args.seeds + 1)
                         if (run_dir("+ EMA", seed) / "metrics.jsonl").is_file()) + ". "
             "lc tok BLEU: lowercased BLEU on Moses-tokenized text, as the multimodal-MT literature reports.")
    report(f"Multi30k en-de ablation at an equal budget ({args.hours} h per run)", table, notes, args.record)


if __name__ == "__main__":
    main()
