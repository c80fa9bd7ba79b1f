"""tformer evaluate: a checkpoint's scores on a split of the data it was trained with."""

from __future__ import annotations

import argparse
import json

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("evaluate", help="BLEU/chrF (translation), CER/WER (speech) or exact match on a split",
                        description="Evaluate a checkpoint on a split of the data it was trained with: "
                        "teacher-forced loss and accuracy, then free-running decoding scored by sacreBLEU, "
                        "chrF and tokenized BLEU (translation), character and word error rates (speech) or "
                        "exact match (synthetic tasks).")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    sp.add_argument("--split", default="test", choices=("train", "valid", "test"))
    sp.add_argument("--examples", type=int, default=0, help="also print this many decoded examples")
    sp.add_argument("--output", help="write the detokenised hypotheses here, one per line")
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON line")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.config import SPEECH_TASKS, to_dict

    translator = common.load_translator(args)
    cfg = translator.config
    if args.print_config:
        common.print_config(cfg)
        return 0
    result = translator.evaluate(args.split)
    metrics, scores = result.metrics, result.scores
    if args.output:
        with common.output(args.output) as f:
            f.write("".join(o + "\n" for o in result.outputs))
    report = {"checkpoint": str(translator.path), "split": args.split, **metrics, "seconds": round(result.seconds, 2),
              "decode": to_dict(result.decode), "attention": cfg.model.attention}
    if scores:
        report["signatures"] = {"bleu": scores.bleu_signature, "chrf": scores.chrf_signature,
                                "tok_bleu": scores.tok_bleu_signature,
                                **({"tok_bleu_compound": scores.tok_bleu_compound_signature}
                                   if scores.tok_bleu_compound is not None else {})}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"checkpoint {translator.path}  split {args.split} ({metrics['n']} examples)")
        print(f"  loss {metrics['loss']:.4f}  nll {metrics['nll']:.4f}  ppl {metrics['ppl']:.3f}  "
              f"token accuracy (teacher-forced) {metrics['token_acc']:.4f}")
        if scores:
            print(f"  sacreBLEU      {scores.bleu:6.2f}   {scores.bleu_signature}")
            print(f"  chrF           {scores.chrf:6.2f}   {scores.chrf_signature}")
            print(f"  tokenized BLEU {scores.tok_bleu:6.2f}   {scores.tok_bleu_signature}")
            if scores.tok_bleu_compound is not None:
                print(f"  tokenized BLEU {scores.tok_bleu_compound:6.2f}   {scores.tok_bleu_compound_signature}  "
                      "(compounds split: the figure WMT14 en-de papers report)")
        elif cfg.data.task in SPEECH_TASKS:
            print(f"  character error rate {metrics['cer']:6.2f}%   word error rate {metrics['wer']:6.2f}%")
        else:
            print(f"  exact match (free-running)  {metrics['exact_match']:.4f}")
        print(f"  decoding: {common.describe_decode(cfg)}; {result.seconds:.1f}s")
    common.show_examples(result.sources, result.references, result.outputs, args.examples)
    return 0
