"""tformer data: download Multi30k or WMT14 en-de (checksums verified), or write a synthetic task as parallel
text files."""

from __future__ import annotations

import argparse

from tformer.config import SYNTHETIC_TASKS


def add_parser(sub) -> None:
    sp = sub.add_parser("data", help="download Multi30k or WMT14 en-de, or write a synthetic task as text files",
                        description="multi30k: download the official Multi30k task-1 English-German files "
                        "(checksums verified). wmt14: download the WMT14 English-German training archives "
                        "(Europarl v7, Common Crawl, News Commentary v9) and newstest2013/2014 (about 1.2 GB, "
                        "checksums verified) and write {train,newstest2013,newstest2014}.{en,de}; a rerun keeps "
                        "what is complete. copy/sort/reverse: write {train,valid,test}.{src,tgt} of a synthetic task.")
    sp.add_argument("task", choices=("multi30k", "wmt14", *SYNTHETIC_TASKS))
    sp.add_argument("--out", required=True, help="output folder")
    sp.add_argument("--url", help="multi30k, wmt14: base URL to fetch from, holding the files under their "
                    "upstream names (default: the official locations)")
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
    if args.task == "wmt14":
        from tformer.data.download import download_wmt14

        for f in download_wmt14(args.out, args.url):
            print(f"{f.path}: {f.lines} lines" if f.lines is not None else f"{f.path}: kept (complete already)")
        print(f"now: tformer prepare --config wmt14_en_de data.dir={args.out} --out {args.out}/prepared\n"
              f"then: tformer train --config wmt14_en_de data.dir={args.out} data.prepared={args.out}/prepared")
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
