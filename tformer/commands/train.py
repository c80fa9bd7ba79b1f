"""tformer train: a model from a YAML recipe into a run folder, or the run in --run-dir continued (--resume)."""

from __future__ import annotations

import argparse
import os

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("train", help="train a model", description="Train a model from a YAML recipe. "
                        "Writes config, vocabularies, metrics.jsonl and checkpoints into the run folder.")
    sp.add_argument("--config", help="YAML recipe (a path, or the name of a packaged recipe such as 'copy')")
    sp.add_argument("--run-dir", help="run folder (default: a new folder under runs/)")
    sp.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    sp.add_argument("--init-from", metavar="MODEL", help="fine-tune: start from this model (a tformer run or "
                    "checkpoint folder, or a Hugging Face Marian / Marian folder) with its architecture and "
                    "tokenizers; the recipe sets the data and the optimisation (train.init_from)")
    common.overrides(sp, "overrides of the recipe, e.g. train.max_steps=500 model.norm=pre")
    common.progress(sp)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.training.start import train, train_config
    from tformer.errors import ConfigError

    if args.resume and not args.run_dir:
        raise ConfigError("--resume needs --run-dir: the run folder to continue")
    if not args.config and not args.resume:
        raise ConfigError("train needs --config FILE (a recipe name such as 'copy', or a YAML file)")
    if args.init_from:
        args.overrides.append(f"train.init_from={args.init_from}")
    if args.print_config:
        common.print_config(train_config(args.config, args.run_dir, resume=args.resume, overrides=args.overrides))
        return 0
    result = train(args.config, args.run_dir, resume=args.resume, overrides=args.overrides, progress=args.progress)
    if int(os.environ.get("RANK", "0")):  # rank 0 reports
        return 130 if result.interrupted else 0
    best = result.best or {}
    print(f"run folder: {result.run_dir}")
    print(f"steps: {result.step}  wall time: {result.elapsed:.1f}s  latest checkpoint: {result.checkpoint}")
    if best:
        score = (f"BLEU {best['bleu']:.2f}  chrF {best['chrf']:.2f}" if "bleu" in best
                 else f"CER {best['cer']:.2f}%  WER {best['wer']:.2f}%" if "cer" in best
                 else f"exact match {best.get('exact_match', 0):.4f}")
        print(f"best validation: {score}  token acc {best['token_acc']:.4f}  loss {best['loss']:.4f}")
    if not result.interrupted:
        print(f"next: tformer evaluate --checkpoint {result.run_dir} --split test --beam 5   (or tformer translate "
              f"--checkpoint {result.run_dir}, tformer plot {result.run_dir})")
    return 130 if result.interrupted else 0
