"""Length generalisation: train on short sequences, test on longer ones, for every position scheme, vanilla and
universal, on copy, reverse and sort.

    python benchmarks/studies/length_generalisation.py [--tasks copy reverse sort] [--schemes sinusoidal relative+rp ...]
        [--models vanilla universal] [--seeds 1 2 3 4 5] [--steps 800] [--train-max 20] [--random-range 256]
        [--buckets 1-20 21-40 41-80 181-200] [--test-size 200] [--table-only] [--record]

Every cell (task x model x scheme x seed) trains a packaged recipe's model (vanilla: `copy`, d 128, 1+1 layers;
universal: `copy_universal`, one shared layer, at most 4 ACT steps) with data.task=TASK, lengths uniform over
1..--train-max, `--steps` updates (no early stop, no time cap: an equal update budget for all), one thread,
into runs/lg/...; the checkpoint after the budget is tested on --test-size sequences per length bucket, drawn
uniformly from the bucket by another seed. Two measures, greedy:

    exact      the whole output equals the reference (the model must also stop at the right place)
    forced     exact match with the output length forced to the reference's (`min_len` = `max_len` = its
               length): what is left are content errors, not stopping errors

Schemes: model.positions on both sides (sinusoidal, learned, tupe, tupe-r, relative, alibi, rotary), or
`dec-none` (sinusoidal encoder, no positions in the decoder); a suffix adds randomised positions drawn from
0 .. --random-range - 1 (train.random_positions): `+rp` sorted distinct positions (Ruoss et al. 2023), `+shift`
consecutive ones from a random start (SHAPE). The table gives, per bucket, the mean over seeds and
the range (min-max).

Each finished cell is appended to runs/lg/cells.jsonl and not trained again (same task, model, scheme, seed,
steps, train-max, random range, buckets and test size): several processes can share one grid (each takes the
cells no other has claimed in runs/lg/claims/), a stopped study resumes, and --table-only prints the table of
what is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import HERE, report  # noqa: E402

import tformer  # noqa: E402
from tformer.data.synthetic import synthetic_split  # noqa: E402

BASE = ("sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi", "rotary", "dec-none")
DRAWS = {"rp": "sorted", "shift": "shift"}  # scheme suffixes: randomised positions, and how they are drawn
SCHEMES = (*BASE, *(f"{s}+{d}" for d in DRAWS for s in BASE))
ROOT = HERE.parent / "runs" / "lg"
CELLS = ROOT / "cells.jsonl"


def positions(scheme: str, random_range: int) -> list[str]:
    base, _, draw = scheme.partition("+")
    out = ["model.positions=sinusoidal", "model.decoder_positions=none"] if base == "dec-none" else [
        f"model.positions={base}", "model.decoder_positions="]
    return out + [f"train.random_positions={random_range if draw else 0}",
                  f"train.random_draw={DRAWS.get(draw, 'sorted')}"]


def cell_config(task: str, model: str, scheme: str, seed: int, args) -> tformer.Config:
    recipe = "copy_universal" if model == "universal" else "copy"
    return tformer.Config.from_yaml(recipe, [
        f"data.task={task}", f"data.max_len={args.train_max}", "data.length_distribution=uniform", f"data.seed={seed}",
        f"train.seed={seed}", f"train.max_steps={args.steps}", "train.epochs=100000", "train.max_hours=0",
        "train.target_exact_match=0", f"train.eval_every={args.steps}", "train.attention_examples=0",
        "train.threads=1", "model.max_positions=512", *positions(scheme, args.random_range)])


def bucket_pairs(cfg: tformer.Config, low: int, high: int, n: int) -> list[tuple[str, str]]:
    """n sequences of lengths uniform over low..high, from a seed no training split uses."""
    import dataclasses

    data = dataclasses.replace(cfg.data, min_len=low, max_len=high, test_size=n, seed=cfg.data.seed + 7919)
    return [(" ".join(s), " ".join(t)) for s, t in synthetic_split(data, "test_uniform")]


def measure(translator, pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """(exact, forced): whole-sequence exact match free-running, and with the output length forced."""
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    free = translator.translate(sources, batch_size=200, max_len_a=1.0, max_len_b=10)
    exact = sum(h.text == r for h, r in zip(free, refs)) / len(refs)
    forced_hits = 0
    by_length: dict[int, list[int]] = {}
    for i, r in enumerate(refs):
        by_length.setdefault(len(r.split()), []).append(i)
    for length, rows in by_length.items():
        out = translator.translate([sources[i] for i in rows], batch_size=200, min_len=length, max_len_a=0.0,
                                   max_len_b=length)
        forced_hits += sum(o.text == refs[i] for o, i in zip(out, rows))
    return exact, forced_hits / len(refs)


def cell_key(task: str, model: str, scheme: str, seed: int, args) -> dict:
    return {"task": task, "model": model, "scheme": scheme, "seed": seed, "steps": args.steps,
            "train_max": args.train_max, "random_range": args.random_range if "+" in scheme else 0,
            "buckets": args.buckets, "test_size": args.test_size}


def done_cells() -> list[dict]:
    if not CELLS.exists():
        return []
    return [json.loads(line) for line in CELLS.read_text().splitlines() if line.strip()]


def claim(key: dict) -> bool:
    """True when this process may run the cell: nobody else has claimed it (an atomic create of a claim file
    holding the claimant's pid), or its claimant has died (a stopped study resumes)."""
    claims = ROOT / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / "-".join(str(key[k]) for k in ("task", "model", "scheme", "seed", "steps", "train_max",
                                                     "random_range"))
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(path.read_text() or 0), 0)
            return False  # alive, or still writing its pid
        except (ProcessLookupError, ValueError):
            path.write_text(str(os.getpid()))
            return True
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def run_cell(key: dict, args, buckets) -> dict:
    task, model, scheme, seed = key["task"], key["model"], key["scheme"], key["seed"]
    cfg = cell_config(task, model, scheme, seed, args)
    run = ROOT / f"{task}-{model}-{scheme}-s{seed}"
    shutil.rmtree(run, ignore_errors=True)
    tic = time.perf_counter()
    tformer.train(cfg, run)
    seconds = time.perf_counter() - tic
    translator = tformer.load(run, which="latest", device="cpu")
    row = {**key, "train_s": seconds, "results": {}}
    for low, high in buckets:
        row["results"][f"{low}-{high}"] = measure(translator, bucket_pairs(cfg, low, high, args.test_size))
    with open(CELLS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    shutil.rmtree(run, ignore_errors=True)  # the checkpoints are large; the cell's figures are kept
    print(json.dumps(row), flush=True)
    return row


def summary(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.1f} ({100 * min(values):.0f}-{100 * max(values):.0f})" if len(values) > 1 else f"{mean:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["copy", "reverse", "sort"])
    p.add_argument("--schemes", nargs="+", default=list(BASE), choices=SCHEMES)
    p.add_argument("--models", nargs="+", default=["vanilla", "universal"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--train-max", type=int, default=20)
    p.add_argument("--random-range", type=int, default=256)
    p.add_argument("--buckets", nargs="+", default=["1-20", "21-40", "41-80", "181-200"])
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--table-only", action="store_true", help="print the table of the cells done; train nothing")
    p.add_argument("--note", default="", help="a paragraph of findings to print (and record) after the notes")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    buckets = [tuple(int(x) for x in b.split("-")) for b in args.buckets]
    grid = [(t, m, s) for t in args.tasks for m in args.models for s in args.schemes]
    if not args.table_only:
        for seed in args.seeds:  # seed-major: a stopped study has every cell at some seeds
            for task, model, scheme in grid:
                key = cell_key(task, model, scheme, seed, args)
                if any(all(c.get(k) == v for k, v in key.items()) for c in done_cells()) or not claim(key):
                    continue
                run_cell(key, args, buckets)
    cells = [c for c in done_cells() if c["train_max"] == args.train_max and c["buckets"] == args.buckets
             and c["test_size"] == args.test_size and c["seed"] in args.seeds
             and c["random_range"] in (0, args.random_range)]
    head = ("| task | model | positions | updates | seeds | "
            + " | ".join(f"{lo}-{hi} exact / forced" for lo, hi in buckets) + " |")
    table = [head, "|" + "---|" * (5 + len(buckets))]
    minutes = 0.0
    for task, model, scheme in grid:
        for steps in sorted({c["steps"] for c in cells}):
            rows = [c for c in cells
                    if (c["task"], c["model"], c["scheme"], c["steps"]) == (task, model, scheme, steps)]
            if rows:
                minutes += sum(r["train_s"] for r in rows) / 60
                table.append(f"| {task} | {model} | {scheme} | {steps} | {len(rows)} | " + " | ".join(
                    f"{summary([r['results'][b][0] for r in rows])} / {summary([r['results'][b][1] for r in rows])}"
                    for b in args.buckets) + " |")
    notes = (f"Whole-sequence exact match in % (greedy), mean over the seeds done (range min-max); each cell trains "
             f"the given number of updates (the same for every cell of a row's budget) on lengths 1-{args.train_max} "
             f"(uniform), 4096-token batches; vanilla: the copy recipe's model (d 128, 1+1 layers, pre-norm); "
             f"universal: copy_universal's (one shared layer, <= 4 ACT steps); one thread per cell; "
             f"{args.test_size} sequences per bucket. forced: the output length forced to the reference's. "
             f"+rp / +shift: randomised positions drawn from 0..{args.random_range - 1}, sorted / shifted. "
             f"{minutes:.0f} min of training in all." + (f"\n\n{args.note}" if args.note else ""))
    report("Length generalisation: trained on short sequences, tested on longer ones", table, notes, args.record)


if __name__ == "__main__":
    main()
