"""Training throughput: tformer against torch.nn.Transformer of the same size, on the same batches, in one run.

    python benchmarks/train_throughput.py [--size small|base] [--steps 20] [--rounds 3] [--dropout 0.1] [--append]

Both models: small d=256, 3+3 layers, 4 heads, FFN 1024 (base: d=512, 6+6, 8 heads, FFN 2048), vocabulary
8000 (untied embeddings and generator), Adam (torch's default loop for the reference, tformer's
`build_optimizer`, fused, for tformer), label-smoothed cross-entropy, post-norm. The reference is the textbook set-up: nn.Embedding scaled by
sqrt(d) + sinusoidal positions, nn.Transformer with padding and causal masks, a Linear generator over every
position, F.cross_entropy(label_smoothing=0.1, ignore_index=pad). The batches are token-budget batches of
Multi30k (en->de) sentences, each word hashed to one of 8000 ids, so lengths and padding are real.
The two models take turns batch by batch (noisy shared machine); a round is `--steps` batches each, and the
table gives each round and the median.
Throughput counts source + target tokens the model sees (</s> and <s> included), padding excluded.
The fp32 matrix-multiply ceiling (torch.mm 1024^3, best of 10) is measured in the same run, before and
after; "of ceiling" is the model's useful arithmetic (3x the forward FLOPs of the real tokens: projections,
FFN, attention over the padded lengths, generator) per second over that ceiling.
"""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, append_results, gemm_ceiling  # noqa: E402

from tformer.config import Config, ModelConfig  # noqa: E402
from tformer.data import Vocab, collate, model_lengths, token_budget_batches  # noqa: E402
from tformer.model import build_model  # noqa: E402
from tformer.positions import sinusoidal_table  # noqa: E402
from tformer.training.loop import build_optimizer, train_step_loss  # noqa: E402

V = 8000
SIZES = {"small": (256, 4, 3, 1024), "base": (512, 8, 6, 2048)}  # d, heads, layers per side, FFN
D, H, LAYERS, FF = SIZES["small"]


def training_flops(b) -> float:
    """3 x forward multiply-add FLOPs of one batch's real tokens (attention over the padded lengths)."""
    S, T = b.src.shape[1], b.tgt_in.shape[1]
    enc = LAYERS * 2 * (4 * D * D + 2 * D * FF + 2 * D * S)
    dec = LAYERS * 2 * (4 * D * D + 2 * D * D + 2 * D * FF + 2 * D * T + 2 * D * S) + 2 * D * V
    return 3 * (b.n_src_tokens * enc + b.n_tgt_tokens * dec)


def hashed_corpus(n: int) -> list[tuple[list[int], list[int]]]:
    src_path, tgt_path = SHARED_DATA / "multi30k" / "train.en.gz", SHARED_DATA / "multi30k" / "train.de.gz"
    if not src_path.exists():
        sys.exit(f"{src_path} not found: set TFORMER_SHARED_DATA to the folder holding multi30k/")

    def ids(line: str) -> list[int]:
        return [4 + zlib.crc32(w.encode()) % (V - 4) for w in line.split()]

    with gzip.open(src_path, "rt", encoding="utf-8") as fs, gzip.open(tgt_path, "rt", encoding="utf-8") as ft:
        return [(ids(s), ids(t)) for s, t, _ in zip(fs, ft, range(n))]


