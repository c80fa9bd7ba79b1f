"""Many languages in one model against one model per pair (issue 65), on Multi30k test2016.

Every model here is trained by the same recipe (multi30k_multi: its model, its vocabulary size, its updates),
one thread each, the checkpoint chosen on validation (the mean over directions for a multilingual model). Each
direction is scored on test2016 with the recipe's beam: lowercased tokenized BLEU (what Multi30k papers report),
sacreBLEU and chrF. Zero-shot: a many-to-many model trained without German <-> French pairs translates de -> fr
and fr -> de directly (its <2fr> token after a German source), and through English (de -> en, then en -> fr, by
the same model).

    tformer train --config multi30k_multi --run-dir runs/multi train.threads=1
    tformer train --config multi30k_multi --run-dir runs/bi_en-fr train.threads=1 'data.pairs=[]' \\
        data.src_lang=en data.tgt_lang=fr          (and en-de, en-cs)
    tformer train --config multi30k_multi --run-dir runs/m2m train.threads=1 \\
        'data.pairs=[en-de,de-en,en-fr,fr-en,en-cs,cs-en,de-cs,cs-de,fr-cs,cs-fr]'
    python benchmarks/studies/multilingual.py --multi runs/multi --bilingual runs/bi_en-de runs/bi_en-fr runs/bi_en-cs \\
        --m2m runs/m2m [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import machine, report  # noqa: E402

import tformer  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def wall_time(run: Path) -> float:
    """The run's training wall time (evaluations included): the last record of its metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return max(r.get("elapsed", 0.0) for r in records)


def best_step(run: Path) -> str:
    return (run / "checkpoints" / "best").read_text().strip()


def scores(t: tformer.Translator, pairs: list[str] | None, beam: int) -> dict[str, dict[str, float]]:
    result = t.evaluate("test", pairs=pairs, beam=beam)
    if result.directions:
        return {name: s.as_dict() for name, s in result.directions.items()}
    data = t.config.data
    return {f"{data.src_lang}-{data.tgt_lang}": result.scores.as_dict()}


def pivot(t: tformer.Translator, source: str, target: str, through: str, beam: int) -> dict[str, float]:
    """source -> through -> target by one model, scored against the target file."""
    data = t.load_split("test", [f"{source}-{target}"])
    sources, refs = data.texts["test"]
    middle = [x.text for x in t.translate(sources, target=through, source=source, beam=beam)]
    outputs = [x.text for x in t.translate(middle, target=target, source=through, beam=beam)]
    return translation_scores(outputs, refs, target).as_dict()


def row(name: str, direction: str, s: dict[str, float], note: str = "") -> str:
    return f"| {name} | {direction} | {s['tok_bleu_lc']:.2f} | {s['bleu']:.2f} | {s['chrf']:.2f} | {note} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--multi", type=Path, required=True, help="the one-to-many run (en -> de, fr, cs)")
    ap.add_argument("--bilingual", type=Path, nargs="+", required=True, help="the one-pair runs")
    ap.add_argument("--m2m", type=Path, help="the many-to-many run trained without de <-> fr")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    tic = time.perf_counter()
    table = ["| model | direction | lc tok BLEU | sacreBLEU | chrF | note |", "|---|---|---:|---:|---:|---|"]
    multi = tformer.load(args.multi, threads=args.threads)
    per_multi = scores(multi, None, args.beam)
    walls = {"multi": wall_time(args.multi)}
    bilingual = {}
    for run in args.bilingual:
        t = tformer.load(run, threads=args.threads)
        (direction, s), = scores(t, None, args.beam).items()
        bilingual[direction] = s
        walls[direction] = wall_time(run)
        table.append(row(f"one pair ({run.name}, {best_step(run)})", direction, s, f"trained {walls[direction] / 60:.1f} min"))
    for direction, s in per_multi.items():
        gap = s["tok_bleu_lc"] - bilingual[direction]["tok_bleu_lc"] if direction in bilingual else float("nan")
        table.append(row(f"one-to-many ({args.multi.name}, {best_step(args.multi)})", direction, s,
                         f"{gap:+.2f} vs one pair; trained {walls['multi'] / 60:.1f} min"))
    if args.m2m:
        m2m = tformer.load(args.m2m, threads=args.threads)
        trained = m2m.languages.directions
        walls["m2m"] = wall_time(args.m2m)
        everything = [f"{a}-{b}" for a in ("en", "de", "fr", "cs") for b in ("en", "de", "fr", "cs") if a != b]
        for direction, s in scores(m2m, everything, args.beam).items():
            note = "supervised" if direction in trained else "zero-shot, direct"
            table.append(row(f"many-to-many ({args.m2m.name}, {best_step(args.m2m)})", direction, s, note))
        for source, target in (("de", "fr"), ("fr", "de")):
            table.append(row(f"many-to-many ({args.m2m.name})", f"{source}-{target}",
                             pivot(m2m, source, target, "en", args.beam), "zero-shot, through en (two passes)"))
    notes = (f"Multi30k test2016 (1,000 captions per direction), beam {args.beam}, length penalty as the recipe; "
             f"lc tok BLEU: Moses-tokenized, lowercased (the Multi30k papers' figure). Training wall times, as "
             f"the runs' logs record them (evaluations included): "
             f"{', '.join(f'{k} {v / 60:.1f} min' for k, v in walls.items())}. {machine()}; this script "
             f"{time.perf_counter() - tic:.0f} s.")
    report("Many languages in one model, Multi30k test2016 (issue 65)", table, notes, args.record)


if __name__ == "__main__":
    main()
