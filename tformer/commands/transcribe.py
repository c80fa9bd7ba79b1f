"""tformer transcribe: audio (wav/flac/ogg) or feature (.npy) files through a speech model, 'id<TAB>text' out."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("transcribe", help="transcribe audio or feature files with a speech model",
                        description="Decode utterances and write 'id<TAB>transcript' lines. Input: audio files "
                        "(16 kHz mono .wav, .flac or .ogg: their log-mel filterbanks are computed as in training), "
                        "feature files (numpy .npy, (frames, model.feature_dim)), or --tsv of 'id<TAB>anything' "
                        "lines with {id}.flac (or .wav, .ogg, .npy) beside it.")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    sp.add_argument("files", nargs="*", default=[], metavar="FILE", help="audio (.wav, .flac, .ogg) or .npy files")
    sp.add_argument("--tsv", help="a list of utterances (the 'speech' data format)")
    sp.add_argument("--output", help="output file (default: standard output)")
    common.decoding(sp)
    sp.set_defaults(func=run, overrides=[])


def run(args: argparse.Namespace) -> int:
    from tformer.data.speech import read_speech_split
    from tformer.errors import ConfigError

    translator = common.load_translator(args)
    cfg = translator.config
    if not translator.reads_frames:
        raise ConfigError(f"{args.checkpoint} reads token ids; use tformer translate")
    if bool(args.tsv) == bool(args.files):
        raise ConfigError("give either --tsv FILE (id<TAB>transcript lines, audio or .npy files beside it) or "
                          "audio/.npy files")
    if args.tsv:
        tsv = Path(args.tsv)
        data_cfg = dataclasses.replace(cfg.data, dir=str(tsv.parent), test_prefix=tsv.name.removesuffix(".tsv"))
        utts = read_speech_split(data_cfg, "test", cfg.model.feature_dim)
        ids, frames = utts.ids, utts.frames
    else:
        ids = [Path(f).stem for f in args.files]
        frames = list(args.files)  # read by the Translator: audio gets its filterbanks, .npy is read as it is
    lines = [f"{i}\t{t.text}\n" for i, t in zip(ids, translator.translate(frames))]
    with common.output(args.output) as f:
        f.write("".join(lines))
    return 0
