"""Training and decoding speed of each position scheme and modern block beside the default model, in one run.

    python benchmarks/studies/model_options_speed.py [--rounds 3] [--steps 10] [--record]

The model is the textbook small one (d 256, 3+3 layers, 4 heads, FFN 1024, vocabulary 8k, SDPA kernel, dropout
0.1); each option changes one setting. Training: updates (forward, label-smoothed loss, backward, Adam) on the
same random batches (64 sentences of 30 tokens a side); decoding: greedy with the key/value cache, 64 sentences of
30 tokens, 30 steps. The options take turns, round after round, so that the machine's noise falls on all alike;
the table gives the median over rounds and the ratio to the default (above 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import gemm_ceiling, report  # noqa: E402

from tformer.api import build_model  # noqa: E402
from tformer.config import ModelConfig  # noqa: E402

OPTIONS = {
    "default (sinusoidal)": {},
    "positions relative": {"positions": "relative"},
    "positions alibi": {"positions": "alibi"},
    "positions rotary": {"positions": "rotary"},
    "positions tupe-r": {"positions": "tupe-r"},
    "decoder positions none": {"decoder_positions": "none"},
    "norm_layer rmsnorm": {"norm_layer": "rmsnorm"},
    "ffn glu (SwiGLU), d_ff 1024": {"ffn": "glu", "activation": "silu"},
    "ffn glu (SwiGLU), d_ff 683 (the default's parameters)": {"ffn": "glu", "activation": "silu", "d_ff": 683},
    "qk_norm": {"qk_norm": True},
    "kv_heads 2 (GQA)": {"kv_heads": 2},
    "kv_heads 1 (MQA)": {"kv_heads": 1},
}
V, B, L = 8000, 64, 30


def model_for(option: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"d_model": 256, "n_heads": 4, "d_ff": 1024, "encoder_layers": 3, "decoder_layers": 3,
                         **option})
    return build_model(cfg, V, V)


def train_seconds(model, batches, steps: int) -> float:
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    lengths = torch.full((B,), L)
    tic = time.perf_counter()
    for i in range(steps):
        src, tgt = batches[i % len(batches)]
        out = model(src, lengths, tgt[:, :-1], lengths - 1)
        loss = F.cross_entropy(model.generator(out.real()), tgt[:, 1:][out.mask], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - tic


@torch.no_grad()
def decode_seconds(model, src) -> float:
    model.eval()
    tic = time.perf_counter()
    cache = model.init_cache(model.encode(src, torch.full((B,), L)))
    tokens = torch.ones(B, dtype=torch.long)
    for _ in range(L):
        logits, cache = model.decode_step(tokens, cache)
        tokens = logits.argmax(-1)
    return time.perf_counter() - tic


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--record", action="store_true")
    args = p.parse_args()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(4, V, (B, L), generator=g), torch.randint(4, V, (B, L + 1), generator=g))
               for _ in range(4)]
    models = {name: model_for(option) for name, option in OPTIONS.items()}
    train_s: dict[str, list[float]] = {n: [] for n in OPTIONS}
    decode_s: dict[str, list[float]] = {n: [] for n in OPTIONS}
    for name, model in models.items():  # warm-up, not timed
        train_seconds(model, batches, 1)
        decode_seconds(model, batches[0][0])
    for _ in range(args.rounds):
        for name, model in models.items():
            train_s[name].append(train_seconds(model, batches, args.steps))
            decode_s[name].append(decode_seconds(model, batches[0][0]))
    tokens = args.steps * B * (2 * L)
    base_t, base_d = statistics.median(train_s["default (sinusoidal)"]), statistics.median(decode_s["default (sinusoidal)"])
    table = ["| option | params | train tokens/s | vs default | greedy decode, sentences/s | vs default |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, model in models.items():
        t, d = statistics.median(train_s[name]), statistics.median(decode_s[name])
        params = sum(q.numel() for q in model.parameters())
        table.append(f"| {name} | {params / 1e6:.2f}M | {tokens / t:,.0f} | {base_t / t:.2f}x | {B / d:.1f} | "
                     f"{base_d / d:.2f}x |")
    notes = (f"{torch.get_num_threads()} threads; median of {args.rounds} rounds, the options taking turns; "
             f"{args.steps} updates per round; fp32 GEMM ceiling {gemm_ceiling():.0f} GFLOP/s in this run.")
    report("Position schemes and modern blocks: training and decoding speed beside the default", table, notes,
           args.record)


if __name__ == "__main__":
    main()
