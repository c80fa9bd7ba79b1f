"""tformer distill: a teacher translates a training corpus for a student to learn from (tformer.distill)."""

from __future__ import annotations

import argparse

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("distill", help="a teacher translates a training corpus, for a student (knowledge distillation)",
                        description="Sequence-level knowledge distillation's corpus: the teacher (--checkpoint; give "
                        "it several times for an ensemble, or an imported OPUS-MT folder) translates --src with the "
                        "decoding flags (beam search: --beam 5), and --out gets train.SRC and train.TGT (the "
                        "checkpoint's languages), line by line. It resumes: chunks of --chunk-size lines are "
                        "written as they are done, and running the same command again goes on after the last one "
                        "written. With --ref (the corpus's target side) and --nbest N, the hypothesis of the N-best "
                        "closest to the reference by sentence chrF is kept (the Firefox Translations pipeline's "
                        "selection). Then train a student on the folder: tformer train --config RECIPE "
                        "data.dir=OUT (with the valid and test files beside it).")
    sp.add_argument("--checkpoint", required=True, action="append", help=common.ENSEMBLE_HELP)
    sp.add_argument("--src", required=True, help="the corpus's source side, one sentence per line (plain or gzip)")
    sp.add_argument("--ref", help="its target side, for --nbest selection")
    sp.add_argument("--out", required=True, help="the folder: train.SRC, train.TGT, distill.json, parts/")
    sp.add_argument("--chunk-size", type=int, default=10_000, metavar="N",
                    help="lines translated and written at a time: what a stop can lose (default 10000)")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a progress bar")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.distill import distill_corpus

    teacher = common.load_translator(args)
    if args.print_config:
        common.print_config(teacher.config)
        return 0
    report = distill_corpus(teacher, args.src, args.out, references=args.ref, chunk_size=args.chunk_size,
                            progress=args.progress)
    again = f" ({report.resumed_chunks} of {report.chunks} chunks from an earlier run)" if report.resumed_chunks else ""
    print(f"{report.sources}, {report.targets}: {report.lines:,} lines{again} in {report.seconds:.1f} s")
    return 0
