"""Fine-tuning a model that went through Hugging Face costs nothing: a model trained here on the first half of
Multi30k train, exported to a Hugging Face MarianMT folder, fine-tuned from that folder (imported) on the second
half, against the same fine-tuning continued from the native run.

    python benchmarks/studies/finetune_roundtrip.py [--minutes 20] [--steps 600] [--eval-every 100] [--record]

1. Two corpora: A = train lines 1-14,500, B = lines 14,501-29,000, each with Multi30k's val and test2016.
2. The base: the multi30k_tiny recipe, post-norm (MarianMT is post-norm only), trained on A for --minutes.
3. `export_hf_marian` writes it as a MarianMT folder; `train(config="finetune", train.init_from=...)` fine-tunes
   (a) from that folder and (b) from the native run, on B, with the same seed and --steps updates, validating
   (greedy BLEU) every --eval-every updates.
Reported: test2016 sacreBLEU (beam 5, GNMT penalty 0.6, the same decoding for every model) of the base read
natively and from the folder, of both fine-tuned models; their validation curves side by side; the largest
difference between their final weights.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.export import export_hf_marian  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402
from tformer.training.state import TrainerState  # noqa: E402


def halves(out: Path) -> tuple[Path, Path]:
    """Corpora A and B (see the module docstring) under `out`."""
    m30k = SHARED_DATA / "multi30k"
    lines = {lang: gzip.open(m30k / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
             for lang in ("en", "de")}
    half = len(lines["en"]) // 2
    folders = []
    for name, part in (("A", slice(0, half)), ("B", slice(half, None))):
        folder = out / name
        folder.mkdir(parents=True)
        for lang in ("en", "de"):
            (folder / f"train.{lang}.gz").write_bytes(gzip.compress(("\n".join(lines[lang][part]) + "\n").encode()))
            for split in ("val", "test2016"):
                (folder / f"{split}.{lang}.gz").write_bytes((m30k / f"{split}.{lang}.gz").read_bytes())
        folders.append(folder)
    return folders[0], folders[1]


def test_bleu(model_path: Path) -> float:
    translator = tformer.load(model_path, device="cpu")
    src = gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8").read().splitlines()
    ref = gzip.open(SHARED_DATA / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8").read().splitlines()
    out = translator.translate(src, beam=5, len_penalty=0.6, len_penalty_rule="gnmt", batch_size=128)
    return translation_scores([t.text for t in out], ref, "de").bleu


def curve(run: Path) -> dict[int, float]:
    """Validation BLEU by update, from the run's metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["bleu"] for r in records if r.get("kind") == "valid"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="training time of the base on half A")
    ap.add_argument("--steps", type=int, default=600, help="fine-tuning updates on half B")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-4, help="fine-tuning peak learning rate")
    ap.add_argument("--work", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--report-only", action="store_true", help="report on the runs already in --work")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tformer-finetune-"))
    base, hf = work / "base", work / "base-hf"
    if not args.report_only:
        a, b = halves(work / "data")
        tformer.train("multi30k_tiny", base, overrides=[f"data.dir={a}", "model.norm=post",
                                                        f"train.max_hours={args.minutes / 60}"])
        export_hf_marian(base, hf)
    tuned = {}
    for name, start in (("from the Hugging Face folder (imported)", hf), ("from the native run", base)):
        run = work / ("ft-hf" if start == hf else "ft-native")
        tuned[name] = run
        if args.report_only:
            continue
        tformer.train("finetune", run, overrides=[
            f"train.init_from={start}", f"data.dir={work / 'data' / 'B'}", "data.src_lang=en", "data.tgt_lang=de",
            "data.valid_prefix=val", "data.test_prefix=test2016", f"train.max_steps={args.steps}",
            f"train.eval_every={args.eval_every}", f"train.lr={args.lr}", "train.max_tokens=4096", "train.patience=0",
            "train.epochs=100", "train.seed=1"])
    runs = list(tuned.values())
    final = [load_checkpoint(r, "latest").weights("raw") for r in runs]
    diff = max(float((final[0][k] - final[1][k]).abs().max()) for k in final[0])
    curves = [curve(r) for r in runs]
    steps = sorted(set(curves[0]) | set(curves[1]))
    base_steps = TrainerState.of(load_checkpoint(base, "latest")).step
    table = ["| model | test2016 sacreBLEU |", "|---|---:|",
             f"| base: multi30k_tiny post-norm, {args.minutes:.0f} min ({base_steps} updates) on half A (native) | "
             f"{test_bleu(base):.2f} |",
             f"| base, exported to Hugging Face and read from that folder | {test_bleu(hf):.2f} |"]
    for name, run in tuned.items():
        table.append(f"| fine-tuned {args.steps} updates on half B, {name} | {test_bleu(run):.2f} |")
    table += ["", "| update | validation BLEU, from the folder | validation BLEU, from the native run |",
              "|---:|---:|---:|"]
    table += [f"| {s} | {curves[0].get(s, float('nan')):.2f} | {curves[1].get(s, float('nan')):.2f} |"
              for s in steps]
    notes = (f"Largest difference between the two fine-tuned models' final weights: {diff:.3g}. Fine-tuning: the "
             f"finetune recipe with train.lr={args.lr}, max_tokens 4096, seed 1, EMA 0.999 (validation and the "
             f"scores above use the moving average). Decoding for every row: beam 5, GNMT length penalty 0.6, "
             f"batch 128. torch {torch.__version__}, {torch.get_num_threads()} threads.")
    report("Fine-tuning through Hugging Face: Multi30k half A, then half B", table, notes, args.record)


if __name__ == "__main__":
    main()
