"""The repetition penalty on a trained translation model: how often outputs repeat themselves, and what the
penalty costs in BLEU, for each penalty, beside the references' own rates.

    python benchmarks/studies/repetition_penalty.py --checkpoint runs/m30k_quick [--penalties 1 1.1 1.2 1.5]
        [--beams 1 5] [--split test] [--record]

Repeats are counted on whitespace words of the detokenised outputs: an output with a word twice in a row ("die
die"), and one whose word trigrams hold a duplicate. Scores: sacreBLEU and lowercased tokenized BLEU
(tformer.metrics.translation_scores). Each setting decodes the whole split once; the seconds are its wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import report  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.data.translation import read_split  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def repeats(lines: list[str]) -> tuple[int, int]:
    """(lines with a word twice in a row, lines whose word trigrams hold a duplicate)."""
    doubled = looped = 0
    for line in lines:
        w = line.split()
        doubled += any(a == b for a, b in zip(w, w[1:]))
        grams = list(zip(w, w[1:], w[2:]))
        looped += len(set(grams)) < len(grams)
    return doubled, looped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a translation run (or checkpoint) folder")
    ap.add_argument("--penalties", type=float, nargs="+", default=[1.0, 1.1, 1.2, 1.5])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--split", default="test", help="the run's split: valid or test")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    data = load_checkpoint(args.checkpoint).cfg.data
    corpus = read_split(data, args.split)  # the run's own files (data.dir; a moved run: pass data.dir=...)
    sources, refs = corpus.src, corpus.tgt
    translator = tformer.load(args.checkpoint)
    d_ref, l_ref = repeats(refs)
    n = len(refs)
    table = ["| decoding | penalty | sacreBLEU | lowercased tok. BLEU | word twice in a row | repeated word trigram "
             "| mean words | seconds |", "|---|---:|---:|---:|---:|---:|---:|---:|",
             f"| references | | | | {d_ref} ({100 * d_ref / n:.1f}%) | {l_ref} ({100 * l_ref / n:.1f}%) | "
             f"{sum(len(r.split()) for r in refs) / n:.2f} | |"]
    for beam in args.beams:
        for penalty in args.penalties:
            tic = time.perf_counter()
            hyps = [t.text for t in translator.translate(sources, beam=beam, repetition_penalty=penalty)]
            seconds = time.perf_counter() - tic
            s = translation_scores(hyps, refs, data.tgt_lang)
            doubled, looped = repeats(hyps)
            name = "greedy" if beam == 1 else f"beam {beam}"
            table.append(f"| {name} | {penalty:g} | {s.bleu:.2f} | {s.tok_bleu_lc:.2f} | {doubled} "
                         f"({100 * doubled / n:.1f}%) | {looped} ({100 * looped / n:.1f}%) | "
                         f"{sum(len(h.split()) for h in hyps) / n:.2f} | {seconds:.1f} |")
            print(table[-1], flush=True)
    notes = (f"{args.checkpoint}, {args.split} split ({n} sentences, {corpus.origin}), the run's own length limits and "
             f"length penalty; penalty 1 is no penalty.")
    report(f"Repetition penalty on a trained model ({Path(args.checkpoint).name}, {args.split})", table, notes,
           args.record)


if __name__ == "__main__":
    main()
