"""tformer average: the element-wise mean of several checkpoints' weights, as a new checkpoint folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    sp = sub.add_parser("average", help="average the weights of several checkpoints",
                        description="Write the element-wise mean of checkpoints' weights as a new checkpoint "
                        "folder, usable by evaluate and translate.")
    sp.add_argument("--run-dir", help="run folder (with --last)")
    sp.add_argument("--last", type=int, help="average the last N checkpoints of --run-dir")
    sp.add_argument("--checkpoints", nargs="+", help="checkpoint folders to average")
    sp.add_argument("--out", required=True, help="new checkpoint folder to write")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.errors import ConfigError
    from tformer.training.average import average_checkpoints, last_checkpoints

    if bool(args.last) == bool(args.checkpoints):
        raise ConfigError("give either --last N (with --run-dir) or --checkpoints DIR [DIR ...]")
    if args.last:
        if not args.run_dir:
            raise ConfigError("--last needs --run-dir, the run folder whose last checkpoints to average")
        paths = last_checkpoints(args.run_dir, args.last)
    else:
        paths = [Path(p) for p in args.checkpoints]
    out = average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return 0
