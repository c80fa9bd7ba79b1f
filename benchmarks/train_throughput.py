"""Training throughput: tformer against torch.nn.Transformer of the same size, on the same batches, in one run.

    python benchmarks/train_throughput.py [--size small|base] [--steps 20] [--rounds 3] [--dropout 0.1] [--record]
        [--variants reference reference-bf16 tformer tformer-bf16 tformer-compiled tformer-compiled-bf16]
        [--device cuda]

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
from tformer.training.compile import CompiledForward  # noqa: E402
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
        h = self.transformer(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T, device=src.device),
                             src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad)
        logits = self.generator(h)
        return F.cross_entropy(logits.view(-1, V), b.tgt_out.view(-1), ignore_index=0, label_smoothing=0.1,
                               reduction="sum")


VARIANTS = ("reference", "reference-bf16", "tformer", "tformer-bf16", "tformer-compiled", "tformer-compiled-bf16")


class Contender:
    """One model in the race: its loss, parameters, optimizer and what wraps each of its steps (autocast; for a
    compiled model also deterministic algorithms, as `tformer train` runs it: training/compile.py)."""

    def __init__(self, name: str, model: nn.Module, loss_fn, opt, device: torch.device) -> None:
        self.name, self.model, self.loss_fn, self.opt, self.device = name, model, loss_fn, opt, device
        self.params = list(model.parameters())
        self.bf16 = name.endswith("-bf16")
        self.compiled = "compiled" in name

    def step(self, b) -> float:
        """One update on batch b (already on the device); its seconds."""
        deterministic = torch.are_deterministic_algorithms_enabled()
        if self.compiled:
            torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            tic = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.loss_fn(b)
            (loss / b.n_tgt_tokens).backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - tic
        finally:
            torch.use_deterministic_algorithms(deterministic)


def contender(name: str, dropout: float, device: torch.device) -> Contender:
    torch.manual_seed(0)  # every model of a kind starts from the same weights
    if name.startswith("reference"):
        ref = Reference(dropout).to(device).train()
        opt = torch.optim.Adam(ref.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)  # the textbook loop's
        return Contender(name, ref, ref.loss, opt, device)
    ours = build_model(ModelConfig(d_model=D, n_heads=H, d_ff=FF, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                   dropout=dropout, attention_dropout=dropout, ffn_dropout=dropout,
                                   tie_generator=False), V, V).to(device).train()
    opt = build_optimizer(ours, Config())  # Adam(0.9, 0.98, 1e-9), fused, as the trainer builds it
    for group in opt.param_groups:
        group["lr"] = 1e-4
    forward = CompiledForward(ours, device) if "compiled" in name else ours
    return Contender(name, ours, lambda b: train_step_loss(forward, b, 0.1)[0], opt, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="batches per model per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["reference", "tformer"],
                    help="the models that take turns: -bf16 runs the forward under bf16 autocast (both models "
                         "alike); -compiled is train.compile (the first warm-up step compiles: its time is reported)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    global D, H, LAYERS, FF
    D, H, LAYERS, FF = SIZES[args.size]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = hashed_corpus(29000)
    src_lens, tgt_lens = model_lengths(data)
    order = token_budget_batches(src_lens, tgt_lens, args.max_tokens, seed=1)
    batches = [collate([data[i] for i in idx], idx, Vocab.pad, Vocab.bos, Vocab.eos).to(device)
               for idx in order[: args.steps * args.rounds + 3]]
    racers = [contender(name, args.dropout, device) for name in args.variants]
    warm = {}
    for c in racers:  # warm-up (a compiled model compiles in its first step)
        warm[c.name] = [c.step(b) for b in batches[:3]]
        print(f"warm-up: {c.name:24s} " + " ".join(f"{s:.2f}s" for s in warm[c.name]), flush=True)
    rows = {c.name: [] for c in racers}
    flops = {c.name: [] for c in racers}
    ceiling = gemm_ceiling() if device.type == "cpu" else float("nan")
    for r in range(args.rounds):
        chunk = batches[3 + r * args.steps : 3 + (r + 1) * args.steps]
        seconds = {c.name: 0.0 for c in racers}
        for b in chunk:  # the models take turns batch by batch: all see the machine in the same state
            for c in racers:
                seconds[c.name] += c.step(b)
        tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in chunk)
        for c in racers:
            rows[c.name].append(tokens / seconds[c.name])
            flops[c.name].append(sum(training_flops(b) for b in chunk) / seconds[c.name] / 1e9)
            print(f"round {r + 1}: {c.name:24s} {rows[c.name][-1]:8.0f} tokens/s", flush=True)
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
    if device.type == "cpu":
        ceiling = max(ceiling, gemm_ceiling())

    def ratio(name: str, base: str) -> str:  # the median of the per-round ratios (each round's turns alike)
        if base not in rows:
            return ""
        return f"{statistics.median(o / t for o, t in zip(rows[name], rows[base])):.2f}x"

    head = ("| model | params | " + " | ".join(f"round {i + 1}" for i in range(args.rounds))
            + " | median tok/s | vs reference fp32 | vs reference, same precision | GFLOP/s | of fp32 ceiling |")
    lines = [head, "|" + "---|" * (args.rounds + 7)]
    for c in racers:
        g = statistics.median(flops[c.name])
        same = "reference-bf16" if c.bf16 else "reference"
        lines.append(f"| {c.name} | {sum(p.numel() for p in c.params):,} | "
                     + " | ".join(f"{x:.0f}" for x in rows[c.name])
                     + f" | {statistics.median(rows[c.name]):.0f} | {ratio(c.name, 'reference')} | "
                     + f"{ratio(c.name, same) if c.name != same else ''} | {g:.0f} | "
                     + (f"{100 * g / ceiling:.0f}% |" if ceiling == ceiling else "|"))
    if "reference" in rows and "tformer" in rows:  # the round-by-round ratio of earlier tables
        lines.append("| **ratio tformer / reference** | | "
                     + " | ".join(f"{o / t:.2f}x" for o, t in zip(rows["tformer"], rows["reference"]))
                     + f" | **{ratio('tformer', 'reference')}** | | | | |")
    table = "\n".join(lines)
    compiled = [f"{c.name} {warm[c.name][0]:.0f} s" for c in racers if c.compiled]
    notes = (f"{args.size}: d={D}, {LAYERS}+{LAYERS} layers, {H} heads, FFN {FF}, vocab {V}, dropout {args.dropout}, "
             f"on {device.type}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
             + (f", measured fp32 GEMM ceiling {ceiling:.0f} GFLOP/s (best of before/after)"
                if ceiling == ceiling else "")
             + f", max_tokens {args.max_tokens}, {args.steps} batches per model per round; "
             f"padding is {100 * (1 - real / padded):.1f}% of the padded source+target positions"
             + (f"; the first step, compiling included: {', '.join(compiled)}" if compiled else "") + ".")
    print("\n" + table + "\n\n" + notes)
    if args.record:
        append_results(f"Training throughput vs torch.nn.Transformer ({args.size}, dropout {args.dropout}"
                       + (f", {device.type}" if device.type != "cpu" else "") + ")", table, notes)


if __name__ == "__main__":
    main()