class Reference(nn.Module):
    """The textbook model around torch.nn.Transformer."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(V, D), nn.Embedding(V, D)
        self.register_buffer("pe", sinusoidal_table(512, D))
        self.drop = nn.Dropout(dropout)
        self.transformer = nn.Transformer(D, H, LAYERS, LAYERS, FF, dropout, batch_first=True)
        self.generator = nn.Linear(D, V)

    def loss(self, b) -> torch.Tensor:
        S, T = b.src.shape[1], b.tgt_in.shape[1]
        src = self.drop(self.src_emb(b.src) * math.sqrt(D) + self.pe[:S])
        tgt = self.drop(self.tgt_emb(b.tgt_in) * math.sqrt(D) + self.pe[:T])
        src_pad, tgt_pad = b.src == 0, b.tgt_in == 0
        h = self.transformer(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                             src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad)
        logits = self.generator(h)
        return F.cross_entropy(logits.view(-1, V), b.tgt_out.view(-1), ignore_index=0, label_smoothing=0.1,
                               reduction="sum")


def step(loss_fn, params, opt, b) -> float:
    """One update on batch b; its seconds."""
    tic = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    (loss_fn(b) / b.n_tgt_tokens).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return time.perf_counter() - tic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="batches per model per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    global D, H, LAYERS, FF
    D, H, LAYERS, FF = SIZES[args.size]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = hashed_corpus(29000)
    src_lens, tgt_lens = model_lengths(data)
    order = token_budget_batches(src_lens, tgt_lens, args.max_tokens, seed=1)
    batches = [collate([data[i] for i in idx], idx, Vocab.pad, Vocab.bos, Vocab.eos)
               for idx in order[: args.steps * args.rounds + 3]]
    ours = build_model(ModelConfig(d_model=D, n_heads=H, d_ff=FF, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                   dropout=args.dropout, attention_dropout=args.dropout, ffn_dropout=args.dropout,
                                   tie_generator=False), V, V).train()
    ref = Reference(args.dropout).train()
    n_ours, n_ref = (sum(p.numel() for p in m.parameters()) for m in (ours, ref))
    ours_opt = build_optimizer(ours, Config())  # Adam(0.9, 0.98, 1e-9) as configured by default
    for group in ours_opt.param_groups:
        group["lr"] = 1e-4
    contenders = {  # the textbook Adam for the reference; tformer's trainer builds its own (fused)
        "torch.nn.Transformer": (ref.loss, list(ref.parameters()),
                                 torch.optim.Adam(ref.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)),
        "tformer": (lambda b: train_step_loss(ours, b, 0.1)[0], list(ours.parameters()), ours_opt),
    }
    for fn, params, opt in contenders.values():  # warm-up
        for b in batches[:3]:
            step(fn, params, opt, b)
    rows = {name: [] for name in contenders}
    flops = {name: [] for name in contenders}
    ceiling = gemm_ceiling()
    for r in range(args.rounds):
        chunk = batches[3 + r * args.steps : 3 + (r + 1) * args.steps]
        seconds = {name: 0.0 for name in contenders}
        for b in chunk:  # the models take turns batch by batch: both see the machine in the same state
            for name, (fn, params, opt) in contenders.items():
                seconds[name] += step(fn, params, opt, b)
        tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in chunk)
        for name in contenders:
            rows[name].append(tokens / seconds[name])
            flops[name].append(sum(training_flops(b) for b in chunk) / seconds[name] / 1e9)
            print(f"round {r + 1}: {name:22s} {rows[name][-1]:8.0f} tokens/s", flush=True)
    ratios = [o / t for o, t in zip(rows["tformer"], rows["torch.nn.Transformer"])]
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
    ceiling = max(ceiling, gemm_ceiling())
    head = ("| model | params | " + " | ".join(f"round {i + 1}" for i in range(args.rounds))
            + " | median tok/s | GFLOP/s | of ceiling |")
    lines = [head, "|" + "---|" * (args.rounds + 5)]
    for name, n in (("torch.nn.Transformer", n_ref), ("tformer", n_ours)):
        g = statistics.median(flops[name])
        lines.append(f"| {name} | {n:,} | " + " | ".join(f"{x:.0f}" for x in rows[name])
                     + f" | {statistics.median(rows[name]):.0f} | {g:.0f} | {100 * g / ceiling:.0f}% |")
    lines.append("| **ratio tformer / reference** | | " + " | ".join(f"{x:.2f}x" for x in ratios)
                 + f" | **{statistics.median(ratios):.2f}x** | | |")
    table = "\n".join(lines)
    notes = (f"{args.size}: d={D}, {LAYERS}+{LAYERS} layers, {H} heads, FFN {FF}, vocab {V}, dropout {args.dropout}, "
             f"measured fp32 GEMM ceiling {ceiling:.0f} GFLOP/s (best of before/after), "
             f"max_tokens {args.max_tokens}, {args.steps} batches per model per round; "
             f"padding is {100 * (1 - real / padded):.1f}% of the padded source+target positions.")
    print("\n" + table + "\n\n" + notes)
    if args.append:
        append_results(f"Training throughput vs torch.nn.Transformer ({args.size}, dropout {args.dropout})", table,
                       notes)


if __name__ == "__main__":
    main()
