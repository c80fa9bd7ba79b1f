"""Length generalisation: train on short sequences, test on longer ones, for every position scheme, vanilla and
universal, on copy, reverse and sort.

    python benchmarks/length_generalisation.py [--tasks copy reverse sort] [--schemes sinusoidal relative ...]
        [--models vanilla universal] [--seeds 1 2 3 4 5] [--steps 1500] [--train-max 20]
        [--buckets 1-20 21-40 41-80] [--test-size 200] [--record]

Every cell (task x model x scheme x seed) trains the copy recipe's model with data.task=TASK, lengths uniform
over 1..--train-max, `--steps` updates (no early stop, no time cap: an equal update budget for all), one thread,
into runs/lg/...; the checkpoint after the budget is tested on --test-size sequences per length bucket, drawn
uniformly from the bucket by another seed. Two measures, greedy:

    exact      the whole output equals the reference (the model must also stop at the right place)
    forced     exact match with the output length forced to the reference's (`min_len` = `max_len` = its
               length): what is left are content errors, not stopping errors

Schemes: model.positions on both sides (sinusoidal, learned, tupe, tupe-r, relative, alibi, rotary), or
`dec-none` (sinusoidal encoder, no positions in the decoder). rotary is refused in the universal transformer:
those cells are listed as such. The table gives, per bucket, the mean over seeds and the range (min-max).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, report  # noqa: E402

import tformer  # noqa: E402
from tformer.data.synthetic import synthetic_split  # noqa: E402
from tformer.errors import ConfigError  # noqa: E402

SCHEMES = ("sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi", "rotary", "dec-none")


def positions(scheme: str) -> list[str]:
    if scheme == "dec-none":
        return ["model.positions=sinusoidal", "model.decoder_positions=none"]
    return [f"model.positions={scheme}", "model.decoder_positions="]


def cell_config(task: str, model: str, scheme: str, seed: int, steps: int, train_max: int) -> tformer.Config:
    return tformer.Config.from_yaml("copy", [
        f"data.task={task}", f"data.max_len={train_max}", "data.length_distribution=uniform", f"data.seed={seed}",
        f"train.seed={seed}", f"train.max_steps={steps}", "train.epochs=100000", "train.max_hours=0",
        "train.target_exact_match=0", f"train.eval_every={steps}", "train.attention_examples=0", "train.threads=1",
        f"model.kind={model}", "model.max_positions=512", *positions(scheme)])


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


def run_cell(task, model, scheme, seed, args, buckets) -> dict | None:
    try:
        cfg = cell_config(task, model, scheme, seed, args.steps, args.train_max)
    except ConfigError as error:
        print(f"{task} {model} {scheme}: refused ({error})", flush=True)
        return None
    run = HERE.parent / "runs" / "lg" / f"{task}-{model}-{scheme}-s{seed}"
    shutil.rmtree(run, ignore_errors=True)
    tic = time.perf_counter()
    tformer.train(cfg, run)
    seconds = time.perf_counter() - tic
    translator = tformer.load(run, which="latest", device="cpu")
    row = {"task": task, "model": model, "scheme": scheme, "seed": seed, "train_s": seconds}
    for low, high in buckets:
        row[(low, high)] = measure(translator, bucket_pairs(cfg, low, high, args.test_size))
    print(row, flush=True)
    return row


def summary(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.1f} ({100 * min(values):.0f}-{100 * max(values):.0f})" if len(values) > 1 else f"{mean:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["copy", "reverse", "sort"])
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    p.add_argument("--models", nargs="+", default=["vanilla", "universal"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--train-max", type=int, default=20)
    p.add_argument("--buckets", nargs="+", default=["1-20", "21-40", "41-80"])
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--record", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    buckets = [tuple(int(x) for x in b.split("-")) for b in args.buckets]
    rows, refused = [], []
    for task in args.tasks:
        for model in args.models:
            for scheme in args.schemes:
                for seed in args.seeds:
                    row = run_cell(task, model, scheme, seed, args, buckets)
                    if row is None:
                        refused.append(f"{task}/{model}/{scheme}")
                        break
                    rows.append(row)
    head = "| task | model | positions | " + " | ".join(f"{lo}-{hi} exact / forced" for lo, hi in buckets) + " |"
    table = [head, "|" + "---|" * (3 + len(buckets))]
    for task in args.tasks:
        for model in args.models:
            for scheme in args.schemes:
                cell = [r for r in rows if (r["task"], r["model"], r["scheme"]) == (task, model, scheme)]
                if cell:
                    table.append(f"| {task} | {model} | {scheme} | " + " | ".join(
                        f"{summary([r[b][0] for r in cell])} / {summary([r[b][1] for r in cell])}"
                        for b in buckets) + " |")
    minutes = sum(r["train_s"] for r in rows) / 60
    notes = (f"Whole-sequence exact match in %, greedy, mean over seeds {args.seeds} (range min-max); "
             f"{args.steps} updates per cell on lengths 1-{args.train_max} (uniform), the copy recipe's model "
             f"(d 128, 1+1 layers; universal: one shared layer), one thread; {args.test_size} sequences per bucket. "
             f"forced: the output length forced to the reference's. {minutes:.0f} min of training in all."
             + (f" Refused: {', '.join(refused)} (rotary is not yet available in the universal transformer)."
                if refused else ""))
    report("Length generalisation: trained on short sequences, tested on longer ones", table, notes, args.record)


if __name__ == "__main__":
    main()
