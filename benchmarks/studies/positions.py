"""Position schemes side by side at an equal training budget (the same number of updates, the same batches):
sinusoidal vs learned vs TUPE-A vs TUPE-R, on the encoder and the decoder alike (or, as `tupe-enc` /
`tupe-r-enc`, TUPE in the encoder with a sinusoidal decoder, as the TUPE source does).

    python benchmarks/studies/positions.py copy speech multi30k [--schemes ...] [--steps N ...] [--record]

copy      length extrapolation: the copy recipe trained on lengths <= 20 (data.max_len=20), tested on its
          own test split and on 1000 sequences of lengths 21-40 (another seed): free-running exact match.
speech    the synthetic speech-like task (the speech_synthetic recipe): character and word error rate on
          test, greedy.
multi30k  Multi30k en->de (the multi30k_en_de recipe, ../shared/data/multi30k): sacreBLEU and chrF on
          test2016, beam 5, on the checkpoint after the budget (one validation at the end: no selection).

Each run goes to runs/bench-pos-TASK-SCHEME (replaced). With --record each task's table is appended to
benchmarks/RESULTS.md as soon as it is done, so a long run keeps what it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import HERE, SHARED_DATA, append_results  # noqa: E402

from tformer.config import load_config  # noqa: E402
from tformer.data import load_task  # noqa: E402
from tformer.evaluation import evaluate  # noqa: E402
from tformer.inference import load_model  # noqa: E402
from tformer.recipes import find_recipe  # noqa: E402
from tformer.training.loop import train  # noqa: E402

SCHEMES = ("sinusoidal", "learned", "tupe", "tupe-r")
ENCODER_ONLY = ("tupe-enc", "tupe-r-enc")  # TUPE in the encoder, sinusoidal in the decoder (as the source)
STEPS = {"copy": 800, "speech": 1000, "multi30k": 600}
RECIPES = {"copy": "copy", "speech": "speech_synthetic", "multi30k": "multi30k_en_de"}


def overrides_for(task: str, scheme: str, steps: int) -> list[str]:
    encoder_only = scheme.endswith("-enc")
    common = [f"model.positions={scheme.removesuffix('-enc')}",
              "model.decoder_positions=" + ("sinusoidal" if encoder_only else ""), f"train.max_steps={steps}",
              "train.epochs=10000", "train.max_hours=0", "train.patience=0"]
    if task == "copy":
        return common + ["data.max_len=20", "train.target_exact_match=0", f"train.eval_every={steps // 4}"]
    if task == "speech":
        return common + [f"train.eval_every={steps // 2}"]
    return common + [f"train.eval_every={steps}", f"data.dir={SHARED_DATA / 'multi30k'}"]


def run(task: str, scheme: str, steps: int) -> dict[str, float | str]:
    cfg = load_config(find_recipe(RECIPES[task]), overrides_for(task, scheme, steps))
    run_dir = HERE.parent / "runs" / f"bench-pos-{task}-{scheme}"
    shutil.rmtree(run_dir, ignore_errors=True)
    tic = time.perf_counter()
    result = train(cfg, run_dir)
    row: dict[str, float | str] = {"scheme": scheme, "steps": result.step, "train_s": time.perf_counter() - tic}
    ckpt, model = load_model(run_dir, which="latest")
    n_params = sum(p.numel() for p in model.parameters())
    row["params"] = n_params
    data = load_task(ckpt.cfg.data, ("test",), tokenizers=ckpt.tokenizers, feature_dim=ckpt.cfg.model.feature_dim)
    refs = data.texts["test"][1] if task != "copy" else None
    decode = ckpt.cfg.decode
    if task == "multi30k":
        decode = dataclasses.replace(decode, strategy="beam", beam_size=5, nbest=1)
    metrics, _ = evaluate(model, data.examples["test"], ckpt.cfg, decode=decode, references=refs,
                          tokenizer=ckpt.tokenizers[1])
    row.update({k: metrics[k] for k in ("loss", "token_acc", "bleu", "chrf", "cer", "wer", "exact_match")
                if k in metrics})
    if task == "copy":
        long_cfg = dataclasses.replace(ckpt.cfg.data, min_len=21, max_len=40, length_mean=30.0, length_std=5.0,
                                       seed=ckpt.cfg.data.seed + 1000)
        long = load_task(long_cfg, ("test",), tokenizers=ckpt.tokenizers)
        long_metrics, _ = evaluate(model, long.examples["test"], ckpt.cfg)
        row["long_exact_match"] = long_metrics["exact_match"]
        row["long_token_acc"] = long_metrics["token_acc"]
    print(row, flush=True)
    return row


def table(task: str, rows: list[dict]) -> str:
    if task == "copy":
        head = ("| positions | steps | train time | test (lengths 1-20) exact match | lengths 21-40 exact match "
                "| 21-40 token acc (teacher-forced) |\n|---|---|---|---|---|---|")
        body = [f"| {r['scheme']} | {r['steps']} | {r['train_s']:.0f} s | {r['exact_match']:.4f} | "
                f"**{r['long_exact_match']:.4f}** | {r['long_token_acc']:.4f} |" for r in rows]
    elif task == "speech":
        head = ("| positions | steps | train time | parameters | test CER | test WER | test loss |\n"
                "|---|---|---|---|---|---|---|")
        body = [f"| {r['scheme']} | {r['steps']} | {r['train_s']:.0f} s | {r['params']:,} | **{r['cer']:.2f}%** | "
                f"{r['wer']:.2f}% | {r['loss']:.4f} |" for r in rows]
    else:
        head = ("| positions | steps | train time | parameters | test2016 sacreBLEU (beam 5) | chrF | test loss |\n"
                "|---|---|---|---|---|---|---|")
        body = [f"| {r['scheme']} | {r['steps']} | {r['train_s']:.0f} s | {r['params']:,} | **{r['bleu']:.2f}** | "
                f"{r['chrf']:.2f} | {r['loss']:.4f} |" for r in rows]
    return "\n".join([head, *body])


NOTES = {
    "copy": "the copy recipe (d 128, 1+1 layers, pre-norm) trained on lengths <= 20, the same updates for every "
            "scheme (no early stop at 100%); the checkpoint after the budget is tested. Lengths 21-40: 1000 "
            "sequences, lengths ~ Normal(30, 5) clipped, seed + 1000. Learned tables (learned, tupe) have rows "
            "for positions >= 22 that training never touched.",
    "speech": "the speech_synthetic recipe (80-dim frames, 4 stacked every 3, d 128, 2+1 layers, character "
              "targets), the scheme on both encoder and decoder; the checkpoint after the budget, greedy "
              "decoding on the 1000 test utterances.",
    "multi30k": "the multi30k_en_de recipe (d 256, 3+3 layers, shared BPE 6000) with the scheme on both "
                "sides, the same updates (a short budget: the full recipe runs ~3400 updates to 37.4 BLEU); the "
                "checkpoint after the budget, beam 5, length penalty 0.6.",
}
TITLES = {
    "copy": "Position schemes: length extrapolation on copy (train <= 20, test 21-40)",
    "speech": "Position schemes: synthetic speech-like task (CER/WER)",
    "multi30k": "Position schemes: Multi30k en->de at an equal budget",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="+", choices=tuple(STEPS))
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES + ENCODER_ONLY,
                    help="position schemes on both sides; *-enc: TUPE in the encoder only")
    ap.add_argument("--steps", nargs="+", type=int, help="updates per run, one per task (default: "
                    + ", ".join(f"{k} {v}" for k, v in STEPS.items()) + ")")
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append each task's table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    steps = dict(zip(args.tasks, args.steps)) if args.steps else {}
    for task in args.tasks:
        rows = [run(task, scheme, steps.get(task, STEPS[task])) for scheme in args.schemes]
        print("\n" + table(task, rows) + "\n", flush=True)
        if args.record:
            append_results(TITLES[task], table(task, rows), NOTES[task])


if __name__ == "__main__":
    main()
