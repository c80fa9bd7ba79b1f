"""Multi30k en-de quality as the literature reports it: for finished training runs, the candidates a user
would decode with, chosen on validation only, then scored on test2016.

    python benchmarks/multi30k_quality.py runs/A [runs/B ...] [--average 10] [--beam 5] [--record]
    python benchmarks/multi30k_quality.py runs/fra_en --title "fra-en (Tatoeba) test" --test-name test

Any translation run works: --title names the table and --test-name the test split's column.

For each run: the best checkpoint (by validation during training), the average of its last N checkpoints and
the average of its N best-validated ones (`tformer average --last N` / `--best N`; a run with `train.ema`
averages its moving averages). Each candidate is decoded on validation (beam 5, at each length penalty of
--len-penalty if given, keeping the one validation prefers); the one with the highest validation sacreBLEU is the
run's choice. With two runs or more, the runs' choices are also decoded as one
ensemble (log-probabilities averaged per step). Every row shows its test2016 scores, but only the validation
column chose: test2016 is read after the choice, never to make it.

Scores: sacreBLEU (cased, 13a, with its signature), tokenized BLEU cased, lowercased tokenized BLEU (the
multimodal-MT literature's figure, e.g. 41.0 for the Transformer-tiny of Wu et al. 2021) and chrF.
Training time is the run's own wall-clock record (evaluations included), with the number of updates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import resolve_checkpoint  # noqa: E402
from tformer.training.average import average_checkpoints, best_checkpoints, last_checkpoints  # noqa: E402


def training_record(run_dir: Path) -> tuple[int, float, int]:
    """(updates, wall seconds, torch threads) of a run, from its latest checkpoint and its config."""
    state = json.loads((resolve_checkpoint(run_dir, "latest") / "trainer.json").read_text())
    threads = tformer.Config.from_yaml(run_dir / "config.yaml").train.threads
    return state["step"], state["elapsed"], threads


def candidates(run_dir: Path, n: int, out: Path) -> dict[str, Path]:
    found = {"best": run_dir}  # a run folder loads as its best-validated checkpoint
    for name, pick in ((f"last {n} averaged", last_checkpoints), (f"best {n} averaged", best_checkpoints)):
        target = out / f"{run_dir.name}-{name.split()[0]}{n}"
        if not target.exists():
            average_checkpoints(pick(run_dir, n), target)
        found[name] = target
    return found


def scores(paths: Path | list[Path], split: str, beam: int, len_penalty: float | None = None) -> dict:
    """Decode `split` with a checkpoint (or an ensemble) and score it; `len_penalty` None: the recipe's."""
    translator = tformer.load(paths if isinstance(paths, Path) else [str(p) for p in paths], device="cpu")
    tic = time.perf_counter()
    result = translator.evaluate(split, beam=beam, **({} if len_penalty is None else {"len_penalty": len_penalty}))
    return {**result.metrics, "seconds": time.perf_counter() - tic, "signature": result.scores.bleu_signature,
            "lc_signature": result.scores.tok_bleu_lc_signature, "len_penalty": result.decode.len_penalty}


def tuned(paths: Path | list[Path], beam: int, grid: list[float] | None) -> dict:
    """Validation scores at the length penalty of `grid` that validation prefers (None: the recipe's only)."""
    tried = [scores(paths, "valid", beam, lp) for lp in grid or [None]]
    return max(tried, key=lambda valid: valid["bleu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--average", type=int, default=10, help="checkpoints averaged (last N, best N)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("runs/averaged"), help="where averaged checkpoints go")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--title", default="Multi30k en-de test2016", help="what the table reports (its heading)")
    ap.add_argument("--test-name", default="test2016", help="the test split's name in the table")
    ap.add_argument("--len-penalty", type=float, nargs="+", metavar="ALPHA",
                    help="length penalties (GNMT alpha) decoded on validation for every candidate, which keeps the "
                         "one validation prefers (default: the recipe's decode.len_penalty alone)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = [f"| run | updates | training time | candidate | len penalty | valid sacreBLEU (chooses) | "
             f"{args.test_name} sacreBLEU | tok BLEU | **lc tok BLEU** | chrF |", "|---" * 10 + "|"]
    chosen, best_valid, signatures, total = [], 0.0, ("", ""), 0.0

    def row(run: str, steps: str, time_: str, name: str, valid: dict, test: dict, mark: bool) -> None:
        nonlocal signatures
        signatures = test["signature"], test["lc_signature"]
        b = "**" if mark else ""
        table.append(f"| {run} | {steps} | {time_} | {b}{name}{b} | {valid['len_penalty']:g} | {valid['bleu']:.2f} | "
                     f"{test['bleu']:.2f} | {test['tok_bleu']:.2f} | {b}{test['tok_bleu_lc']:.2f}{b} | "
                     f"{test['chrf']:.2f} |")
        print(table[-1], flush=True)

    for run_dir in args.runs:
        step, elapsed, threads = training_record(run_dir)
        total += elapsed
        found = candidates(run_dir, args.average, args.out)
        valid = {name: tuned(path, args.beam, args.len_penalty) for name, path in found.items()}
        pick = max(valid, key=lambda name: valid[name]["bleu"])
        chosen.append(found[pick])
        best_valid = max(best_valid, valid[pick]["bleu"])
        for name, path in found.items():
            row(run_dir.name, str(step), f"{elapsed / 60:.0f} min ({threads or 'all'} thread{'s' * (threads != 1)})",
                name, valid[name], scores(path, "test", args.beam, valid[name]["len_penalty"]), name == pick)
    if len(chosen) > 1:
        valid = tuned(chosen, args.beam, args.len_penalty)
        row("ensemble of the runs' choices", "", f"{total / 60:.0f} min in all", f"{len(chosen)} models",
            valid, scores(chosen, "test", args.beam, valid["len_penalty"]), valid["bleu"] > best_valid)
    penalty = (f"length penalty (GNMT alpha) chosen on validation among {', '.join(f'{a:g}' for a in args.len_penalty)}"
               if args.len_penalty else "length penalty from each recipe's decode settings")
    notes = (f"Beam {args.beam}, {penalty}. Bold: each run's candidate chosen "
             "on validation, and the ensemble when validation prefers it to every run's choice. tok BLEU: BLEU on "
             "Moses-tokenized text; lc tok BLEU: the same tokens lowercased (multi-bleu.perl "
             f"-lc on Moses-tokenized text, as the literature reports). Signatures: sacreBLEU `{signatures[0]}`; "
             f"lc tok BLEU `{signatures[1]}`.")
    report(f"{args.title}: candidates chosen on validation", table, notes, args.record)


if __name__ == "__main__":
    main()
