"""tformer explore: the explorer web page for one checkpoint, on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from tformer.commands import common

log = logging.getLogger("tformer")


def add_parser(sub) -> None:
    sp = sub.add_parser("explore", help="a local web page: translate, n-best, attention heatmaps and graphs",
                        description="Serve a web page for one checkpoint: type a sentence, get its translation "
                        "and n-best list with scores, and look at the attention of any hypothesis by kind, "
                        "layer and head, as a heatmap and as the bipartite token graph; universal transformers "
                        "also show the ACT steps per token. Binds 127.0.0.1 (this machine only) by default. The "
                        "same service as `tformer serve` (its JSON API answers here too), with the explorer's "
                        "smaller limits.")
    sp.add_argument("--checkpoint", required=True, help=common.CHECKPOINT_HELP)
    common.listen(sp)
    sp.add_argument("--max-chars", type=int, default=1000, help="longest input, in characters (default 1000)")
    sp.add_argument("--max-tokens", type=int, default=200, help="longest input, in source pieces (default 200)")
    sp.add_argument("--max-beam", type=int, default=16, help="largest beam a request may ask for (default 16)")
    sp.add_argument("--max-nbest", type=int, default=8, help="most hypotheses a request may ask for (default 8)")
    sp.add_argument("--max-queue", type=int, default=8, help="translations that may wait for the model; more are "
                    "answered 503 'busy' at once (default 8)")
    sp.add_argument("--max-connections", type=int, default=64, help="open connections; more are answered 503 "
                    "(default 64)")
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.errors import ConfigError
    from tformer.explore import Explorer, Limits, server_settings
    from tformer.serve import Server

    limits = Limits(args.max_chars, args.max_tokens, args.max_beam, args.max_nbest, args.max_queue)
    for name, value in {**dataclasses.asdict(limits), "max_connections": args.max_connections}.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    translator = common.load_translator(args)
    if args.print_config:
        common.print_config(translator.config)
        return 0
    explorer = Explorer(translator, limits)
    server = Server(translator, args.host, args.port, server_settings(limits, args.max_connections), explorer=explorer)
    print(f"tformer explore: serving {explorer.name} at {server.url}  (Ctrl-C stops)", flush=True)
    server.run()
    return 0
