"""Adaptive Universal Transformer against its references, trained end to end: vanilla vs UT at an equal wall
time, and the graph (packed) UT vs the padded UT at an equal number of updates.

    python benchmarks/studies/universal.py sort speech multi30k [--steps 1500] [--minutes 6 10] [--eval-every N ...]
        [--beam 5] [--overrides section.key=value ...] [--record]

sort      the sort_universal recipe twice at the same update budget (--steps, default 1500; max_hours 0, the
          same seed, no stop at the exact-match target): model.attention=sdpa (padded UT: every position is
          computed until the batch's last one halts) vs model.attention=graph (graph UT: halted positions leave
          the computation). Free-running whole-sequence exact match on test (as synthetic_tasks.py), training
          wall time with and without the validation decodes, graph / padded time, mean ACT steps on test.
speech    the speech_synthetic recipe as is (vanilla) vs the UT (model.kind=universal model.attention=graph
          model.max_steps=4, the rest as the recipe) for the same wall time (--minutes, default 6, via
          train.max_hours): test CER and WER (greedy), updates, training tokens/s, mean ACT steps on test.
multi30k  the multi30k_en_de recipe (../shared/data/multi30k) vanilla vs UT (model.kind=universal
          model.attention=graph model.max_steps=6, d_model etc. as the recipe) for the same wall time
          (--minutes, default 10): test2016 sacreBLEU and chrF, greedy and beam 5 (--beam 0: greedy only).

The wall-time budget (train.max_hours) counts the validation decodes; the evaluation after the last update
and data loading are outside it. Every run uses patience 0 and is tested on its best checkpoint, chosen on
validation (sort: exact match; speech: CER; multi30k: BLEU, greedy), never on test. ACT steps on test are
teacher-forced (tformer.evaluation.ponder_steps), per real position, encoder and decoder apart.

--minutes and --steps take one value per time-budgeted task (speech, multi30k, in the order given) or one
value for all. Each run goes to runs/bench-ut-TASK-VARIANT (replaced). With --record each task's table is
appended to benchmarks/RESULTS.md as soon as that task is done.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import HERE, SHARED_DATA, report  # noqa: E402

from tformer.config import load_config  # noqa: E402
from tformer.data import load_task  # noqa: E402
from tformer.evaluation import evaluate, ponder_steps  # noqa: E402
from tformer.inference import load_model  # noqa: E402
from tformer.recipes import find_recipe  # noqa: E402
from tformer.training.loop import train  # noqa: E402

RECIPES = {"sort": "sort_universal", "speech": "speech_synthetic", "multi30k": "multi30k_en_de"}
MINUTES = {"speech": 6.0, "multi30k": 10.0}
EVAL_EVERY = {"sort": 300, "speech": 200, "multi30k": 0}  # multi30k: 0 = once per epoch, as the recipe
UT = ["model.kind=universal", "model.attention=graph"]
VARIANTS = {  # task -> (name, overrides) in the order they run
    "sort": [("padded UT (sdpa)", ["model.attention=sdpa"]), ("graph UT", ["model.attention=graph"])],
    "speech": [("vanilla", []), ("UT (graph, max_steps 4)", UT + ["model.max_steps=4"])],
    "multi30k": [("vanilla", []), ("UT (graph, max_steps 6)", UT + ["model.max_steps=6"])],
}
SLUGS = {"padded UT (sdpa)": "padded", "graph UT": "graph", "vanilla": "vanilla"}


def budget_overrides(task: str, args) -> list[str]:
    """The budget and evaluation settings shared by both runs of a task."""
    common = ["train.epochs=100000", "train.patience=0", f"train.eval_every={args.eval_every[task]}"]
    if task == "sort":
        return common + [f"train.max_steps={args.steps}", "train.max_hours=0", "train.target_exact_match=0"]
    budget = [f"train.max_hours={args.minutes[task] / 60:.6g}", "train.max_steps=0"]
    if task == "multi30k":
        budget.append(f"data.dir={SHARED_DATA / 'multi30k'}")
    return common + budget


def records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(train, valid) records of metrics.jsonl."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r for r in recs if r["kind"] == "train"], [r for r in recs if r["kind"] == "valid"]


def mean_steps(model, examples) -> tuple[float, float]:
    """Mean ACT steps per real source position and per real target position, teacher-forced. Steps are 0 only
    at padding, so positions with 0 are dropped (ponder_steps cuts frame sources at the input-frame length,
    which for model.frame_skip > 1 takes in the row's padding as well)."""
    src, tgt = ponder_steps(model, examples)
    means = []
    for rows in (src, tgt):
        flat = [x for r in rows for x in r if x > 0]
        means.append(sum(flat) / len(flat))
    return means[0], means[1]


def run(task: str, name: str, variant: list[str], args) -> dict:
    overrides = budget_overrides(task, args) + variant + list(args.overrides)
    cfg = load_config(find_recipe(RECIPES[task]), overrides)
    run_dir = HERE.parent / "runs" / f"bench-ut-{task}-{SLUGS.get(name, 'ut')}"
    shutil.rmtree(run_dir, ignore_errors=True)
    load0 = os.getloadavg()[0]
    result = train(cfg, run_dir)
    trains, valids = records(run_dir)
    eval_s = sum(r["eval_seconds"] for r in valids)
    row = {"name": name, "steps": result.step, "elapsed": result.elapsed, "train_s": result.elapsed - eval_s,
           "evals": len(valids), "eval_s": eval_s,
           "tok_s": sum(r["tok_per_s"] for r in trains) / len(trains), "load": (load0, os.getloadavg()[0])}
    if trains and "ponder" in trains[0]:
        row["train_ponder"] = (sum(r["ponder"] for r in trains) / len(trains), trains[-1]["ponder"])
    best = max(valids, key=lambda r: (-r["cer"], -r["loss"]) if "cer" in r else
               (r.get("bleu", r.get("exact_match", 0.0)), -r["loss"]))
    row["best_step"] = best["step"]
    ckpt, model = load_model(run_dir, which="best")
    row["params"] = sum(p.numel() for p in model.parameters())
    data = load_task(ckpt.cfg.data, ("test",), tokenizers=ckpt.tokenizers, feature_dim=ckpt.cfg.model.feature_dim)
    test = data.examples["test"]
    refs = data.texts["test"][1] if task != "sort" else None
    greedy = dataclasses.replace(ckpt.cfg.decode, strategy="greedy", nbest=1)
    tic = time.perf_counter()
    metrics, _ = evaluate(model, test, ckpt.cfg, decode=greedy, references=refs, tokenizer=ckpt.tokenizers[1])
    row["test"], row["test_s"] = metrics, time.perf_counter() - tic
    if task == "multi30k" and args.beam > 1:
        beam = dataclasses.replace(ckpt.cfg.decode, strategy="beam", beam_size=args.beam, nbest=1)
        tic = time.perf_counter()
        row["beam"], _ = evaluate(model, test, ckpt.cfg, decode=beam, references=refs, tokenizer=ckpt.tokenizers[1])
        row["beam_s"] = time.perf_counter() - tic
    if ckpt.cfg.model.kind == "universal":
        row["ponder"] = mean_steps(model, test)
    print({k: v for k, v in row.items() if k not in ("test", "beam")}, {k: round(v, 4) for k, v in metrics.items()},
          flush=True)
    return row


def ponder_cell(r: dict) -> str:
    return f"{r['ponder'][0]:.2f} / {r['ponder'][1]:.2f}" if "ponder" in r else "-"


def train_ponder_cell(r: dict) -> str:
    return f"{r['train_ponder'][0]:.2f} (last {r['train_ponder'][1]:.2f})" if "train_ponder" in r else "-"


def common_cells(r: dict) -> str:
    evals = f"{r['evals']} eval{'s' if r['evals'] > 1 else ''}"
    return (f"{r['params']:,} | {r['steps']} | {r['train_s']:.0f} s + {evals} {r['eval_s']:.0f} s | "
            f"step {r['best_step']} | {r['tok_s']:,.0f} |")


def sort_table(rows: list[dict]) -> tuple[list[str], str]:
    padded, graph = rows
    table = ["| UT kernel | parameters | updates | training wall time (+ validation decodes) | best valid at | train "
             "tok/s | graph / padded training time | mean ponder in training | ACT steps on test (enc / dec) | test "
             "exact match | test token acc |", "|---|---:|---:|---|---|---:|---:|---|---|---:|---:|"]
    for r in rows:
        ratio = f"{r['train_s'] / padded['train_s']:.2f}" if r is graph else "1.00"
        table.append(f"| {r['name']} | {common_cells(r)} {ratio} | {train_ponder_cell(r)} | {ponder_cell(r)} | "
                     f"**{r['test']['exact_match']:.4f}** | {r['test']['token_acc']:.4f} |")
    same = abs(graph["test"]["exact_match"] - padded["test"]["exact_match"]) < 1e-9
    faster = graph["train_s"] < padded["train_s"]
    verdict = (f"Target (the padded UT's exact match at the same budget, in less wall time): exact match "
               f"{graph['test']['exact_match']:.4f} (graph) vs {padded['test']['exact_match']:.4f} (padded), "
               f"{'equal' if same else 'different'}; training time {graph['train_s']:.0f} s vs "
               f"{padded['train_s']:.0f} s ({graph['train_s'] / padded['train_s']:.2f}x, "
               f"{'less' if faster else 'not less'}); with the validation decodes {graph['elapsed']:.0f} s vs "
               f"{padded['elapsed']:.0f} s ({graph['elapsed'] / padded['elapsed']:.2f}x).")
    return table, verdict


def speech_table(rows: list[dict]) -> tuple[list[str], str]:
    table = ["| model | parameters | updates | training wall time (+ validation decodes) | best valid CER at | "
             "train tok/s | mean ponder in training | ACT steps on test (enc / dec) | test CER | test WER |",
             "|---|---:|---:|---|---|---:|---|---|---:|---:|"]
    for r in rows:
        table.append(f"| {r['name']} | {common_cells(r)} {train_ponder_cell(r)} | {ponder_cell(r)} | "
                     f"**{r['test']['cer']:.2f}%** | {r['test']['wer']:.2f}% |")
    v, u = rows
    verdict = (f"At the same wall time the UT reaches test CER {u['test']['cer']:.2f}% (WER {u['test']['wer']:.2f}%) "
               f"in {u['steps']} updates, vanilla {v['test']['cer']:.2f}% ({v['test']['wer']:.2f}%) in {v['steps']}.")
    return table, verdict


def multi30k_table(rows: list[dict], beam: int) -> tuple[list[str], str]:
    b = f" | BLEU beam {beam} | chrF beam {beam}" if beam > 1 else ""
    table = ["| model | parameters | updates | training wall time (+ validation decodes) | best valid BLEU at | "
             f"train tok/s | mean ponder in training | ACT steps on test (enc / dec) | test2016 BLEU greedy | chrF "
             f"greedy{b} |", "|---|---:|---:|---|---|---:|---|---|---:|---:|" + ("---:|---:|" if beam > 1 else "")]
    for r in rows:
        cells = f" **{r['beam']['bleu']:.2f}** | {r['beam']['chrf']:.2f} |" if "beam" in r else ""
        table.append(f"| {r['name']} | {common_cells(r)} {train_ponder_cell(r)} | {ponder_cell(r)} | "
                     f"**{r['test']['bleu']:.2f}** | {r['test']['chrf']:.2f} |{cells}")
    times = "; ".join(f"{r['name']}: greedy {r['test_s']:.0f} s" + (f", beam {r['beam_s']:.0f} s" if "beam" in r
                                                                       else "") for r in rows)
    v, u = rows
    verdict = (f"At the same wall time the UT reaches test2016 BLEU {u['test']['bleu']:.2f} greedy in {u['steps']} "
               f"updates, vanilla {v['test']['bleu']:.2f} in {v['steps']}. Test decoding time (teacher-forced "
               f"pass included): {times}.")
    return table, verdict


TITLES = {
    "sort": "Adaptive UT on sort: graph (packed) vs padded at an equal number of updates",
    "speech": "Adaptive UT on the synthetic speech task: vanilla vs graph UT at an equal wall time",
    "multi30k": "Adaptive UT on Multi30k en->de: vanilla vs graph UT at an equal wall time",
}


def notes(task: str, rows: list[dict], verdict: str, args) -> str:
    loads = "; ".join(f"{r['name']} {r['load'][0]:.1f} -> {r['load'][1]:.1f}" for r in rows)
    extra = (" Overrides for every run: " + " ".join(args.overrides) + ".") if args.overrides else ""
    if task == "sort":
        setup = (f"sort_universal recipe (d 128, one shared layer per side, max_steps 6, ACT, ponder weight 0.01, "
                 f"pre-norm), {args.steps} updates each, seed 1, the same batches; validation every "
                 f"{args.eval_every['sort']} updates (exact match, free-running), no stop at the 99.8% target. "
                 "'Training wall time': the run's wall time less its validation decodes (checkpoint writes "
                 "included). Dropout masks are drawn in a different order by the two layouts, so the runs are "
                 "not bit-identical: halting (and so the exact match) can drift apart over training.")
    elif task == "speech":
        setup = (f"speech_synthetic recipe (80-dim frames, 4 stacked every 3, d 128, pre-norm; vanilla 2+1 layers, "
                 f"UT one shared layer per side, max_steps 4, ACT, ponder weight 0.01), {args.minutes['speech']:g} "
                 f"minutes each (train.max_hours, validation decodes included), validation CER every "
                 f"{args.eval_every['speech']} updates, greedy decoding on the 1000 test utterances. Tokens/s as "
                 "the trainer logs it (source frames + target characters per second of update).")
    else:
        every = args.eval_every["multi30k"]
        warm = ", so both runs stop inside the warm-up" if max(r["steps"] for r in rows) < 1000 else ""
        setup = (f"multi30k_en_de recipe (d 256, 4 heads, d_ff 1024, shared BPE 6000, pre-norm; vanilla 3+3 "
                 f"layers, UT one shared layer per side, max_steps 6, ACT, ponder weight 0.01), "
                 f"{args.minutes['multi30k']:g} minutes each (train.max_hours, validation decodes included), "
                 f"validation BLEU (greedy) {'once per epoch' if every == 0 else f'every {every} updates'} and "
                 f"after the last update; noam warmup 1000{warm}. "
                 f"sacreBLEU (13a) and chrF on the 1000 test2016 sentences; beam length penalty 0.6.")
    return (f"{verdict}\n\n{setup}{extra} Load average (1 min) at the start and end of each run: {loads} "
            f"(2 cores).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="+", choices=tuple(RECIPES))
    ap.add_argument("--steps", type=int, default=1500, help="sort: updates per run")
    ap.add_argument("--minutes", type=float, nargs="+", help="wall time per run, one per time-budgeted task "
                    "(speech, multi30k, in the order given) or one for all (default: speech 6, multi30k 10)")
    ap.add_argument("--eval-every", type=int, nargs="+", help="updates between validations, one per task or one "
                    "for all (default: sort 300, speech 200, multi30k 0 = once per epoch)")
    ap.add_argument("--beam", type=int, default=5, help="multi30k: also decode test with this beam (<= 1: greedy only)")
    ap.add_argument("--overrides", nargs="*", default=[], metavar="section.key=value",
                    help="applied to every run after the benchmark's own (e.g. data.train_size=500 for a smoke test)")
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append each task's table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    timed = [t for t in args.tasks if t in MINUTES]
    minutes = args.minutes or []
    args.minutes = dict(MINUTES, **(dict.fromkeys(timed, minutes[0]) if len(minutes) == 1
                                    else dict(zip(timed, minutes))))
    every = args.eval_every or []
    args.eval_every = dict(EVAL_EVERY, **(dict.fromkeys(args.tasks, every[0]) if len(every) == 1
                                          else dict(zip(args.tasks, every))))
    for task in args.tasks:
        rows = [run(task, name, variant, args) for name, variant in VARIANTS[task]]
        table, verdict = (sort_table(rows) if task == "sort" else speech_table(rows) if task == "speech"
                          else multi30k_table(rows, args.beam))
        print()
        report(TITLES[task], table, notes(task, rows, verdict, args), args.record)


if __name__ == "__main__":
    main()
