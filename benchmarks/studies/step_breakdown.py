"""Where a greedy decoding step's time goes, beside CTranslate2's whole step, in one process, taking turns.

Each row is a time per decoding step: the difference between decoding 40 and 8 positions, divided by 32, so
what is paid once per batch (encoding, loading, tokenising) drops out. The variants, round after round in a
rotating order (the machine is shared and noisy):

- ct2: CTranslate2 fp32 `translate_batch` (the folder converted by its own TransformersConverter), greedy, in a
  process of its own (ct2_worker.py: in this one, its OpenMP runtime slows PyTorch's down), its per-step time
  by the same difference (the pipe's cost per call drops out with the rest);
- tformer API: `Translator.translate`, greedy (the search, the API and the step);
- decode_step loop: tformer's `Transformer.decode_step` and an argmax, no search rules;
- products only: the step's matrix products alone (every decoder layer's and the generator's, in the step's
  order, on the library tformer measured for each shape at load; no attention, norms or Python around them);
- rest of the step: decode_step with every product replaced by zeros of its shape, made once (what is left).

Each row but the rest also says how fast it streams the step's product weights (read once per step), against the
machine's read bandwidth measured in the same run (common.read_bandwidth): at batch 1 a step is bound by it.

    python benchmarks/studies/step_breakdown.py [--folder FOLDER | --opus-base] [--batch-size 1 32] [--rounds 7]
                                        [--same-process] [--record]

The folder must be a post-norm Marian-shaped Hugging Face folder (what CTranslate2 converts).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, read_bandwidth, report  # noqa: E402
from ct2_worker import CT2Worker  # noqa: E402
from decoding_peers import opus_base_folder  # noqa: E402

import tformer  # noqa: E402
from tformer.model import matmul  # noqa: E402

SHORT, LONG = 8, 40


def products_of(model) -> list:
    """The step's products in its order, as the model runs them: (function, input width)."""
    chain = []
    for layer in model.decoder.layers:
        chain += [(layer.self_attn.in_proj, layer.self_attn.d_model), (layer.self_attn.out_proj, model.cfg.d_model),
                  (layer.cross_attn.prepacked["q"], model.cfg.d_model), (layer.cross_attn.out_proj, model.cfg.d_model),
                  (layer.ffn.linear1, model.cfg.d_model), (layer.ffn.linear2, layer.ffn.linear2.in_features)]
    return chain + [(model.generator, model.cfg.d_model)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="a Hugging Face MarianMT folder")
    ap.add_argument("--opus-base", action="store_true", help="build the random OPUS-MT-base-shaped folder")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--same-process", action="store_true",
                    help="run CTranslate2 in this process instead of its worker (what that costs both engines)")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    import ctranslate2
    import sentencepiece as spm
    from ctranslate2.converters import TransformersConverter

    folder = opus_base_folder(Path(tempfile.mkdtemp()) / "opus-base") if args.opus_base else Path(args.folder)
    converted = Path(tempfile.mkdtemp()) / "ct2"
    TransformersConverter(str(folder)).convert(str(converted), quantization="float32")
    threads = torch.get_num_threads()
    if args.same_process:  # how it was measured before ct2_worker.py: to show what that costs
        here = ctranslate2.Translator(str(converted), device="cpu", inter_threads=1, intra_threads=threads)
        run_ct2 = lambda pieces, n, B: here.translate_batch(pieces, beam_size=1, max_decoding_length=n,  # noqa: E731
                                                             min_decoding_length=0, max_batch_size=B)
    else:
        worker = CT2Worker(str(converted), threads)  # its own process (ct2_worker.py)
        run_ct2 = lambda pieces, n, B: worker.translate(pieces, 1, n, B)  # noqa: E731
    translator = tformer.load(folder, device="cpu")
    model = translator.model
    pieces = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f]
    chain = products_of(model)
    weight_bytes = sum(fn.weight.numel() * fn.weight.element_size() for fn, _ in chain)  # read once per step
    bandwidth = read_bandwidth(threads)  # GB/s, measured here, now
    table = ["| batch | variant | ms per step | share of tformer's step | vs ct2's step | weights streamed (GB/s) | "
             "of the read bandwidth |", "|---:|---|---:|---:|---:|---:|---:|"]
    for B in args.batch_size:
        batch = sentences[:B]
        tokens = [pieces.encode(s, out_type=str) + ["</s>"] for s in batch]
        inputs = {d: torch.randn(B, d) for _, d in chain}
        with torch.inference_mode():
            enc = model.encode(*translator_batch(translator, batch))

        def steps(n: int) -> None:
            cache, tok = model.init_cache(enc), torch.full((B,), 1)
            for _ in range(n):
                logits, cache = model.decode_step(tok, cache)
                tok = logits.argmax(-1)

        zeros: dict[tuple[int, ...], torch.Tensor] = {}

        def no_product(self, x: torch.Tensor) -> torch.Tensor:  # zeros made once per shape (no denormals)
            shape = (*x.shape[:-1], self.weight.shape[0])
            if shape not in zeros:
                zeros[shape] = torch.zeros(shape)
            return zeros[shape]

        def rest(n: int) -> None:
            call = matmul.Product.__call__
            matmul.Product.__call__ = no_product
            try:
                steps(n)
            finally:
                matmul.Product.__call__ = call

        variants = {
            "ct2": lambda n: run_ct2(tokens, n, B),
            "tformer API": lambda n: translator.translate(batch, beam=1, len_penalty=0.0, max_len_a=0.0,
                                                          max_len_b=n, batch_size=B),
            "decode_step loop": steps,
            "products only": lambda n: [fn(inputs[d]) for _ in range(n) for fn, d in chain],
            "rest of the step": rest,
        }
        per_step: dict[str, list[float]] = {name: [] for name in variants}
        with torch.inference_mode():
            for r in range(args.rounds + 1):  # round 0 warms up, untimed
                names = list(variants)[r % len(variants):] + list(variants)[: r % len(variants)]
                for name in names:
                    took = {}
                    for n in (SHORT, LONG):
                        tic = time.perf_counter()
                        variants[name](n)
                        took[n] = time.perf_counter() - tic
                    if r:
                        per_step[name].append((took[LONG] - took[SHORT]) / (LONG - SHORT) * 1000)
        median = {name: statistics.median(v) for name, v in per_step.items()}
        for name in variants:
            share = "" if name == "ct2" else f"{median[name] / median['decode_step loop']:.0%}"
            rate = weight_bytes / (median[name] / 1000) / 1e9  # every variant but the rest reads every weight
            streamed = ("| n/a | n/a |" if name == "rest of the step" else
                        f"| {rate:.1f} | {rate / bandwidth:.0%} |")
            table.append(f"| {B} | {name} | {median[name]:.2f} | {share} | {median[name] / median['ct2']:.2f}x "
                         + streamed)
    notes = (f"{folder.name}: d={model.cfg.d_model}, {model.cfg.decoder_layers} decoder layers, vocabulary "
             f"{model.generator.out_features}; Multi30k test2016 sentences; per step = (time for {LONG} positions - "
             f"time for {SHORT}) / {LONG - SHORT}, median of {args.rounds} rounds taking turns; {threads} threads; "
             f"CTranslate2 {ctranslate2.__version__}. \"share\" is against tformer's decode_step loop. Weights "
             f"streamed: the step's product weights ({weight_bytes / 1e6:.0f} MB, read once per step) / its time; "
             f"the read bandwidth: {bandwidth:.1f} GB/s, {threads} threads summing 1 GiB (common.read_bandwidth), "
             f"measured in this run; at batch 1 a step is bound by it.")
    where = "in this process (--same-process)" if args.same_process else "in a process of its own"
    report(f"Where a greedy decoding step's time goes, beside CTranslate2's step (CTranslate2 {where})", table,
           notes, args.record)


def translator_batch(translator, batch: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sentences as the model's source ids (B, S), padded, and their lengths (B,)."""
    ids = [translator.encode(s) + [2] for s in batch]  # + </s>
    src = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
    for i, s in enumerate(ids):
        src[i, : len(s)] = torch.tensor(s)
    return src, torch.tensor([len(s) for s in ids])


if __name__ == "__main__":
    main()
