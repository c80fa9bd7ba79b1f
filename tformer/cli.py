"""`tformer <command>`: parse the command line, then call the library.

    tformer train     --config configs/copy.yaml [section.key=value ...] [--run-dir DIR] [--resume]
    tformer evaluate  --checkpoint RUN_DIR [--split test] [--beam 5] [decode.key=value ...]
    tformer translate --checkpoint RUN_DIR [--input FILE] [--output FILE] [--beam 5 --nbest 3 --batch-size 64]
    tformer data      multi30k --out DIR | {copy,sort} --out DIR [--config FILE] [data.key=value ...]
    tformer average   --run-dir RUN_DIR --last 5 --out DIR
    tformer attention --checkpoint RUN_DIR --sentence "..." [--kind cross] [--layer 2] [--head 0] [--out DIR]
    tformer animate   RUN_DIR [--every-head]          GIFs of the attention recorded over training
    tformer plot      RUN_DIR                         training curves
    tformer explore   --checkpoint RUN_DIR [--port 8000]   the explorer page on 127.0.0.1
    tformer demo      train the copy task, then show its test accuracy and a few decoded examples
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

import yaml

from tformer.config import SPEECH_TASKS, ConfigError, check_inference_overrides, load_config, to_dict

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
    from tformer.train.checkpoint import NoCheckpointError, load_checkpoint
    from tformer.train.loop import train

    if args.resume and not args.run_dir:
        raise ConfigError("--resume needs --run-dir: the run folder to continue")
    if args.resume and not args.config:
        try:
            cfg = load_checkpoint(args.run_dir, which="latest", overrides=args.overrides).cfg
        except NoCheckpointError:  # stopped before its first checkpoint: the run folder's config restarts it
            if not (Path(args.run_dir) / "config.yaml").is_file():
                raise
            cfg = load_config(Path(args.run_dir) / "config.yaml", args.overrides)
    elif args.config:
        cfg = load_config(_find_config(args.config), args.overrides)
    else:
        raise ConfigError("train needs --config FILE (for example --config configs/copy.yaml)")
    if args.print_config:
        _print_config(cfg)
        return 0
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1 and not args.run_dir:
        raise ConfigError("under torchrun, give --run-dir: every process must write to the same run folder")
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(args.config)
    result = train(cfg, run_dir, resume=args.resume, progress=args.progress)
    if rank:  # rank 0 reports
        return 130 if result.interrupted else 0
    best = result.best or {}
    print(f"run folder: {result.run_dir}")
    print(f"steps: {result.step}  wall time: {result.elapsed:.1f}s  latest checkpoint: {result.checkpoint}")
    if best:
        score = (f"BLEU {best['bleu']:.2f}  chrF {best['chrf']:.2f}" if "bleu" in best
                 else f"CER {best['cer']:.2f}%  WER {best['wer']:.2f}%" if "cer" in best
                 else f"exact match {best.get('exact_match', 0):.4f}")
        print(f"best validation: {score}  token acc {best['token_acc']:.4f}  loss {best['loss']:.4f}")
    return 130 if result.interrupted else 0


def _decode_overrides(args: argparse.Namespace) -> list[str]:
    """--beam/--nbest/--batch-size as decode.* overrides (before the explicit ones, which win)."""
    out = []
    if getattr(args, "beam", None) is not None:
        out += ["decode.strategy=greedy"] if args.beam == 1 else ["decode.strategy=beam", f"decode.beam_size={args.beam}"]
    if getattr(args, "nbest", None) is not None:
        out.append(f"decode.nbest={args.nbest}")
    if getattr(args, "batch_size", None) is not None:
        out.append(f"decode.batch_size={args.batch_size}")
    return out + args.overrides


def _load_for_inference(args: argparse.Namespace):
    from tformer.inference import load_model

    overrides = _decode_overrides(args)
    check_inference_overrides(overrides)
    return load_model(args.checkpoint, which="best", overrides=overrides)


def _show_examples(sources: list[str], refs: list[str], outputs: list[str], n: int) -> None:
    for src, ref, out in list(zip(sources, refs, outputs))[:n]:
        mark = "ok " if out == ref else "   "
        print(f"  [{mark}] {src}\n        -> {out}\n   (ref) {ref}")


def _describe_decode(cfg) -> str:
    d = cfg.decode
    how = {"greedy": "greedy", "beam": f"beam {d.beam_size}, length penalty alpha {d.len_penalty}",
           "sample": f"sampling (temperature {d.temperature}, top-k {d.top_k}, top-p {d.top_p}, seed {d.seed})"}
    extra = (f", min length {d.min_len}" if d.min_len else "") + \
        (f", no repeated {d.no_repeat_ngram}-grams" if d.no_repeat_ngram else "")
    return (f"{how[d.strategy]}{extra}, max length {d.max_len_a}*src+{d.max_len_b}, batch {d.batch_size} "
            f"sentences, kernel {cfg.model.attention}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from tformer.data import load_task
    from tformer.evaluation import evaluate
    from tformer.metrics import translation_scores

    ckpt, model = _load_for_inference(args)
    cfg = ckpt.cfg
    if args.print_config:
        _print_config(cfg)
        return 0
    data = load_task(cfg.data, (args.split,), tokenizers=ckpt.tokenizers, feature_dim=cfg.model.feature_dim)
    tgt_tok = ckpt.tokenizers[1]
    sources, refs = data.texts[args.split]
    tic = time.perf_counter()
    speech = cfg.data.task in SPEECH_TASKS
    metrics, hyps = evaluate(model, data.examples[args.split], cfg, references=refs if speech else None,
                             tokenizer=tgt_tok)
    seconds = time.perf_counter() - tic
    outputs = [tgt_tok.decode(h) for h in hyps]
    scores = translation_scores(outputs, refs, cfg.data.tgt_lang) if cfg.data.task == "translation" else None
    if scores:
        metrics.update(scores.as_dict())
    if args.output:
        with _output(args.output) as f:
            f.write("".join(o + "\n" for o in outputs))
    report = {"checkpoint": str(ckpt.path), "split": args.split, **metrics, "seconds": round(seconds, 2),
              "decode": to_dict(cfg.decode), "attention": cfg.model.attention}
    if scores:
        report["signatures"] = {"bleu": scores.bleu_signature, "chrf": scores.chrf_signature,
                                "tok_bleu": scores.tok_bleu_signature}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"checkpoint {ckpt.path}  split {args.split} ({metrics['n']} examples)")
        print(f"  loss {metrics['loss']:.4f}  nll {metrics['nll']:.4f}  ppl {metrics['ppl']:.3f}  "
              f"token accuracy (teacher-forced) {metrics['token_acc']:.4f}")
        if scores:
            print(f"  sacreBLEU      {scores.bleu:6.2f}   {scores.bleu_signature}")
            print(f"  chrF           {scores.chrf:6.2f}   {scores.chrf_signature}")
            print(f"  tokenized BLEU {scores.tok_bleu:6.2f}   {scores.tok_bleu_signature}")
        elif speech:
            print(f"  character error rate {metrics['cer']:6.2f}%   word error rate {metrics['wer']:6.2f}%")
        else:
            print(f"  exact match (free-running)  {metrics['exact_match']:.4f}")
        print(f"  decoding: {_describe_decode(cfg)}; {seconds:.1f}s")
    _show_examples(sources, refs, outputs, args.examples)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from tformer.data.corpus import decode_lines, normalize, read_lines
    from tformer.inference import translate_ids

    ckpt, model = _load_for_inference(args)
    if args.print_config:
        _print_config(ckpt.cfg)
        return 0
    src_tok, tgt_tok, dcfg = ckpt.tokenizers[0], ckpt.tokenizers[1], ckpt.cfg.decode
    nbest = dcfg.nbest > 1
    where = args.input or "standard input"
    limit = args.max_source_tokens
    count = 0

    def encode(line: str, n: int) -> list[int]:
        ids = src_tok.encode(normalize(line))
        if limit and len(ids) > limit:
            raise ValueError(f"{where}, line {n}: {len(ids)} source pieces ({len(line):,} characters), more than "
                             f"--max-source-tokens {limit}; split the line into sentences, or raise the limit")
        return ids

    def run(ids: list[list[int]]) -> list[str]:
        """One output line per input line; with n-best, `index ||| hypothesis ||| score` lines (Moses)."""
        nonlocal count
        live = [i for i, x in enumerate(ids) if x]  # an empty line gives an empty line
        result = translate_ids(model, [ids[i] for i in live], dcfg) if live else None
        texts: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in ids]
        for j, i in enumerate(live):
            texts[i] = [(tgt_tok.decode(h), s) for h, s in zip(result.tokens[j], result.scores[j])]
        rows = []
        for i, hyps in enumerate(texts):
            if nbest:
                rows += [f"{count + i} ||| {text} ||| {score:.4f}" for text, score in hyps]
            else:
                rows.append(hyps[0][0])
        count += len(ids)
        return rows

    if not args.input and sys.stdin.isatty():  # interactive: answer each line as it comes
        print(f"tformer: translating with {_describe_decode(ckpt.cfg)}; one sentence per line, Ctrl-D ends",
              file=sys.stderr)
        for n, line in enumerate(sys.stdin, 1):
            try:
                ids = [encode(line.rstrip("\n"), n)]
            except ValueError as e:  # say so and go on: the session is not lost
                print(f"tformer translate: {e}", file=sys.stderr)
                ids = [[]]
            sys.stdout.write("".join(r + "\n" for r in run(ids)))
            sys.stdout.flush()
        return 0
    # a file or a pipe: check every line before translating any, and write the output only when all is done
    lines = read_lines(args.input) if args.input else decode_lines(sys.stdin.buffer.read(), where)
    if not lines:
        raise ValueError(f"{where} is empty: nothing to translate")
    ids = [encode(line, n) for n, line in enumerate(lines, 1)]
    with _output(args.output) as out:
        for start in range(0, len(ids), 10_000):  # bounded memory; the decoder batches within
            out.write("".join(r + "\n" for r in run(ids[start : start + 10_000])))
    return 0


@contextlib.contextmanager
def _output(path: str | None):
    """Standard output, or `path` written under a temporary name and renamed into place when complete: an
    error or Ctrl-C midway leaves an existing file as it was."""
    if not path:
        yield sys.stdout
        return
    from tformer.files import replace_atomically

    if Path(path).is_dir():
        raise ValueError(f"--output {path} is a folder; give a file name")
    with replace_atomically(path) as f:
        yield f


def cmd_transcribe(args: argparse.Namespace) -> int:
    from tformer.data.speech import load_frames, read_speech_split
    from tformer.inference import translate_ids

    ckpt, model = _load_for_inference(args)
    cfg = ckpt.cfg
    if cfg.model.source != "features":
        raise ConfigError(f"{args.checkpoint} reads token ids; use tformer translate")
    if bool(args.tsv) == bool(args.files):
        raise ConfigError("give either --tsv FILE (id<TAB>transcript lines, .npy files beside it) or .npy files")
    if args.tsv:
        tsv = Path(args.tsv)
        data_cfg = dataclasses.replace(cfg.data, dir=str(tsv.parent), test_prefix=tsv.name.removesuffix(".tsv"))
        utts = read_speech_split(data_cfg, "test", cfg.model.feature_dim)
        ids, frames = utts.ids, utts.frames
    else:
        ids = [Path(f).stem for f in args.files]
        frames = [load_frames(Path(f), cfg.model.feature_dim) for f in args.files]
    result = translate_ids(model, frames, cfg.decode)
    lines = [f"{i}\t{ckpt.tokenizers[1].decode(h[0])}\n" for i, h in zip(ids, result.tokens)]
    if args.output:
        with _output(args.output) as f:
            f.write("".join(lines))
    else:
        sys.stdout.write("".join(lines))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    if args.task == "multi30k":
        from tformer.data.download import MULTI30K_URL, download_multi30k

        for path in download_multi30k(args.out, args.url or MULTI30K_URL):
            print(path)
        print(f"now: tformer train --config multi30k_en_de data.dir={args.out}")
        return 0
    from tformer.data import SPLITS, load_pairs
    from tformer.data.text import write_parallel

    cfg = load_config(_find_config(args.config) if args.config else None,
                      [f"data.task={args.task}", *args.overrides]).data
    for split in SPLITS:
        pairs = load_pairs(cfg, split)
        write_parallel(args.out, split, pairs)
        print(f"{args.out}/{split}.src, {split}.tgt: {len(pairs)} pairs")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from tformer.train.average import average_checkpoints, last_checkpoints

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
    data = load_task(ckpt.cfg.data, ("test",), tokenizers=ckpt.tokenizers)
    metrics, hyps = evaluate(model, data.examples["test"], ckpt.cfg)
    print(f"\ntrained {result.step} steps in {result.elapsed:.0f}s; best checkpoint {ckpt.path}")
    print(f"test ({metrics['n']} sequences): exact match {metrics['exact_match']:.4f} (free-running greedy), "
          f"token accuracy {metrics['token_acc']:.4f} (teacher-forced)")
    sources, refs = data.texts["test"]
    _show_examples(sources, refs, [ckpt.tokenizers[1].decode(h) for h in hyps], 5)
    print(f"\nnext: tformer translate --checkpoint {run_dir}   (type a line of letters, e.g. 'h e l l o')")
    print(f"      tformer animate {run_dir}   (GIFs of the attention over training)   tformer plot {run_dir}")
    print(f"      tformer explore --checkpoint {run_dir}   (a local page: translations and attention)")
    return 130 if result.interrupted else 0


# ------------------------------------------------------------------------------------------ parser


def cmd_ponder(args: argparse.Namespace) -> int:
    from collections import Counter
    from pathlib import Path

    from tformer.data import load_task
    from tformer.data.corpus import normalize
    from tformer.evaluation import ponder_steps
    from tformer.inference import load_model, translate_ids
    from tformer.viz.ponder import plot_ponder_curve, plot_step_histogram, plot_step_map

    ckpt, model = load_model(args.checkpoint, which="best")
    if ckpt.cfg.model.kind != "universal":
        raise ValueError(f"{args.checkpoint} is a {ckpt.cfg.model.kind} transformer; pondering needs "
                         "model.kind=universal")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    max_steps = ckpt.cfg.model.max_steps
    data = load_task(ckpt.cfg.data, (args.split,), tokenizers=ckpt.tokenizers, feature_dim=ckpt.cfg.model.feature_dim)
    src_steps, tgt_steps = ponder_steps(model, data.examples[args.split])
    plot_step_histogram(src_steps, tgt_steps, max_steps, out / "steps_histogram.png")
    for name, steps in (("source", src_steps), ("target", tgt_steps)):
        counts = Counter(x for row in steps for x in row)
        total = sum(counts.values())
        share = "  ".join(f"{k}:{counts[k] / total:.1%}" for k in range(1, max_steps + 1))
        print(f"{name} positions ({args.split}, {total}): mean {sum(k * c for k, c in counts.items()) / total:.2f} "
              f"steps;  {share}")
    written = ["steps_histogram.png"]
    run = Path(args.checkpoint)
    for metrics in (run / "metrics.jsonl", run.parent.parent / "metrics.jsonl"):
        if metrics.exists():
            plot_ponder_curve(metrics, out / "ponder_curve.png")
            written.append("ponder_curve.png")
            break
    if args.sentence:
        src_tok, tgt_tok = ckpt.tokenizers
        ids = src_tok.encode(normalize(args.sentence))
        if not ids:
            raise ValueError("--sentence is empty")
        hyp = translate_ids(model, [ids], ckpt.cfg.decode).tokens[0][0]
        (s_steps,), (t_steps,) = ponder_steps(model, [(ids, hyp)])
        pieces = lambda tok, xs: [tok.decode([x]) or "?" for x in xs]  # noqa: E731
        plot_step_map(pieces(src_tok, ids) + ["</s>"], ["<s>"] + pieces(tgt_tok, hyp), s_steps, t_steps,
                      max_steps, out / "step_map.png")
        written.append("step_map.png")
        print(f"output: {tgt_tok.decode(hyp)}\nsteps per source token: {s_steps}\nsteps per target token: {t_steps}")
    print(f"wrote {', '.join(str(out / w) for w in written)}")
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from tformer.viz.attention import KINDS, inspect_sentence, plot_attention, plot_head_grid, save_figure

    ckpt, model = _load_for_inference(args)
    if ckpt.cfg.model.source == "features":
        raise ValueError(f"{args.checkpoint} reads feature frames; attention pictures need a text model")
    info = inspect_sentence(model, ckpt.tokenizers, args.sentence, ckpt.cfg.decode, target=args.target)
    text, score, _ = info.hypotheses[0]
    maps = info.maps[0]
    out = Path(args.out)
    kinds = args.kind or list(KINDS)
    written = []
    for kind in kinds:
        layers = args.layer if args.layer is not None else list(range(maps.layers(kind)))
        for layer in layers:
            name = f"{kind}_{maps.layer_name}{layer}"
            figures = ([(plot_head_grid(maps, kind, layer), f"{name}_heads")] if args.head is None else
                       [(plot_attention(maps, kind, layer, h), f"{name}_head{h}") for h in args.head])
            for fig, stem in figures:
                written += save_figure(fig, [out / f"{stem}.{fmt}" for fmt in args.format])
    print(f"source pieces: {' '.join(info.pieces)}")
    print(f"{'forced target' if args.target else 'translation'}: {text}  (score {score:.3f})")
    if maps.steps is not None:
        print(f"ACT steps per source token: {maps.steps[0]}\nACT steps per target token: {maps.steps[1]}")
    print(f"wrote {len(written)} files to {out}/")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from tformer.viz.curves import plot_curves

    run = Path(args.run_dir)
    out = Path(args.out) if args.out else run / "plots"
    _, panels = plot_curves(run, out / "curves")
    print(f"wrote {out / 'curves.png'} and {out / 'curves.svg'}: {', '.join(panels)}")
    return 0


def cmd_animate(args: argparse.Namespace) -> int:
    from tformer.viz.attention import KINDS
    from tformer.viz.record import animate_attention, animate_head_grid, animate_steps, load_recording

    rec = load_recording(args.run_dir)
    out = Path(args.out) if args.out else Path(args.run_dir) / "animations"
    if not 0 <= args.example < rec.n_examples:
        raise ValueError(f"the recording has {rec.n_examples} examples (0..{rec.n_examples - 1}); got {args.example}")
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


def cmd_explore(args: argparse.Namespace) -> int:
    from tformer.explore import Explorer, Limits, serve

    check_inference_overrides(args.overrides)
    if args.print_config:
        from tformer.train.checkpoint import load_checkpoint

        _print_config(load_checkpoint(args.checkpoint, which="best", overrides=args.overrides).cfg)
        return 0
    limits = Limits(args.max_chars, args.max_tokens, args.max_beam, args.max_nbest, args.max_queue)
    for name, value in {**dataclasses.asdict(limits), "max_connections": args.max_connections}.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    explorer = Explorer(args.checkpoint, args.overrides, limits)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("explore: serving on %s: anyone who can reach this address can use the model (there is no "
                    "authentication)", args.host)
    serve(explorer, args.host, args.port, args.max_connections)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tformer.export import export_ctranslate2, export_onnx

    if args.format == "onnx":
        if args.quantization:
            raise ValueError("--quantization is for --format ctranslate2")
        enc, step = export_onnx(args.checkpoint, args.out)
        print(f"wrote {enc} (encoder + first step) and {step} (one decoding step) from {args.checkpoint}")
        print("see tformer.export.onnx_greedy for the decoding loop over them (onnxruntime)")
        return 0
    out = export_ctranslate2(args.checkpoint, args.out, quantization=args.quantization, force=args.force)
    print(f"wrote the CTranslate2 model {out} (from {args.checkpoint}{', ' + args.quantization if args.quantization else ''})")
    print("translate with ctranslate2.Translator, feeding the checkpoint's pieces (tformer.export.translate_ctranslate2 "
          "does the tokenising)")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    from tformer.config import StructureConfig
    from tformer.structures import build_structure
    from tformer.viz.structures import plot_pattern, plot_seed_graphs

    if args.pattern:
        structure = build_structure(StructureConfig(args.window, args.dilation, args.global_tokens, args.edges))
        if min(args.lengths) < 1:
            raise ValueError(f"--lengths must be >= 1, got {args.lengths}")
        _, graph = plot_pattern(args.lengths, structure, args.causal, args.out)
        print(f"wrote {args.out}: {graph.n_edges} edges over {sum(args.lengths)} packed tokens "
              f"({structure.describe()}{', causal' if args.causal else ''})")
    else:
        src, tgt = args.source.split(), args.target.split()
        if not src or not tgt:
            raise ValueError("--source and --target need at least one word each")
        plot_seed_graphs(src, tgt, args.out)
        print(f"wrote {args.out}: {len(src)} source and {len(tgt)} target tokens; edges: {len(src) ** 2} "
              f"encoder, {len(tgt) * (len(tgt) + 1) // 2} decoder, {len(src) * len(tgt)} cross")
    return 0


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
    def decoding(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--beam", type=int, help="beam size (1 = greedy); same as decode.strategy=beam "
                        "decode.beam_size=N. Sampling: decode.strategy=sample decode.top_p=0.9 ...")
        sp.add_argument("--nbest", type=int, help="hypotheses per sentence (decode.nbest)")
        sp.add_argument("--batch-size", type=int, help="sentences per decoding batch (decode.batch_size); "
                        "results do not depend on it")

    sp = sub.add_parser("evaluate", help="BLEU/chrF (translation), CER/WER (speech) or exact match on a split",
                        description="Evaluate a checkpoint on a split of the data it was trained with: "
                        "teacher-forced loss and accuracy, then free-running decoding scored by sacreBLEU, "
                        "chrF and tokenized BLEU (translation), character and word error rates (speech) or "
                        "exact match (synthetic tasks).")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--split", default="test", choices=("train", "valid", "test"))
    sp.add_argument("--examples", type=int, default=0, help="also print this many decoded examples")
    sp.add_argument("--output", help="write the detokenised hypotheses here, one per line")
    sp.add_argument("--json", action="store_true", help="print the metrics as one JSON line")
    decoding(sp)
    common(sp, inference_help)
    sp.set_defaults(func=cmd_evaluate)

    sp = sub.add_parser("translate", help="decode lines from stdin or a file",
                        description="Read one raw sentence per line; write one detokenised translation per "
                        "line (same line count; an empty line gives an empty line). With --nbest N > 1, write "
                        "N lines 'index ||| translation ||| score' per input line. Interactive when stdin is "
                        "a terminal.")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--input", help="input file (default: standard input)")
    sp.add_argument("--output", help="output file (default: standard output)")
    sp.add_argument("--max-source-tokens", type=int, default=1024, metavar="N",
                    help="refuse input lines longer than N source pieces, naming the line, before translating "
                    "anything (default 1024; 0 = no limit: attention memory grows with the square of it)")
    decoding(sp)
    common(sp, inference_help)
    sp.set_defaults(func=cmd_translate)

    sp = sub.add_parser("transcribe", help="transcribe .npy feature files with a frame-encoder model",
                        description="Decode utterances of float frames (numpy .npy, (frames, model.feature_dim)) "
                        "and write 'id<TAB>transcript' lines. Input: .npy files, or --tsv of 'id<TAB>anything' "
                        "lines with {id}.npy beside it.")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("files", nargs="*", default=[], metavar="FILE.npy", help="feature files")
    sp.add_argument("--tsv", help="a list of utterances (the 'speech' data format)")
    sp.add_argument("--output", help="output file (default: standard output)")
    decoding(sp)
    sp.set_defaults(func=cmd_transcribe, overrides=[])

    sp = sub.add_parser("data", help="download Multi30k, or write a synthetic task as text files",
                        description="multi30k: download the official Multi30k task-1 English-German files "
                        "(checksums verified). copy/sort: write {train,valid,test}.{src,tgt} of a synthetic task.")
    sp.add_argument("task", choices=("multi30k", "copy", "sort"))
    sp.add_argument("--out", required=True, help="output folder")
    sp.add_argument("--url", help="multi30k: base URL to fetch from (default: the official GitHub files)")
    sp.add_argument("--config", help="YAML file whose data section to use")
    sp.add_argument("overrides", nargs="*", metavar="data.key=value", help="e.g. data.symbols=10 data.seed=7")
    sp.set_defaults(func=cmd_data)

    sp = sub.add_parser("average", help="average the weights of several checkpoints",
                        description="Write the element-wise mean of checkpoints' weights as a new checkpoint "
                        "folder, usable by evaluate and translate.")
    sp.add_argument("--run-dir", help="run folder (with --last)")
    sp.add_argument("--last", type=int, help="average the last N checkpoints of --run-dir")
    sp.add_argument("--checkpoints", nargs="+", help="checkpoint folders to average")
    sp.add_argument("--out", required=True, help="new checkpoint folder to write")
    sp.set_defaults(func=cmd_average)

    sp = sub.add_parser("ponder", help="a universal transformer's ACT steps: histogram, curve, step map",
                        description="For a model.kind=universal checkpoint: the steps each position takes on "
                        "a split (histogram and shares), mean ponder over training (from the run's "
                        "metrics.jsonl) and, with --sentence, a per-token step map of its translation.")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--split", default="test", choices=("train", "valid", "test"))
    sp.add_argument("--sentence", help="a source sentence to decode and map, step by step")
    sp.add_argument("--out", required=True, help="folder for the pictures")
    sp.set_defaults(func=cmd_ponder)

    sp = sub.add_parser("attention", help="attention maps of one sentence: per kind, layer and head, PNG/SVG",
                        description="Translate a sentence (or force --target) and draw the attention weights "
                        "the model computed: one grid of all heads per kind and layer, or single heads "
                        "(--head). Rows are queries, columns keys, labelled with the tokens; decoder rows are "
                        "labelled by the token they produce. Universal transformers: one map per ACT step, "
                        "positions that had halted left blank. Example: tformer attention --checkpoint "
                        "runs/m30k --sentence 'A dog runs on the beach .' --kind cross --out pics/")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--sentence", required=True, help="source sentence (raw text)")
    sp.add_argument("--target", help="draw the attention of this translation instead of the model's own")
    sp.add_argument("--kind", nargs="+", choices=("encoder", "decoder", "cross"),
                    help="which attention (default: all three)")
    sp.add_argument("--layer", type=int, nargs="+", help="layers (or ACT steps) to draw (default: all)")
    sp.add_argument("--head", type=int, nargs="+", help="single heads to draw (default: a grid of all heads)")
    sp.add_argument("--format", nargs="+", default=["png", "svg"], choices=("png", "svg", "pdf"))
    sp.add_argument("--out", default="attention", help="folder for the pictures (default: ./attention)")
    decoding(sp)
    common(sp, inference_help)
    sp.set_defaults(func=cmd_attention)

    sp = sub.add_parser("plot", help="training curves of a run: loss, validation score, learning rate, tokens/s",
                        description="Draw the run's metrics.jsonl as one figure (PNG and SVG): train and "
                        "validation loss, validation BLEU/chrF, exact match or CER/WER, the learning rate, "
                        "tokens per second and, for universal transformers, the mean ACT steps. Works on a "
                        "run that is still training. For TensorBoard, train with train.tensorboard=true.")
    sp.add_argument("run_dir", metavar="RUN_DIR", help="run folder")
    sp.add_argument("--out", help="folder for curves.png / curves.svg (default: RUN_DIR/plots)")
    sp.set_defaults(func=cmd_plot)

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
    sp.set_defaults(func=cmd_animate)

    sp = sub.add_parser("explore", help="a local web page: translate, n-best, attention heatmaps and graphs",
                        description="Serve a web page for one checkpoint: type a sentence, get its translation "
                        "and n-best list with scores, and look at the attention of any hypothesis by kind, "
                        "layer and head, as a heatmap and as the bipartite token graph; universal transformers "
                        "also show the ACT steps per token. Binds 127.0.0.1 (this machine only) by default.")
    sp.add_argument("--checkpoint", required=True, help="run folder (uses its best checkpoint) or checkpoint folder")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    sp.add_argument("--max-chars", type=int, default=1000, help="longest input, in characters (default 1000)")
    sp.add_argument("--max-tokens", type=int, default=200, help="longest input, in source pieces (default 200)")
    sp.add_argument("--max-beam", type=int, default=16, help="largest beam a request may ask for (default 16)")
    sp.add_argument("--max-nbest", type=int, default=8, help="most hypotheses a request may ask for (default 8)")
    sp.add_argument("--max-queue", type=int, default=8, help="translations that may wait for the model; more are "
                    "answered 503 'busy' at once (default 8)")
    sp.add_argument("--max-connections", type=int, default=64, help="open connections; more are answered 503 "
                    "before their request is read (default 64)")
    common(sp, inference_help)
    sp.set_defaults(func=cmd_explore)

    sp = sub.add_parser("export", help="export a checkpoint to CTranslate2 or ONNX",
                        description="ctranslate2: a CTranslate2 model folder, through CTranslate2's own converter "
                        "API (pip install ctranslate2); the vocabularies are the checkpoint's, </s> is added to "
                        "every source. onnx: encoder.onnx (the encoder and the first decoding step) and "
                        "step.onnx (one decoding step with its key/value cache), dynamic batch and lengths "
                        "(pip install onnx onnxscript). Vanilla models with sinusoidal or learned positions, "
                        "pre- or post-norm, ReLU or GELU. Example: tformer export --format ctranslate2 "
                        "runs/m30k runs/m30k-ct2 --quantization int8")
    sp.add_argument("--format", required=True, choices=("ctranslate2", "onnx"), help="target format")
    sp.add_argument("checkpoint", metavar="RUN_DIR", help="run folder (its best checkpoint) or checkpoint folder")
    sp.add_argument("out", metavar="OUT", help="folder to write")
    sp.add_argument("--quantization", choices=("int8", "int8_float32", "int16", "float16", "bfloat16"),
                    help="store the weights quantized (default: float32)")
    sp.add_argument("--force", action="store_true", help="replace OUT if it exists")
    sp.set_defaults(func=cmd_export)

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
    sp.set_defaults(func=cmd_graph)

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
    except OSError as e:  # a file the command line names: missing, unreadable, a full disk
        where = f" ({e.filename})" if e.filename else ""
        print(f"tformer {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
