"""Lexically constrained beam search on a trained model: reference words given as constraints, how often the
outputs hold them, what they do to BLEU, and what they cost in time, beside unconstrained beam search.

    python benchmarks/studies/constraints.py --checkpoint runs/m30k_quick [--split test] [--beam 5] [--rounds 2]
        [--per-sentence 1 3] [--seed 0] [--record]

Each sentence gets 1 to 3 words of its reference (seeded draw among the words with a letter, their
surrounding punctuation stripped; a word the target vocabulary cannot spell without <unk> is not drawn).
"Held" counts outputs whose detokenised text contains every constraint, and outputs whose pieces hold each
constraint's pieces. Settings take turns for `rounds` rounds on the whole split; the time is the median.
"no banks" is an ablation, not a setting: the same rule without dynamic beam allocation (the candidates taken
in score order, tformer.decode.constraints.choose replaced), to show what the banks are for.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import report  # noqa: E402

import torch  # noqa: E402

import tformer  # noqa: E402
import tformer.decode.constraints as constraints_module  # noqa: E402  (choose: where the banks take candidates)
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.data.translation import read_split  # noqa: E402
from tformer.data.vocab import Vocab  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def draw(translator, refs: list[str], low: int, high: int, seed: int) -> list[list[str]]:
    """1..3 reference words per sentence (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for ref in refs:
        words = [w.strip(".,;:!?\"'()") for w in ref.split()]
        words = [w for w in words if any(c.isalpha() for c in w) and Vocab.unk not in translator.encode(w, "target")]
        out.append(rng.sample(words, min(len(words), rng.randint(low, high))))
    return out


def held(translator, hyps: list[str], wanted: list[list[str]]) -> tuple[int, int]:
    text = sum(all(w in h for w in ws) for h, ws in zip(hyps, wanted))
    pieces = 0
    for h, ws in zip(hyps, wanted):
        ids = translator.encode(h, "target")
        ok = True
        for w in ws:
            p = translator.encode(w, "target")
            ok &= any(ids[j:j + len(p)] == p for j in range(len(ids)))
        pieces += ok
    return text, pieces


def score_order(scores, banks, n):
    """The ablation's selection: the n best candidates, banks ignored."""
    return scores.argsort(dim=1, descending=True, stable=True)[:, :n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a translation run (or checkpoint) folder")
    ap.add_argument("--split", default="test", help="the run's split: valid or test")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-sentence", type=int, nargs=2, default=[1, 3], metavar=("LOW", "HIGH"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    data = load_checkpoint(args.checkpoint).cfg.data
    corpus = read_split(data, args.split)
    sources, refs = corpus.src, corpus.tgt
    translator = tformer.load(args.checkpoint)
    wanted = draw(translator, refs, *args.per_sentence, args.seed)
    n = len(refs)
    settings = {"beam, no constraints": None, "beam, constraints": wanted, "beam, constraints, no banks": wanted}
    times: dict[str, list[float]] = {k: [] for k in settings}
    outputs: dict[str, list[str]] = {}
    real_choose = constraints_module.choose
    for _ in range(args.rounds):
        for name, constraints in settings.items():
            constraints_module.choose = score_order if "no banks" in name else real_choose
            tic = time.perf_counter()
            outputs[name] = [t.text for t in translator.translate(sources, beam=args.beam, constraints=constraints)]
            times[name].append(time.perf_counter() - tic)
            print(f"{name}: {times[name][-1]:.1f} s", flush=True)
    constraints_module.choose = real_choose
    base = statistics.median(times["beam, no constraints"])
    table = ["| decoding | held (text) | held (pieces) | sacreBLEU | chrF | mean words | seconds (median) | time vs "
             "unconstrained |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, hyps in outputs.items():
        s = translation_scores(hyps, refs, data.tgt_lang)
        text, pieces = held(translator, hyps, wanted)
        seconds = statistics.median(times[name])
        table.append(f"| {name} | {text}/{n} ({100 * text / n:.1f}%) | {pieces}/{n} ({100 * pieces / n:.1f}%) | "
                     f"{s.bleu:.2f} | {s.chrf:.2f} | {sum(len(h.split()) for h in hyps) / n:.2f} | {seconds:.1f} | "
                     f"{seconds / base:.2f}x |")
    counts = [len(w) for w in wanted]
    notes = (f"{args.checkpoint}, {args.split} split ({n} sentences, {corpus.origin}), beam {args.beam}, the run's "
             f"length limits and penalty, {torch.get_num_threads()} threads, {args.rounds} rounds taking turns. "
             f"Constraints: {sum(counts)} reference words ({sum(counts) / n:.2f} per sentence, "
             f"{args.per_sentence[0]}-{args.per_sentence[1]} drawn, seed {args.seed}); unconstrained outputs already "
             f"hold them in the 'no constraints' row's 'held' column.")
    report(f"Lexically constrained beam search ({Path(args.checkpoint).name}, {args.split})", table, notes,
           args.record)


if __name__ == "__main__":
    main()
