"""tformer graph: pictures of attention structures, from the edge lists the graph kernel computes on."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sp = sub.add_parser("graph", help="draw attention structures (the seed's graphs, or a sparse pattern)",
                        description="Draw, from the edge lists the graph kernel computes on, either the three "
                        "graphs of one sentence pair (default) or the pattern of a packed batch under a "
                        "structure (--pattern). Example: tformer graph --pattern --window 2 --global-tokens 1 "
                        "--lengths 12 7 9 --out window.png")
    sp.add_argument("--out", required=True, help="image file to write (.png, .svg, .pdf)")
    sp.add_argument("--source", default="a dog runs on the beach", help="source sentence (seed graphs)")
    sp.add_argument("--target", default="ein hund rennt am strand", help="target sentence (seed graphs)")
    sp.add_argument("--pattern", action="store_true", help="draw a packed batch's pattern instead")
    sp.add_argument("--lengths", type=int, nargs="+", default=[12, 7, 9], help="sentence lengths (--pattern)")
    sp.add_argument("--window", type=int, default=0, help="keys within +-W positions (0 = all)")
    sp.add_argument("--dilation", type=int, default=1, help="step between window positions")
    sp.add_argument("--global-tokens", type=int, default=0, help="first positions that see and are seen by all")
    sp.add_argument("--edges", default="", help="file of 'query key' pairs, or module:function")
    sp.add_argument("--causal", action="store_true", help="decoder self-attention (keys <= query)")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.config import StructureConfig
    from tformer.errors import ConfigError
    from tformer.structures import build_structure
    from tformer.viz.structures import plot_pattern, plot_seed_graphs

    if args.pattern:
        structure = build_structure(StructureConfig(args.window, args.dilation, args.global_tokens, args.edges))
        if min(args.lengths) < 1:
            raise ConfigError(f"--lengths must be >= 1, got {args.lengths}")
        _, graph = plot_pattern(args.lengths, structure, args.causal, args.out)
        print(f"wrote {args.out}: {graph.n_edges} edges over {sum(args.lengths)} packed tokens "
              f"({structure.describe()}{', causal' if args.causal else ''})")
    else:
        src, tgt = args.source.split(), args.target.split()
        if not src or not tgt:
            raise ConfigError("--source and --target need at least one word each")
        plot_seed_graphs(src, tgt, args.out)
        print(f"wrote {args.out}: {len(src)} source and {len(tgt)} target tokens; edges: {len(src) ** 2} "
              f"encoder, {len(tgt) * (len(tgt) + 1) // 2} decoder, {len(src) * len(tgt)} cross")
    return 0
