"""`tformer <command>`: parse the command line, then run the command's module (tformer/commands/).

    tformer train     --config copy [section.key=value ...] [--run-dir DIR] [--resume]
    tformer prepare   --config C --out DIR [data.key=value ...]   a corpus into memory-mapped shards, once
    tformer evaluate  --checkpoint RUN_DIR [--split test] [--beam 5] [decode.key=value ...]
    tformer translate --checkpoint RUN_DIR [--input FILE] [--output FILE] [--beam 5 --nbest 3 --batch-size 64]
                      [--prefix-file FILE] [--alignment] [--int8] [--batch-tokens 4096]
    tformer score     --checkpoint RUN_DIR [--input FILE] [--output FILE] [--format tsv|jsonl]   log-probabilities
                      of 'source<TAB>target' lines, in total and per token
    tformer transcribe --checkpoint RUN_DIR FILE.npy ... | --tsv FILE
    tformer data      {multi30k,wmt14} --out DIR | {copy,sort} --out DIR [--config FILE] [data.key=value ...]
    tformer distill   --checkpoint TEACHER --src train.en [--ref train.de] --out DIR [--student RECIPE]
    tformer shortlist --checkpoint RUN_DIR --src train.en --tgt train.de --out FILE   a lexical shortlist
    tformer average   --run-dir RUN_DIR --last 5 --out DIR
    tformer ponder    --checkpoint RUN_DIR --out DIR [--sentence "..."]   ACT steps of a universal transformer
    tformer attention --checkpoint RUN_DIR --sentence "..." [--kind cross] [--layer 2] [--head 0] [--out DIR]
    tformer plot      RUN_DIR                         training curves
    tformer animate   RUN_DIR [--every-head]          GIFs of the attention recorded over training
    tformer explore   --checkpoint RUN_DIR [--port 8000]   the explorer page on 127.0.0.1
    tformer serve     --checkpoint RUN_DIR [--port 8000] [--api-key K]   batching HTTP service (+ LibreTranslate API)
    tformer export    --format ctranslate2|argos|hf-marian|hf-m2m100|hf-mbart|onnx RUN_DIR OUT
    tformer import    hf-marian|hf-m2m100|hf-nllb|hf-mbart|marian FOLDER RUN_DIR   a foreign model, converted once
    tformer recipes   [NAME]                          the packaged recipes, or one of them
    tformer graph     --out FILE [--pattern --window 2 ...]   attention structures as pictures
    tformer demo      train the copy task, then show its test accuracy and a few decoded examples

Errors: a tformer.errors.TformerError (a bad file, setting, checkpoint or argument) and an OSError (a file the
command line names: missing, unreadable, a full disk) print one line and exit with status 2; anything else is
a bug in tformer and shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tformer.commands import (animate, attention, average, convert, data, demo, distill, evaluate, explore, export,
                              graph, plot, ponder, prepare, recipes, score, serve, shortlist, train, transcribe,
                              translate)
from tformer.errors import TformerError, spoken

COMMANDS = (train, prepare, evaluate, translate, score, transcribe, data, distill, shortlist, average, ponder, attention,
            plot, animate, explore, serve, export, convert, graph, recipes, demo)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tformer",
        description="Transformer sequence-to-sequence models: train, evaluate, translate.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings: a YAML file or packaged recipe (--config) and dotted overrides such as model.d_model=512 "
               "or\ntrain.max_steps=2000; unknown keys and wrong types are errors. Packaged recipes: `tformer "
               "recipes` lists them\n(copy, multi30k_quick, multi30k_en_de, ...). Everything here is also a Python "
               "API: import tformer.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MPLBACKEND", "Agg")  # commands write picture files; never open a window
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    for item in extra:  # overrides may stand anywhere, also after options (argparse leaves those over)
        if item.startswith("-") or "=" not in item or not hasattr(args, "overrides"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides.append(item)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    try:
        with spoken("command line"):
            return args.func(args)
    except TformerError as e:  # a file, a setting, a checkpoint, an argument: a message, not a traceback
        print(f"tformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (tformer recipes | head): nothing to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        return 141
    except OSError as e:  # a file the command line names: missing, unreadable, a full disk
        where = f" ({e.filename})" if e.filename else ""
        print(f"tformer {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
