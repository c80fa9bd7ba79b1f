"""tformer translate: raw sentences from a file or standard input, one per line, translated line by line."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("translate", help="decode lines from stdin or a file",
                        description="Read one raw sentence per line; write one detokenised translation per "
                        "line (same line count; an empty line gives an empty line). With --nbest N > 1, write "
                        "N lines 'index ||| translation ||| score' per input line. With --alignment, each line "
                        "ends in ' ||| ' and the hard alignment, 'source-target' pairs of 0-based piece indices "
                        "('0-0 1-2 2-1', Marian's format; with --nbest: 'index ||| translation ||| score ||| "
                        "alignment'). Every line is checked before any is translated, and --output is written "
                        "only when all is done. Interactive when stdin is a terminal (without --prefix-file).")
    sp.add_argument("--checkpoint", required=True, action="append", help=common.ENSEMBLE_HELP)
    sp.add_argument("--input", help="input file, plain or gzip (default: standard input)")
    sp.add_argument("--output", help="output file (default: standard output)")
    sp.add_argument("--prefix-file", metavar="FILE", help="one target prefix per input line (plain or gzip; an "
                    "empty line: none): each translation begins with its prefix and the model goes on from there; "
                    "the file must have as many lines as the input")
    common.alignment(sp, "append each translation's hard alignment: for every target piece, the source piece "
                     "its cross-attention weighs most (heads averaged; fairseq's --print-alignment); 0-based "
                     "indices of the pieces, </s> left out")
    sp.add_argument("--max-source-tokens", type=int, default=1024, metavar="N",
                    help="refuse input lines (and prefixes) longer than N pieces, naming the line, before "
                    "translating anything (default 1024; 0 = no limit: attention memory grows with the square of it)")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.api import format_translation
    from tformer.errors import DataError

    translator = common.load_translator(args, max_source_tokens=args.max_source_tokens)
    if args.print_config:
        common.print_config(translator.config)
        return 0
    nbest = translator.config.decode.nbest > 1
    options = common.alignment_options(args)
    translator.translate_iterable([], **options)  # the options checked before any line is read
    if not args.input and not args.prefix_file and sys.stdin.isatty():  # interactive: answer each line as it comes
        print(f"tformer: translating with {common.describe_decode(translator.config)}; one sentence per line, "
              "Ctrl-D ends", file=sys.stderr)
        for n, line in enumerate(sys.stdin, 1):
            try:
                translation = next(translator.translate_iterable([line], name="standard input", first_line=n,
                                                                 **options))
            except DataError as e:  # say so, answer with an empty line and go on: the session is not lost
                print(f"tformer translate: {e}", file=sys.stderr)
                translation = translator.translate([""], **options)[0]
            sys.stdout.write(format_translation(translation, n - 1, nbest, args.alignment))
            sys.stdout.flush()
        return 0
    options.update(prefix_file=args.prefix_file)
    if args.input:
        translator.translate_file(args.input, args.output or sys.stdout, **options)
        return 0
    with tempfile.TemporaryFile() as spool:  # a pipe is read once: keep it, to check every line first
        shutil.copyfileobj(sys.stdin.buffer, spool)
        translator.translate_file(spool, args.output or sys.stdout, name="standard input", **options)
    return 0
