"""tformer translate: raw sentences from a file or standard input, one per line, translated line by line; or
documents (--split, --format html, --glossary) through tformer.documents."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

from tformer.commands import common


def add_parser(sub) -> None:
    from tformer.decode.phrases import PHRASE_INPUTS

    sp = sub.add_parser("translate", help="decode lines from stdin or a file",
                        description="Read one raw sentence per line; write one detokenised translation per "
                        "line (same line count; an empty line gives an empty line). With --nbest N > 1, write "
                        "N lines 'index ||| translation ||| score' per input line. With --alignment, each line "
                        "ends in ' ||| ' and the hard alignment, 'source-target' pairs of 0-based piece indices "
                        "('0-0 1-2 2-1', Marian's format; with --nbest: 'index ||| translation ||| score ||| "
                        "alignment'). Every line is checked before any is translated, and --output is written "
                        "only when all is done. Interactive when stdin is a terminal (without --prefix-file). "
                        "Documents: --split takes each line as a paragraph and splits it into sentences; "
                        "--format html reads the whole input as one HTML document or fragment and writes it back "
                        "translated, its markup kept; --glossary holds the terms of a TSV file in the outputs.")
    sp.add_argument("--checkpoint", required=True, action="append", help=common.ENSEMBLE_HELP)
    sp.add_argument("--input", help="input file, plain or gzip (default: standard input)")
    sp.add_argument("--output", help="output file (default: standard output)")
    sp.add_argument("--target", metavar="LANG", help="the language to write (a multilingual model: one of its "
                    "data.pairs targets; the error names them)")
    sp.add_argument("--source", metavar="LANG", help="the input's language, checked against the model's")
    sp.add_argument("--prefix-file", metavar="FILE", help="one target prefix per input line (plain or gzip; an "
                    "empty line: none): each translation begins with its prefix and the model goes on from there; "
                    "the file must have as many lines as the input")
    for phrase in PHRASE_INPUTS:  # per-sentence phrase inputs, as decode.PHRASE_INPUTS declares them
        sp.add_argument(f"--{phrase.name.replace('_', '-')}", dest=phrase.name, metavar="FILE",
                        help=f"one line per input line (plain or gzip), its {phrase.help}, separated by a tab (an "
                        f"empty line: none); at most {phrase.max_phrases} a line; decoding: "
                        f"{' or '.join(phrase.strategies)}")
    common.alignment(sp, "append each translation's hard alignment: for every target piece, the source piece "
                     "its cross-attention weighs most (heads averaged; fairseq's --print-alignment); 0-based "
                     "indices of the pieces, </s> left out")
    sp.add_argument("--max-source-tokens", type=int, default=1024, metavar="N",
                    help="refuse input lines (and prefixes) longer than N pieces, naming the line, before "
                    "translating anything (default 1024; 0 = no limit: attention memory grows with the square of it)")
    g = sp.add_argument_group("documents (tformer.documents: the input is read whole, not streamed)")
    g.add_argument("--split", action="store_true", help="each input line is a paragraph: split it into sentences "
                   "(sentencex, the model's source language), translate them in one batch and write them back on "
                   "its line, between their own spaces")
    g.add_argument("--format", choices=("text", "html"), default="text", help="html: the input is one HTML "
                   "document or fragment; block text is translated in context (split into sentences), inline tags "
                   "follow their words by the model's alignments, comments/code/pre/script/style and "
                   "translate=\"no\" pass through (default: text)")
    g.add_argument("--glossary", metavar="FILE", help="a TSV file, 'source term<TAB>target term' per line: a "
                   "term found in a sentence (whole words, any case) must appear in its translation, by "
                   "lexically constrained beam search (needs --beam N, N >= 2)")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.api import format_translation
    from tformer.decode.phrases import PHRASE_INPUTS
    from tformer.errors import DataError

    translator = common.load_translator(args, max_source_tokens=args.max_source_tokens)
    if args.print_config:
        common.print_config(translator.config)
        return 0
    if args.split or args.format == "html" or args.glossary:
        return _documents(args, translator)
    nbest = translator.config.decode.nbest > 1
    options = {**common.alignment_options(args), "target": args.target, "source": args.source}
    translator.translate_iterable([], **options)  # the options checked before any line is read
    phrase_files = {p.name: getattr(args, p.name) for p in PHRASE_INPUTS if getattr(args, p.name)}
    print(f"tformer: translating with {common.describe_decode(translator.config, common.decode_overrides(args))}",
          file=sys.stderr)
    if not args.input and not args.prefix_file and not phrase_files and sys.stdin.isatty():  # answer each line
        print("tformer: one sentence per line, Ctrl-D ends", file=sys.stderr)
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
    options.update(prefix_file=args.prefix_file, phrase_files=phrase_files)
    if args.input:
        translator.translate_file(args.input, args.output or sys.stdout, **options)
        return 0
    with tempfile.TemporaryFile() as spool:  # a pipe is read once: keep it, to check every line first
        shutil.copyfileobj(sys.stdin.buffer, spool)
        translator.translate_file(spool, args.output or sys.stdout, name="standard input", **options)
    return 0


def _documents(args: argparse.Namespace, translator) -> int:
    """--split, --format html, --glossary: the whole input read, translated by tformer.documents, written."""
    from tformer.decode.phrases import PHRASE_INPUTS
    from tformer.documents import Glossary, translate_documents
    from tformer.errors import ConfigError
    from tformer.files import writing

    phrase_flags = tuple((f"--{p.name.replace('_', '-')}", getattr(args, p.name)) for p in PHRASE_INPUTS)
    for flag, given in (("--prefix-file", args.prefix_file), ("--alignment", args.alignment),
                        ("--nbest", translator.config.decode.nbest > 1), *phrase_flags):
        if given:
            raise ConfigError(f"{flag} is for sentences one per line; --split, --format html and --glossary write "
                              "one translation per document")
    glossary = Glossary.read(args.glossary) if args.glossary else None
    name = args.input or "standard input"
    raw = open(args.input, "rb").read() if args.input else sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        from tformer.errors import DataError

        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{name}, line {line}: not UTF-8 (byte {e.start}); save it as UTF-8") from None
    languages = dict(lang=args.source, target=args.target, source=args.source)
    if args.format == "html":
        out = translate_documents(translator, [text], format="html", split=True, glossary=glossary, **languages)[0]
    else:
        lines = text.splitlines()
        out = "".join(t + "\n" for t in translate_documents(translator, lines, split=args.split,
                                                            glossary=glossary, **languages))
    with writing(args.output or sys.stdout) as f:
        f.write(out)
    return 0
