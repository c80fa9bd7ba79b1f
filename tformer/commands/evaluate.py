"""tformer evaluate: a checkpoint's scores on a split of the data it was trained with."""

from __future__ import annotations

import argparse
import json

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("evaluate", help="BLEU/chrF (translation), CER/WER (speech) or exact match on a split",
                        description="Evaluate a checkpoint on a split of the data it was trained with: "
                        "teacher-forced loss and accuracy, then free-running decoding scored by sacreBLEU, "
                        "chrF and tokenized BLEU, cased and lowercased (translation), character and word error "
                        "rates (speech) or exact match (synthetic tasks).")
    sp.add_argument("--checkpoint", required=True, action="append", help=common.ENSEMBLE_HELP)
    sp.add_argument("--split", default="test", choices=("train", "valid", "test", "test_uniform"),
                    help="test_uniform (copy, sort): test_size sequences, every length in [data.min_len, "
                    "data.max_len] alike, whatever the training lengths were")
    sp.add_argument("--examples", type=int, default=0, help="also print this many decoded examples")
    sp.add_argument("--output", help="write the detokenised hypotheses here, one per line")
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON line")
    sp.add_argument("--pairs", nargs="+", metavar="SRC-TGT",
                    help="a multilingual model: the directions to score (default: data.pairs; others of its "
                    "languages are zero-shot), each on its own and their mean")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def _length_buckets(by_length: dict[int, tuple[int, int]], most: int = 8) -> list[tuple[str, int, int]]:
    """Per-length (exact, n) grouped into at most `most` buckets of equal width: (label, exact, n)."""
    lo, hi = min(by_length), max(by_length)
    width = -(-(hi - lo + 1) // most)
    out = []
    for start in range(lo, hi + 1, width):
        end = min(start + width - 1, hi)
        counts = [by_length[n] for n in range(start, end + 1) if n in by_length]
        if counts:
            out.append((f"{start}-{end}" if end > start else f"{start}", sum(e for e, _ in counts),
                        sum(n for _, n in counts)))
    return out


def run(args: argparse.Namespace) -> int:
    from tformer.config import SPEECH_TASKS, SYNTHETIC_TASKS, to_dict
    from tformer.data.synthetic import exact_match_by_length

    translator = common.load_translator(args)
    cfg = translator.config
    if args.print_config:
        common.print_config(cfg)
        return 0
    result = translator.evaluate(args.split, args.pairs)
    metrics, scores = result.metrics, result.scores
    if args.output:
        with common.output(args.output) as f:
            f.write("".join(o + "\n" for o in result.outputs))
    report = {"checkpoint": str(translator.path), "split": args.split, **metrics, "seconds": round(result.seconds, 2),
              "decode": to_dict(result.decode), "attention": cfg.model.attention}
    by_length = (exact_match_by_length(result.outputs, result.references)
                 if cfg.data.task in SYNTHETIC_TASKS and result.references else {})
    if by_length:
        report["exact_match_by_length"] = {str(n): {"exact_match": e / c, "n": c} for n, (e, c) in by_length.items()}
    if scores:
        report["signatures"] = _signatures(scores)
    if result.directions:
        report["directions"] = {name: {**s.as_dict(), "signatures": _signatures(s)}
                                for name, s in result.directions.items()}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"checkpoint {translator.path}  split {args.split} ({metrics['n']} examples)")
        print(f"  loss {metrics['loss']:.4f}  nll {metrics['nll']:.4f}  ppl {metrics['ppl']:.3f}  "
              f"token accuracy (teacher-forced) {metrics['token_acc']:.4f}")
        if result.directions:
            print(f"  {'direction':10} {'sacreBLEU':>9} {'chrF':>6} {'tok BLEU':>8} {'lc tok BLEU':>11}")
            rows = [*((n, s.as_dict()) for n, s in result.directions.items()), ("mean", metrics)]
            for name, d in rows:
                print(f"  {name:10} {d['bleu']:9.2f} {d['chrf']:6.2f} {d['tok_bleu']:8.2f} {d['tok_bleu_lc']:11.2f}")
            first = next(iter(result.directions.values()))
            print(f"  signatures: {first.bleu_signature}; {first.tok_bleu_lc_signature} (lowercased tokenized BLEU: "
                  "the figure Multi30k papers report)")
        elif scores:
            print(f"  sacreBLEU      {scores.bleu:6.2f}   {scores.bleu_signature}")
            print(f"  chrF           {scores.chrf:6.2f}   {scores.chrf_signature}")
            print(f"  tokenized BLEU {scores.tok_bleu:6.2f}   {scores.tok_bleu_signature}")
            print(f"  tokenized BLEU {scores.tok_bleu_lc:6.2f}   {scores.tok_bleu_lc_signature}  "
                  "(lowercased: the figure Multi30k papers report)")
            if scores.tok_bleu_compound is not None:
                print(f"  tokenized BLEU {scores.tok_bleu_compound:6.2f}   {scores.tok_bleu_compound_signature}  "
                      "(compounds split: the figure WMT14 en-de papers report)")
        elif cfg.data.task in SPEECH_TASKS:
            print(f"  character error rate {metrics['cer']:6.2f}%   word error rate {metrics['wer']:6.2f}%")
        else:
            print(f"  exact match (free-running)  {metrics['exact_match']:.4f}")
            if by_length:
                print("  by length: " + "  ".join(f"{label} {e / n:.3f} ({n})"
                                                  for label, e, n in _length_buckets(by_length)))
        print(f"  decoding: {common.describe_decode(cfg)}; {result.seconds:.1f}s")
    common.show_examples(result.sources, result.references, result.outputs, args.examples)
    return 0


def _signatures(scores) -> dict[str, str]:
    return {"bleu": scores.bleu_signature, "chrf": scores.chrf_signature, "tok_bleu": scores.tok_bleu_signature,
            "tok_bleu_lc": scores.tok_bleu_lc_signature,
            **({"tok_bleu_compound": scores.tok_bleu_compound_signature} if scores.tok_bleu_compound is not None
               else {})}
