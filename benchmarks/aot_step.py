"""tformer's decoding step compiled ahead of time by AOTInductor, against the same step run eagerly: issue 64's
"AOTInductor, if it beats it", measured before building it in.

The compiled step is the graph `tformer export --format onnx` writes (tformer.export.onnx.OnnxStep: the model's own
`decode_step` over a cache of plain tensors, batch, source and cache lengths dynamic), exported by torch.export and
compiled by AOTInductor (`aoti_compile_and_package`: C++ kernels, the products on inductor's own choice, weights
frozen into the package). Both decode the same sentences greedily from the same encoder output, `--steps` positions,
rounds taking turns; the tokens must agree. The table gives ms per step (the difference between `--steps` and 8
positions, over the difference) and the compile time, paid once per model (the shapes are dynamic: nothing
recompiles). One process, `--threads` threads.

    python benchmarks/aot_step.py (--folder FOLDER | --opus-base | --small) [--batch-size 1 8 32] [--steps 40]
                                  [--rounds 5] [--record]

FOLDER: a Hugging Face MarianMT folder or a tformer run; --small: a random folder of the `student_small` shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402
from decoding_peers import opus_base_folder  # noqa: E402

import tformer  # noqa: E402
from tformer.export.onnx import OnnxStep  # noqa: E402


def compiled_step(model, out: Path):
    """The model's step exported as the ONNX export does and compiled by AOTInductor: (runner, seconds)."""
    import torch._inductor.config as inductor

    cfg = model.cfg
    L, H, Dh = len(model.decoder.layers), cfg.n_heads, cfg.d_model // cfg.n_heads
    B, S, T = 2, 7, 3
    args = (torch.randint(4, 10, (B,)), torch.ones(B, S, dtype=torch.bool), torch.randn(L, B, H, S, Dh),
            torch.randn(L, B, H, S, Dh), torch.randn(L, B, H, T, Dh), torch.randn(L, B, H, T, Dh))
    batch, source = torch.export.Dim("batch"), torch.export.Dim("source")
    past = torch.export.Dim("past", max=1023)
    inductor.freezing = True
    tic = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(OnnxStep(model).eval(), args, strict=False, dynamic_shapes=(
            {0: batch}, {0: batch, 1: source}, {1: batch, 3: source}, {1: batch, 3: source}, {1: batch, 3: past},
            {1: batch, 3: past}))
        path = torch._inductor.aoti_compile_and_package(program, package_path=str(out / "step.pt2"))
    seconds = time.perf_counter() - tic
    return torch._inductor.aoti_load_package(path), seconds


def small_folder(out: Path) -> Path:
    """A random MarianMT folder of the `student_small` shape (d 128, 3+3 layers, 4 heads, FFN 512, an 11,625
    table), built with the tests' builder as `decoding_peers.opus_base_folder` is."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hf_marian_models import make_folder

    return make_folder(out, seed=0, d_model=128, layers=3, heads=4, ffn=512, src_size=6000, tgt_size=6000,
                       vocab_size=11624, n_sentences=29000, init_std=0.02, eos_bias=0.0, drop_piece=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--folder")
    where.add_argument("--opus-base", action="store_true")
    where.add_argument("--small", action="store_true")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    folder = (opus_base_folder(work / "opus-base") if args.opus_base else small_folder(work / "small") if args.small
              else Path(args.folder))
    translator = tformer.load(folder, device="cpu", threads=args.threads)
    model = translator.model
    runner, compile_s = compiled_step(model, work)
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sources = [translator.encode(line.strip()) + [2] for line in f][: max(args.batch_size)]
    table = ["| batch | eager ms per step | AOTInductor ms per step | eager / compiled | tokens equal |",
             "|---:|---:|---:|---:|---|"]
    for B in args.batch_size:
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources[:B]], batch_first=True)
        lengths = torch.tensor([len(s) for s in sources[:B]])
        with torch.inference_mode():
            enc = model.encode(src, lengths)

            def eager(steps: int) -> list[torch.Tensor]:
                cache, tok, out = model.init_cache(enc), torch.full((B,), 1), []
                for _ in range(steps):
                    logits, cache = model.decode_step(tok, cache)
                    tok = torch.log_softmax(logits, -1).argmax(-1)
                    out.append(tok)
                return out

            def compiled(steps: int) -> list[torch.Tensor]:
                cache = dataclasses.replace(model.init_cache(enc), preallocated=False)
                logits, cache = model.decode_step(torch.full((B,), 1), cache)  # the first position, as the export
                tok = torch.log_softmax(logits, -1).argmax(-1)
                cross_k, cross_v = (torch.stack([kv[i] for kv in cache.cross]) for i in (0, 1))
                self_k, self_v = (torch.stack([kv[i] for kv in cache.self_kv]) for i in (0, 1))
                out = [tok]
                for _ in range(steps - 1):
                    logp, self_k, self_v = runner(tok, cache.src_mask, cross_k, cross_v, self_k, self_v)
                    tok = logp.argmax(-1)
                    out.append(tok)
                return out

            same = all(torch.equal(a, b) for a, b in zip(eager(args.steps), compiled(args.steps)))
            variants = {"eager": eager, "compiled": compiled}
            times: dict[str, list[float]] = {name: [] for name in variants}
            for r in range(args.rounds):
                for name in list(variants)[r % 2:] + list(variants)[: r % 2]:
                    tic = time.perf_counter()
                    variants[name](args.steps)
                    long = time.perf_counter() - tic
                    tic = time.perf_counter()
                    variants[name](8)
                    times[name].append((long - (time.perf_counter() - tic)) / (args.steps - 8) * 1e3)
        e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
        table.append(f"| {B} | {e:.3f} | {c:.3f} | {e / c:.2f}x | {'yes' if same else 'NO'} |")
        print(table[-1], flush=True)
    cfg = model.cfg
    notes = (f"{folder.name}: d {cfg.d_model}, {len(model.decoder.layers)} decoder layers, {cfg.n_heads} heads, "
             f"vocabulary {model.generator.weight.shape[0]}; fp32; greedy from <s> over Multi30k test2016 sources, "
             f"{args.steps} positions; ms per step = (time for {args.steps} - time for 8) / {args.steps - 8}, median "
             f"of {args.rounds} rounds taking turns; {args.threads} threads; AOTInductor compile (export included): "
             f"{compile_s:.0f} s, once per model (dynamic shapes); torch {torch.__version__}")
    report("The decoding step compiled ahead of time (AOTInductor) against eager", table, notes, args.record)


if __name__ == "__main__":
    main()
