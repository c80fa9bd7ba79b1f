"""tformer animate: GIFs of the attention a run recorded over training (train.attention_examples)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    sp = sub.add_parser("animate", help="GIFs of attention over training (runs with train.attention_examples)",
                        description="Animate the attention that training recorded for fixed validation examples "
                        "(train.attention_examples=N): one frame per evaluation, from the untrained model on. "
                        "Writes a grid of all heads per kind and layer, plus single heads with --head or "
                        "--every-head, plus the ACT steps per token for universal transformers.")
    sp.add_argument("run_dir", metavar="RUN_DIR", help="run folder")
    sp.add_argument("--example", type=int, default=0, help="which recorded example (default 0)")
    sp.add_argument("--kind", nargs="+", choices=("encoder", "decoder", "cross"), help="default: all three")
    sp.add_argument("--layer", type=int, nargs="+", help="layers (or ACT steps) (default: all)")
    sp.add_argument("--head", type=int, nargs="+", help="single heads only (no grid)")
    sp.add_argument("--every-head", action="store_true", help="also one GIF per head")
    sp.add_argument("--ms", type=int, default=400, help="milliseconds per frame (default 400)")
    sp.add_argument("--dpi", type=int, default=100, help="resolution (default 100; lower gives smaller files)")
    sp.add_argument("--out", help="folder for the GIFs (default: RUN_DIR/animations)")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.errors import DataError
    from tformer.inspection import KINDS
    from tformer.viz.record import animate_attention, animate_head_grid, animate_steps, load_recording

    rec = load_recording(args.run_dir)
    out = Path(args.out) if args.out else Path(args.run_dir) / "animations"
    if not 0 <= args.example < rec.n_examples:
        raise DataError(f"the recording has {rec.n_examples} examples (0..{rec.n_examples - 1}); got {args.example}")
    maps = rec.maps[-1][args.example]
    written = []
    for kind in args.kind or KINDS:
        n_layers = max(frame[args.example].layers(kind) for frame in rec.maps)
        for layer in args.layer if args.layer is not None else range(n_layers):
            stem = f"ex{args.example}_{kind}_{maps.layer_name}{layer}"
            if args.head is None:
                written.append(animate_head_grid(rec, args.example, kind, layer, out / f"{stem}_heads.gif", args.ms,
                                                 dpi=args.dpi))
            for head in (args.head if args.head is not None else range(maps.heads()) if args.every_head else []):
                written.append(animate_attention(rec, args.example, kind, layer, head, out / f"{stem}_head{head}.gif",
                                                 args.ms, dpi=args.dpi))
    if maps.steps is not None:
        written.append(animate_steps(rec, args.example, out / f"ex{args.example}_act_steps.gif", ms_per_frame=args.ms,
                                     dpi=args.dpi))
    print(f"{len(rec.steps)} recorded steps ({rec.steps[0]} .. {rec.steps[-1]}); source: {' '.join(maps.source)}")
    print(f"wrote {len(written)} GIFs to {out}/")
    return 0
