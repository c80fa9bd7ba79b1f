"""tformer data: download Multi30k (checksums verified), or write a synthetic task as parallel text files."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sp = sub.add_parser("data", help="download Multi30k, or write a synthetic task as text files",
                        description="multi30k: download the official Multi30k task-1 English-German files "
                        "(checksums verified). copy/sort: write {train,valid,test}.{src,tgt} of a synthetic task.")
    sp.add_argument("task", choices=("multi30k", "copy", "sort"))
    sp.add_argument("--out", required=True, help="output folder")
    sp.add_argument("--url", help="multi30k: base URL to fetch from (default: the official GitHub files)")
    sp.add_argument("--config", help="YAML file (or recipe name) whose data section to use")
    sp.add_argument("overrides", nargs="*", metavar="data.key=value", help="e.g. data.symbols=10 data.seed=7")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.task == "multi30k":
        from tformer.data.download import MULTI30K_URL, download_multi30k

        for path in download_multi30k(args.out, args.url or MULTI30K_URL):
            print(path)
        print(f"now: tformer train --config multi30k_en_de data.dir={args.out}")
        return 0
    from tformer.config import Config, load_config
    from tformer.data import SPLITS, load_pairs
    from tformer.data.text import write_parallel

    overrides = [f"data.task={args.task}", *args.overrides]
    cfg = (Config.from_yaml(args.config, overrides) if args.config else load_config(None, overrides)).data
    for split in SPLITS:
        pairs = load_pairs(cfg, split)
        write_parallel(args.out, split, pairs)
        print(f"{args.out}/{split}.src, {split}.tgt: {len(pairs)} pairs")
    return 0
