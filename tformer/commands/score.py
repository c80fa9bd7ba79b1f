"""tformer score: forced decoding of 'source<TAB>target' lines (fairseq's scoring of references, CTranslate2's
score_batch): the log-probability of each target, in total and token by token."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "score", help="log-probabilities of given translations (forced decoding)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read 'source<TAB>target' lines (raw sentences; an empty target scores </s> alone) and\n"
        "write, for each, how probable the model finds the target given the source, </s> included.\n\n"
        "--format tsv (default), one line per input line, tab-separated:\n"
        "  TOTAL  LP1 LP2 ... LPn  [PIECE1 PIECE2 ... </s>]  [ALIGNMENT]\n"
        "  TOTAL: log P(target </s> | source), the sum of the LPs (natural log, 4 decimals); LP: one\n"
        "  per target piece, </s> last; the pieces with --pieces; '0-0 1-2 ...' (source-target piece\n"
        "  indices) with --alignment.\n"
        "--format jsonl, one JSON object per line, full precision:\n"
        '  {"log_prob": -4.21, "tokens": ["Ein", "Hund", "</s>"], "token_log_probs": [-1.5, -2.6, -0.11]\n'
        '   [, "alignment": [[0, 0], [1, 1]]]}\n\n'
        "Every line is checked first (exactly one tab, a non-empty source, UTF-8, lengths): a bad line is\n"
        "an error naming the file and line, before anything is written; --output is written only when all\n"
        "is done. Large inputs stream in constant memory.")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    sp.add_argument("--input", help="'source<TAB>target' lines, plain or gzip (default: standard input)")
    sp.add_argument("--output", help="output file (default: standard output)")
    sp.add_argument("--format", choices=("tsv", "jsonl"), default="tsv", help="output format (see above)")
    sp.add_argument("--pieces", action="store_true", help="tsv: add the target pieces the log-probabilities belong "
                    "to, as a column (jsonl always has them)")
    common.alignment(sp, "add each target's hard alignment (as translate --alignment)")
    sp.add_argument("--max-source-tokens", type=int, default=1024, metavar="N",
                    help="refuse lines whose source or target is longer than N pieces, naming the line, before "
                    "scoring anything (default 1024; 0 = no limit)")
    common.batching(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    translator = common.load_translator(args, max_source_tokens=args.max_source_tokens)
    if args.print_config:
        common.print_config(translator.config)
        return 0
    options = dict(format=args.format, pieces=args.pieces, **common.alignment_options(args))
    if args.input:
        translator.score_file(args.input, args.output or sys.stdout, **options)
        return 0
    with tempfile.TemporaryFile() as spool:  # a pipe is read once: keep it, to check every line first
        shutil.copyfileobj(sys.stdin.buffer, spool)
        translator.score_file(spool, args.output or sys.stdout, name="standard input", **options)
    return 0
