"""tformer attention: the attention maps of one sentence's translation (or a forced one), as pictures."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("attention", help="attention maps of one sentence: per kind, layer and head, PNG/SVG",
                        description="Translate a sentence (or force --target) and draw the attention weights "
                        "the model computed: one grid of all heads per kind and layer, or single heads "
                        "(--head). Rows are queries, columns keys, labelled with the tokens; decoder rows are "
                        "labelled by the token they produce. Universal transformers: one map per ACT step, "
                        "positions that had halted left blank. Example: tformer attention --checkpoint "
                        "runs/m30k --sentence 'A dog runs on the beach .' --kind cross --out pics/")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    source = sp.add_mutually_exclusive_group(required=True)
    source.add_argument("--sentence", help="source sentence (raw text)")
    source.add_argument("--audio", help="a speech model's input: an audio file (16 kHz wav/flac/ogg) or .npy "
                        "frames; its keys are the model frames, labelled by the time they start at")
    sp.add_argument("--target", help="draw the attention of this translation instead of the model's own")
    sp.add_argument("--kind", nargs="+", choices=("encoder", "decoder", "cross"),
                    help="which attention (default: all three)")
    sp.add_argument("--layer", type=int, nargs="+", help="layers (or ACT steps) to draw (default: all)")
    sp.add_argument("--head", type=int, nargs="+", help="single heads to draw (default: a grid of all heads)")
    sp.add_argument("--format", nargs="+", default=["png", "svg"], choices=("png", "svg", "pdf"))
    sp.add_argument("--out", default="attention", help="folder for the pictures (default: ./attention)")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.errors import DataError
    from tformer.inspection import KINDS
    from tformer.viz.attention import plot_attention, plot_head_grid, save_figure

    translator = common.load_translator(args)
    if args.print_config:
        common.print_config(translator.config)
        return 0
    if translator.reads_frames != (args.audio is not None):
        raise DataError(f"{args.checkpoint} reads " + ("speech: give --audio FILE" if translator.reads_frames
                                                       else "text: give --sentence"))
    source = args.audio if args.audio is not None else args.sentence
    if args.audio is None and not args.sentence.strip():
        raise DataError("--sentence is empty")
    if args.target is not None:
        if not args.target.strip():
            raise DataError("--target is empty")
        forced = translator.score([source], [args.target], return_attention=True)[0]
        text, score, maps = args.target, forced.log_prob, forced.attention
    else:
        best = translator.translate([source], return_attention=True)[0]
        text, score, maps = best.text, best.score, best.attention
    out = Path(args.out)
    written = []
    for kind in args.kind or list(KINDS):
        layers = args.layer if args.layer is not None else list(range(maps.layers(kind)))
        for layer in layers:
            name = f"{kind}_{maps.layer_name}{layer}"
            figures = ([(plot_head_grid(maps, kind, layer), f"{name}_heads")] if args.head is None else
                       [(plot_attention(maps, kind, layer, h), f"{name}_head{h}") for h in args.head])
            for fig, stem in figures:
                written += save_figure(fig, [out / f"{stem}.{fmt}" for fmt in args.format])
    print(f"source: {len(maps.source)} model frames, {maps.source[-1]} to its last" if args.audio else
          f"source pieces: {' '.join(maps.source[:-1])}")
    print(f"{'forced target' if args.target else 'translation'}: {text}  (score {score:.3f})")
    if maps.steps is not None:
        print(f"ACT steps per source token: {maps.steps[0]}\nACT steps per target token: {maps.steps[1]}")
    print(f"wrote {len(written)} files to {out}/")
    return 0
