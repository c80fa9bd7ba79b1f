"""What several commands share: argument groups, loading a Translator from the command line, output files
and the lines they print."""

from __future__ import annotations

import argparse
import sys

CHECKPOINT_HELP = "run folder (uses its best checkpoint) or checkpoint folder"
ENSEMBLE_HELP = CHECKPOINT_HELP + ("; given several times, an ensemble: the models' log-probabilities averaged at "
                                   "every step")
INFERENCE_OVERRIDES = ("settings that may change after training: decode.*, model.attention, and where the corpus is "
                       "(data.dir, data.prepared, data.test_prefix: e.g. a speech corpus's test_snr10 list)")


def overrides(sp: argparse.ArgumentParser, help: str) -> None:
    sp.add_argument("overrides", nargs="*", metavar="section.key=value", help=help)
    sp.add_argument("--print-config", action="store_true", help="print the full configuration and exit")


def progress(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                    help="show a progress bar (default: when stderr is a terminal; else log lines)")


def decoding(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--beam", type=int, help="beam size (1 = greedy); same as decode.strategy=beam "
                    "decode.beam_size=N. Sampling: decode.strategy=sample decode.top_p=0.9 ...")
    sp.add_argument("--nbest", type=int, help="hypotheses per sentence (decode.nbest)")
    batching(sp)


def batching(sp: argparse.ArgumentParser) -> None:
    """How the model runs: batches (sentences or tokens) and int8 weights; results do not depend on batches."""
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--batch-size", type=int, help="sentences per batch (decode.batch_size); results do not "
                       "depend on it")
    group.add_argument("--batch-tokens", type=int, metavar="N", help="batches of at most N padded source tokens "
                       "(sentences x longest), sentences sorted by length, instead of a count of sentences "
                       "(decode.batch_tokens=N); results do not depend on it")
    number_format(sp)


def number_format(sp) -> None:
    """--int8 and --precision: the format the weights are loaded in (tformer.precision); --compile, the step."""
    sp.add_argument("--int8", action="store_true", help="run the linear layers with dynamic int8 quantization "
                    "(CPU; faster, results may differ slightly); same as decode.quantize=int8")
    sp.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="hold the weights in this format "
                    "(default fp32); bf16 needs a CPU with avx512_bf16 or amx_bf16, or a GPU of compute capability "
                    "8.0+, and runs about 2x as fast there; log-probabilities stay fp32, results may differ "
                    "slightly; same as decode.precision")
    sp.add_argument("--compile", action="store_true", help="compile the decoding step ahead of time (AOTInductor; "
                    "CPU, fp32): about 30 s once per model and machine, saved under $TFORMER_CACHE; faster for small "
                    "models and batches of several sentences, not for one sentence of a large model; same as "
                    "decode.compile=true")
    sp.add_argument("--shortlist", metavar="FILE", help="a lexical shortlist (tformer shortlist): each sentence may "
                    "output only its list's target tokens, and the output layer is computed for those only (faster; "
                    "results may differ slightly); same as decode.shortlist=FILE")


def listen(sp: argparse.ArgumentParser) -> None:
    """--host and --port of a command that serves HTTP (tformer serve, tformer explore)."""
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")


def alignment(sp: argparse.ArgumentParser, help: str) -> None:
    """--alignment (with `help`), --alignment-layer, --alignment-heads; `alignment_options` reads them."""
    sp.add_argument("--alignment", action="store_true", help=help)
    sp.add_argument("--alignment-layer", type=int, default=-1, metavar="N",
                    help="the decoder layer the alignment reads (default -1: the last; a universal transformer's "
                    "ACT step)")
    sp.add_argument("--alignment-heads", type=int_list, metavar="H,H,...",
                    help="average these heads only (default: all)")


def alignment_options(args: argparse.Namespace) -> dict:
    """The API's alignment options from the flags `alignment` adds."""
    return dict(alignment=args.alignment, alignment_layer=args.alignment_layer, alignment_heads=args.alignment_heads)


