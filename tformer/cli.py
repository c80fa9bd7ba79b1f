"""`tformer <command>`: parse the command line, then call the library.

    tformer train     --config configs/copy.yaml [section.key=value ...] [--run-dir DIR] [--resume]
    tformer evaluate  --checkpoint RUN_DIR [--split test] [decode.key=value ...]
    tformer translate --checkpoint RUN_DIR [--input FILE] [--output FILE] [decode.key=value ...]
    tformer data      {copy,sort} --out DIR [--config FILE] [data.key=value ...]
    tformer demo      train the copy task, then show its test accuracy and a few decoded examples
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import yaml

from tformer.config import ConfigError, check_inference_overrides, load_config, to_dict

log = logging.getLogger("tformer")
HERE = Path(__file__).resolve().parent
CONFIG_DIRS = (Path("configs"), HERE.parent / "configs")


def _find_config(name: str) -> Path:
    """A path as given, else a recipe name ('copy' or 'copy.yaml') under ./configs or the package's configs."""
    path = Path(name)
    if path.exists():
        return path
    for d in CONFIG_DIRS:
        for candidate in (d / name, d / f"{name}.yaml"):
            if candidate.exists():
                return candidate
    raise ConfigError(f"config file {name} does not exist")


def _print_config(cfg) -> None:
    sys.stdout.write(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _default_run_dir(config: str | None) -> Path:
    stem = Path(config).stem if config else "run"
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


# ------------------------------------------------------------------------------------------ commands


def cmd_train(args: argparse.Namespace) -> int:
    from tformer.train.checkpoint import load_checkpoint
    from tformer.train.loop import train

    if args.resume and not args.run_dir:
        raise ConfigError("--resume needs --run-dir: the run folder to continue")
    if args.resume and not args.config:
        cfg = load_checkpoint(args.run_dir, which="latest", overrides=args.overrides).cfg
    elif args.config:
        cfg = load_config(_find_config(args.config), args.overrides)
    else:
        raise ConfigError("train needs --config FILE (for example --config configs/copy.yaml)")
    if args.print_config:
        _print_config(cfg)
        return 0
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(args.config)
    result = train(cfg, run_dir, resume=args.resume, progress=args.progress)
    best = result.best or {}
    print(f"run folder: {result.run_dir}")
    print(f"steps: {result.step}  wall time: {result.elapsed:.1f}s  latest checkpoint: {result.checkpoint}")
    if best:
        print(f"best validation: exact match {best.get('exact_match', 0):.4f}  token acc "
              f"{best['token_acc']:.4f}  loss {best['loss']:.4f}")
    return 130 if result.interrupted else 0


def _load_for_inference(args: argparse.Namespace):
    from tformer.inference import load_model

    check_inference_overrides(args.overrides)
    return load_model(args.checkpoint, which="best", overrides=args.overrides)


def _show_examples(pairs, hyps, vocab, n: int) -> None:
    for (src, ref), hyp in list(zip(pairs, hyps))[:n]:
        out = " ".join(vocab.decode(hyp))
        mark = "ok " if out == " ".join(ref) else "ERR"
        print(f"  [{mark}] {' '.join(src)}\n        -> {out}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from tformer.data import load_task
    from tformer.evaluation import evaluate

    ckpt, model = _load_for_inference(args)
    cfg = ckpt.cfg
    if args.print_config:
        _print_config(cfg)
        return 0
    data = load_task(cfg.data, (args.split,), vocabs=(ckpt.src_vocab, ckpt.tgt_vocab))
    tic = time.perf_counter()
    metrics, hyps = evaluate(model, data.examples[args.split], cfg)
    seconds = time.perf_counter() - tic
    report = {"checkpoint": str(ckpt.path), "split": args.split, **metrics, "seconds": round(seconds, 2),
              "decode": to_dict(cfg.decode), "attention": cfg.model.attention}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"checkpoint {ckpt.path}  split {args.split} ({metrics['n']} examples)")
        print(f"  loss {metrics['loss']:.4f}  nll {metrics['nll']:.4f}  ppl {metrics['ppl']:.3f}")
        print(f"  token accuracy (teacher-forced)        {metrics['token_acc']:.4f}")
        print(f"  exact match (free-running, greedy)     {metrics['exact_match']:.4f}")
        d = cfg.decode
        print(f"  decoding: {d.strategy}, max length {d.max_len_a}*src+{d.max_len_b}, batch {d.batch_size}, "
              f"kernel {cfg.model.attention}; {seconds:.1f}s")
    _show_examples(data.pairs[args.split], hyps, ckpt.tgt_vocab, args.examples)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from tformer.inference import translate_ids

    ckpt, model = _load_for_inference(args)
    if args.print_config:
        _print_config(ckpt.cfg)
        return 0
    src_vocab, tgt_vocab, dcfg = ckpt.src_vocab, ckpt.tgt_vocab, ckpt.cfg.decode
    inp = open(args.input, encoding="utf-8") if args.input else sys.stdin
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout

    def run(lines: list[str]) -> list[str]:
        ids = [src_vocab.encode(line.split()) for line in lines]
        live = [i for i, x in enumerate(ids) if x]  # an empty line gives an empty line
        hyp = translate_ids(model, [ids[i] for i in live], dcfg).tokens if live else []
        result = [""] * len(lines)
        for i, h in zip(live, hyp):
            result[i] = " ".join(tgt_vocab.decode(h))
        return result

    try:
        if inp.isatty():  # interactive: answer each line as it comes
            for line in inp:
                out.write(run([line.rstrip("\n")])[0] + "\n")
                out.flush()
        else:
            try:
                lines = inp.read().split("\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{args.input or 'standard input'}: not valid UTF-8 (byte {e.start})") from None
            if lines and lines[-1] == "":
                lines.pop()
            for text in run(lines):
                out.write(text + "\n")
    finally:
        if args.input:
            inp.close()
        if args.output:
            out.close()
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from tformer.data import SPLITS, load_pairs
    from tformer.data.text import write_parallel

    cfg = load_config(_find_config(args.config) if args.config else None,
                      [f"data.task={args.task}", *args.overrides]).data
    for split in SPLITS:
        pairs = load_pairs(cfg, split)
        write_parallel(args.out, split, pairs)
        print(f"{args.out}/{split}.src, {split}.tgt: {len(pairs)} pairs")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tformer.data import load_task
    from tformer.evaluation import evaluate
    from tformer.inference import load_model
    from tformer.train.loop import train

    cfg_path = _find_config("copy")
    cfg = load_config(cfg_path, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir("demo-copy")
    print(f"training the copy task ({cfg_path}) into {run_dir} ...", flush=True)
    result = train(cfg, run_dir, progress=args.progress)
    ckpt, model = load_model(run_dir, which="best")
    data = load_task(ckpt.cfg.data, ("test",), vocabs=(ckpt.src_vocab, ckpt.tgt_vocab))
    metrics, hyps = evaluate(model, data.examples["test"], ckpt.cfg)
    print(f"\ntrained {result.step} steps in {result.elapsed:.0f}s; best checkpoint {ckpt.path}")
    print(f"test ({metrics['n']} sequences): exact match {metrics['exact_match']:.4f} (free-running greedy), "
          f"token accuracy {metrics['token_acc']:.4f} (teacher-forced)")
    _show_examples(data.pairs["test"], hyps, ckpt.tgt_vocab, 5)
    print(f"\nnext: tformer translate --checkpoint {run_dir}   (type a line of letters, e.g. 'h e l l o')")
    return 130 if result.interrupted else 0


# ------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tformer",
        description="Transformer sequence-to-sequence models: train, evaluate, translate.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings: a YAML file (--config) and dotted overrides such as model.d_model=512 or "
               "train.max_steps=2000;\nunknown keys and wrong types are errors. See configs/ for recipes.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def common(sp: argparse.ArgumentParser, overrides_help: str) -> None:
        sp.add_argument("overrides", nargs="*", metavar="section.key=value", help=overrides_help)
        sp.add_argument("--print-config", action="store_true", help="print the full configuration and exit")

    def progress(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                        help="show a progress bar (default: when stderr is a terminal; else log lines)")

    sp = sub.add_parser("train", help="train a model", description="Train a model from a YAML recipe. "
                        "Writes config, vocabularies, metrics.jsonl and checkpoints into the run folder.")
    sp.add_argument("--config", help="YAML recipe (a path, or a name under configs/ such as 'copy')")
    sp.add_argument("--run-dir", help="run folder (default: a new folder under runs/)")
    sp.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    common(sp, "overrides of the recipe, e.g. train.max_steps=500 model.norm=pre")
    progress(sp)
    sp.set_defaults(func=cmd_train)

    inference_help = "settings that may change after training: decode.* and model.attention"
    sp = sub.add_parser("evaluate", help="loss, token accuracy and exact match on a split",
                        description="Evaluate a checkpoint on a split of the data it was trained with.")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--split", default="test", choices=("train", "valid", "test"))
    sp.add_argument("--examples", type=int, default=0, help="also print this many decoded examples")
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON line")
    common(sp, inference_help)
    sp.set_defaults(func=cmd_evaluate)

    sp = sub.add_parser("translate", help="decode lines from stdin or a file",
                        description="Read one whitespace-tokenised source per line; write one output per "
                        "line (same line count; an empty line gives an empty line).")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--input", help="input file (default: standard input)")
    sp.add_argument("--output", help="output file (default: standard output)")
    common(sp, inference_help)
    sp.set_defaults(func=cmd_translate)

    sp = sub.add_parser("data", help="write a synthetic task as parallel text files",
                        description="Write {train,valid,test}.{src,tgt} of a synthetic task, one sequence per line.")
    sp.add_argument("task", choices=("copy", "sort"))
    sp.add_argument("--out", required=True, help="output folder")
    sp.add_argument("--config", help="YAML file whose data section to use")
    sp.add_argument("overrides", nargs="*", metavar="data.key=value", help="e.g. data.symbols=10 data.seed=7")
    sp.set_defaults(func=cmd_data)

    sp = sub.add_parser("demo", help="train the copy task and show what it learned (a few minutes on a CPU)")
    sp.add_argument("--run-dir", help="run folder (default: a new folder under runs/)")
    sp.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides of configs/copy.yaml")
    progress(sp)
    sp.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    for item in extra:  # overrides may stand anywhere, also after options (argparse leaves those over)
        if item.startswith("-") or "=" not in item or not hasattr(args, "overrides"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides.append(item)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    try:
        return args.func(args)
    except ValueError as e:  # ConfigError, CheckpointError and data errors: a message, not a traceback
        print(f"tformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
