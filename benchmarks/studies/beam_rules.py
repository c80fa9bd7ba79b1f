"""Beam search's two rules for endings side by side on a trained model: `top_k` (fairseq, CTranslate2,
Marian: </s> kept only within a step's top K of 2K candidates) and `all` (t5x: every finite ending is a
candidate, exact stop), at several length penalties. For each: BLEU, mean output words, the mean
log-probability of the returned outputs (re-scored by forced decoding; with alpha 0 it is what beam search
ranks by, and `all` never returns less), and time.

    python benchmarks/studies/beam_rules.py [--checkpoint runs/multi30k_en_de] [--beam 5] [--record]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402

import tformer  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.6, 1.0])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    translator = tformer.load(args.checkpoint, device="cpu")
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sources = [line.strip() for line in f]
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    table = ["| length penalty alpha | rule | BLEU | mean words | mean log-probability | seconds |",
             "|---:|---|---:|---:|---:|---:|"]
    for alpha in args.alphas:
        for rule in ("top_k", "all"):
            tic = time.perf_counter()
            out = translator.translate(sources, beam=args.beam, len_penalty=alpha, beam_finish=rule, batch_size=64)
            seconds = time.perf_counter() - tic
            hyps = [t.text for t in out]
            scored = translator.score(sources, hyps)  # the raw log-probability of each output, </s> included
            logp = statistics.mean(s.log_prob for s in scored)
            bleu = translation_scores(hyps, refs, "de").bleu
            words = statistics.mean(len(h.split()) for h in hyps)
            table.append(f"| {alpha} | {rule} | {bleu:.2f} | {words:.1f} | {logp:.3f} | {seconds:.1f} |")
            print(table[-1], flush=True)
    notes = (f"{len(sources)} Multi30k test2016 sentences, beam {args.beam}, batch 64, checkpoint {args.checkpoint}; "
             f"references average {statistics.mean(len(r.split()) for r in refs):.1f} words. With alpha 0 `all` "
             "returns outputs the model scores higher (mean log-probability), which on this model are shorter and "
             "translate worse; its exact stop (bounded by the length penalty at the length limit) costs little here.")
    report(f"Beam search: which endings are kept (beam {args.beam})", table, notes, args.record)


if __name__ == "__main__":
    main()