def int_list(text: str) -> list[int]:
    """'0,2,3' -> [0, 2, 3], for argparse."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        message = f"a comma-separated list of whole numbers, such as 0,2; got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def decode_overrides(args: argparse.Namespace) -> list[str]:
    """--beam/--nbest/--batch-size/--batch-tokens/--int8/--precision/--compile as decode.* overrides, before the
    explicit ones (which win)."""
    from tformer.api import decode_fields

    flags = decode_fields(getattr(args, "beam", None), getattr(args, "nbest", None), getattr(args, "batch_size", None),
                          getattr(args, "batch_tokens", None))
    if getattr(args, "int8", False):
        flags["quantize"] = "int8"
    if getattr(args, "precision", None):
        flags["precision"] = args.precision
    if getattr(args, "compile", False):
        flags["compile"] = "true"
    if getattr(args, "shortlist", None):
        flags["shortlist"] = args.shortlist
    return [f"decode.{key}={value}" for key, value in flags.items()] + getattr(args, "overrides", [])


def load_translator(args: argparse.Namespace, **kwargs):
    """tformer.load on --checkpoint with the decoding flags and overrides of the command line."""
    from tformer.api import load

    paths = args.checkpoint  # a path, or a list of them (--checkpoint given several times: an ensemble)
    return load(paths[0] if isinstance(paths, list) and len(paths) == 1 else paths,
                overrides=decode_overrides(args), **kwargs)


def print_config(cfg) -> None:
    sys.stdout.write(cfg.to_yaml())


def output(path: str | None):
    """Standard output, or `path` written under a temporary name and renamed into place when complete: an
    error or Ctrl-C midway leaves an existing file as it was."""
    from tformer.files import writing

    return writing(path or sys.stdout, "--output")


def describe_decode(cfg, overrides: list[str] | None = None) -> str:
    """The decoding `cfg` runs, in words, and where its search comes from: the checkpoint's decode section (what
    its recipe named), or `overrides` (the command line's decode.* settings, `decode_overrides`; None: not said)."""
    d = cfg.decode
    how = {"greedy": "greedy", "beam": f"beam {d.beam_size}, length penalty alpha {d.len_penalty}",
           "sample": f"sampling (temperature {d.temperature}, top-k {d.top_k}, top-p {d.top_p}, seed {d.seed})"}
    relevant = {"greedy": ("strategy",), "beam": ("strategy", "beam_size", "len_penalty"),
                "sample": ("strategy", "temperature", "top_k", "top_p", "seed")}[d.strategy]
    given = {o.split("=", 1)[0].removeprefix("decode.") for o in overrides or () if o.startswith("decode.")}
    chosen = [k for k in relevant if k in given]
    origin = (f" (from the command line: {', '.join(chosen)}" + ("; the rest from the checkpoint's decode section)"
                                                                  if len(chosen) < len(relevant) else ")")
              if chosen else " (from the checkpoint's decode section)")
    if d.strategy == "greedy" and not chosen:
        origin = " (from the checkpoint's decode section; --beam N for beam search)"
    if overrides is None:  # where it comes from is not known here
        origin = ""
    extra = "".join(f", {k} {v}" for k, v in _rules_in_use(d, relevant))
    batch = f"{d.batch_tokens} tokens" if d.batch_tokens else f"{d.batch_size} sentences"
    int8 = ", int8" if d.quantize == "int8" else f", {d.precision}" if d.precision != "fp32" else ""
    int8 += f", shortlist {d.shortlist}" if d.shortlist else ""
    int8 += ", compiled step" if d.compile else ""
    return (f"{how[d.strategy]}{origin}{extra}, max length {d.max_len_a}*src+{d.max_len_b}, batch {batch}, "
            f"kernel {cfg.model.attention}{int8}")


def _rules_in_use(d, shown: tuple[str, ...]) -> list[tuple[str, object]]:
    """The per-call decoding settings (DecodeConfig's metadata) that differ from their defaults and are not said
    already: the rules in use (min_len, no_repeat_ngram, repetition_penalty, unk_penalty, ...)."""
    import dataclasses

    from tformer.config import DecodeConfig, request_fields

    said = set(shown) | {"max_len_a", "max_len_b", "nbest", "beam_size", "len_penalty", "temperature", "top_k",
                         "top_p", "seed"}  # said by the search's own words or the length limit
    return [(f.name, getattr(d, f.name)) for f in request_fields(DecodeConfig).values()
            if f.name not in said and getattr(d, f.name) != f.default and f.default is not dataclasses.MISSING]


def show_examples(sources: list[str], refs: list[str], outputs: list[str], n: int) -> None:
    for src, ref, out in list(zip(sources, refs, outputs))[:n]:
        mark = "ok " if out == ref else "   "
        print(f"  [{mark}] {src}\n        -> {out}\n   (ref) {ref}")
