"""tformer average: the element-wise mean of several checkpoints' weights, as a new checkpoint folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> None:
    sp = sub.add_parser("average", help="average the weights of several checkpoints",
                        description="Write the element-wise mean of checkpoints' weights as a new checkpoint "
                        "folder, usable by evaluate and translate.")
    sp.add_argument("--run-dir", help="run folder (with --last or --best)")
    sp.add_argument("--last", type=int, help="average the last N checkpoints of --run-dir")
    sp.add_argument("--best", type=int, help="average the N best-validated checkpoints of --run-dir (as many as "
                    "train.keep_best kept, besides the last train.keep_last)")
    sp.add_argument("--checkpoints", nargs="+", help="checkpoint folders to average")
    sp.add_argument("--out", required=True, help="new checkpoint folder to write")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.errors import ConfigError
    from tformer.training.average import average_checkpoints, best_checkpoints, last_checkpoints

    if sum(map(bool, (args.last, args.best, args.checkpoints))) != 1:
        raise ConfigError("give one of --last N or --best N (with --run-dir), or --checkpoints DIR [DIR ...]")
    if args.last or args.best:
        flag = "--last" if args.last else "--best"
        if not args.run_dir:
            raise ConfigError(f"{flag} needs --run-dir, the run folder whose checkpoints to average")
        paths = last_checkpoints(args.run_dir, args.last) if args.last else best_checkpoints(args.run_dir, args.best)
    else:
        paths = [Path(p) for p in args.checkpoints]
    out = average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    print(f"next: tformer evaluate --checkpoint {out} --split test --beam 5")
    return 0
