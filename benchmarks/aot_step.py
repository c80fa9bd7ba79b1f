"""tformer's decoding step compiled ahead of time by AOTInductor, against the same step run eagerly: issue 64's
"AOTInductor, if it beats it", measured first with an export of its own, and since with the library's.

The compiled step is the library's (`decode.compile`, tformer.model.compiled.compile_step): the model's own
`decode_step` over a cache of plain tensors, exported by torch.export and compiled by AOTInductor (C++ kernels, the
products on inductor's own choice, weights frozen into the package), batch, hypotheses, source and positions all
dynamic. Here it runs at every batch, whatever the measurement at load chose. Both decode the same sentences
greedily from the same encoder output, `--steps` positions, rounds taking turns; the tokens must agree. The table
gives ms per step (the difference between `--steps` and 8 positions, over the difference) and the compile time,
paid once per model (0 where the package was read from $TFORMER_CACHE/steps). One process, `--threads` threads.

    python benchmarks/aot_step.py (--folder FOLDER | --opus-base | --small) [--batch-size 1 8 32] [--steps 40]
                                  [--rounds 5] [--record]

FOLDER: a Hugging Face MarianMT folder or a tformer run; --small: a random folder of the `student_small` shape.
"""

from __future__ import annotations

import argparse
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
from tformer.model.compiled import ROWS, compile_step  # noqa: E402


def small_folder(out: Path) -> Path:
    """A random MarianMT folder of the `student_small` shape (d 128, 3+3 layers, 4 heads, FFN 512, an 11,625
    table), built with the tests' builder as `decoding_peers.opus_base_folder` is."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.hf_marian_models import make_folder

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
    step = compile_step(model)
    step.faster = (True,) * len(ROWS)  # compiled at every batch: this compares the two
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
                cache, tok, out = step.start(model.init_cache(enc)), torch.full((B,), 1), []
                for _ in range(steps):
                    logits, cache = step(tok, cache)
                    tok = torch.log_softmax(logits, -1).argmax(-1)
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
             f"{step.seconds:.0f} s, once per model (dynamic shapes); torch {torch.__version__}")
    report("The decoding step compiled ahead of time (AOTInductor) against eager", table, notes, args.record)


if __name__ == "__main__":
    main()
