"""Decoding throughput across model variants and sizes: sentences/s and target tokens/s, greedy and beam 5,
batch 1 and 64, for the small (d=256, 3+3) and base (d=512, 6+6) models in their vanilla, graph-attention,
Universal Transformer and TUPE forms.

    python benchmarks/studies/decoding_grid.py [--sizes small base] [--sentences 128] [--record]

Random weights (vocabulary 8000), Multi30k test2016 sources hashed to ids; random weights decode to the
output limit (`--max-len`), so every variant produces the same number of tokens and the figures compare
the machinery. Batch 1 decodes the first `--sentences // 8` sentences one at a time. Universal
Transformer: up to 4 ACT steps, halting biases at their initial value.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, append_results  # noqa: E402

from tformer.config import DecodeConfig, ModelConfig  # noqa: E402
from tformer.inference import translate_ids  # noqa: E402
from tformer.model import build_model  # noqa: E402

V = 8000
SIZES = {"small": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
         "base": dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6)}
VARIANTS = {"vanilla": {}, "graph": dict(attention="graph"), "universal": dict(kind="universal", max_steps=4),
            "tupe-r": dict(positions="tupe-r")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["small", "base"], choices=sorted(SIZES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=40)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.split() for line, _ in zip(f, range(args.sentences))]
    ids = [[4 + zlib.crc32(w.encode()) % (V - 4) for w in words] for words in lines]
    table = ["| size | variant | decoding | batch | sentences/s | target tokens/s |", "|---|---|---|---:|---:|---:|"]
    for size in args.sizes:
        for variant in args.variants:
            torch.manual_seed(0)
            cfg = ModelConfig(**SIZES[size], **VARIANTS[variant], dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0)
            model = build_model(cfg, V, V).eval()
            for beam in (1, 5):
                for batch in (1, 64):
                    sources = ids if batch > 1 else ids[: max(1, args.sentences // 8)]
                    decode = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                                          max_len_a=0.0, max_len_b=args.max_len, batch_size=batch)
                    translate_ids(model, sources[:2], decode)  # warm-up
                    tic = time.perf_counter()
                    out = translate_ids(model, sources, decode).tokens
                    secs = time.perf_counter() - tic
                    n_tok = sum(len(h[0]) + 1 for h in out)
                    table.append(f"| {size} | {variant} | {'greedy' if beam == 1 else 'beam 5'} | {batch} | "
                                 f"{len(sources) / secs:.1f} | {n_tok / secs:,.0f} |")
                    print(table[-1], flush=True)
    notes = (f"random weights, vocabulary {V}, {args.sentences} Multi30k test2016 sources at batch 64 and "
             f"{max(1, args.sentences // 8)} at batch 1, output limit {args.max_len}; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; one pass each (no interleaving): compare within a row group.")
    print("\n".join(table) + "\n" + notes)
    if args.record:
        append_results("Decoding throughput: sizes and variants", "\n".join(table), notes)


if __name__ == "__main__":
    main()
