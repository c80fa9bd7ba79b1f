"""tformer prepare: a translation corpus encoded once into memory-mapped shards (tformer.data.prepare), or a
speech corpus's features computed once (tformer.data.features)."""

from __future__ import annotations

import argparse

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "prepare", help="encode a translation corpus, or compute a speech corpus's features, once into shards",
        description="Train SentencePiece on a seeded sample of the training pairs (data.tokenizer_sample), encode "
        "every split in data.workers processes and write token ids with a lengths index into memory-mapped "
        "shards and a manifest. Interrupted, it continues where it stopped when run again; a folder holding "
        "another corpus is refused. Then: tformer train --config C data.prepared=OUT. A speech corpus (data.task "
        "speech) gets its log-mel filterbanks (from 16 kHz wav/flac/ogg) or .npy frames instead, with the "
        "training set's CMVN statistics; every list line and file header is checked first.")
    sp.add_argument("--config", required=True, help="YAML recipe (a path or a packaged recipe name) whose data "
                    "section describes the corpus")
    sp.add_argument("--out", required=True, help="folder for the prepared corpus (new, empty, or one this command "
                    "started for the same corpus)")
    sp.add_argument("--split", action="append", choices=("train", "valid", "test"),
                    help="prepare only this split (repeatable; default: all three)")
    sp.add_argument("--verify", action="store_true", help="afterwards, check every shard against its SHA-256")
    common.overrides(sp, "overrides of the recipe, e.g. data.dir=DIR data.vocab_size=32000 data.workers=4")
    common.progress(sp)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.training.start import prepare, train_config

    if args.print_config:
        common.print_config(train_config(args.config, overrides=args.overrides))
        return 0
    corpus = prepare(args.config, args.out, overrides=args.overrides, splits=args.split or ("train", "valid", "test"),
                     progress=args.progress)
    m = corpus.manifest
    print(f"prepared corpus: {corpus.path}")
    if m["format"] == "tformer-features":  # speech
        for split, e in m["splits"].items():
            print(f"  {split}: {e['utterances']:,} utterances, {e['frames']:,} frames "
                  f"({e['frames'] / 360_000:.2f} hours at 100 frames/s) in {e['shards']} shard(s)")
        if "cmvn" in m:
            print(f"  CMVN statistics from {m['cmvn']['frames']:,} training frames")
        return _verify_and_next(args, corpus)
    tok = m["tokenizer"]
    sample = tok["sample"] or {}
    learned = (f"; learned from {sample['pairs']:,} of {sample['of']:,} training pairs"
               + (f" (seed {sample['seed']})" if sample.get("seed") is not None else "") if sample else "")
    pieces = tok["pieces"][:1] if tok["files"][0] == tok["files"][1] else tok["pieces"]
    print(f"  tokenizer: {', '.join(dict.fromkeys(tok['files']))} ({' + '.join(map(str, pieces))} pieces, "
          f"{m['dtype']} ids){learned}")
    for split in corpus.splits:
        e = m["splits"][split]
        dropped = sum(e["dropped"].values())
        print(f"  {split}: {e['pairs']:,} pairs ({e['tokens']:,} tokens) in {e['shards']} shard(s)"
              + (f"; {dropped:,} of {e['raw_pairs']:,} dropped by the filters" if dropped else ""))
    return _verify_and_next(args, corpus)


def _verify_and_next(args: argparse.Namespace, corpus) -> int:
    from tformer.errors import DataError

    if args.verify:
        problems = corpus.verify()
        if problems:
            raise DataError("verification failed: " + "; ".join(problems[:5]))
        print("  verified: every shard matches its SHA-256")
    print(f"now: tformer train --config {args.config} data.prepared={corpus.path}")
    return 0
