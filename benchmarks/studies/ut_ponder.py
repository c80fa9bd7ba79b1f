"""Adaptive Universal Transformer: does the packed (graph) layout turn a lower mean ponder into less time? In one
run, side by side, the graph UT (model.attention: graph, a step computes the running positions alone) and the
padded UT (model.attention: sdpa, every position is computed until the batch's last one halts), with the same
weights, at forced mean ponders of about 1, 2, 4 and max_steps (8).

    python benchmarks/studies/ut_ponder.py [--quick] [--record] [--threads 1] [--batches 2] [--tokens 3000] [--bucketed]

Torch runs on one thread unless --threads says otherwise (see its help): the figures are ratios, side by side.

train    one training step's forward + backward (as train_step_loss: generator, label-smoothed loss, ponder cost
         0.01; no optimiser step), train mode, dropout 0.1, UT d 256, 4 heads, d_ff 1024, max_steps 8, pre-norm.
         Batches of pairs drawn at random (a real length mix inside each batch) until `--tokens` real source +
         target tokens; lengths: the Multi30k train split's whitespace word counts + 1 (3 .. 40 tokens a side),
         token ids random (vocabulary 8000). --bucketed: the trainer's length-sorted token-budget batches instead
         (nearly no length padding; the padded layout then wastes only what ACT halting leaves idle).
decode   greedy translate_ids (output limit 1.0 x source + 5, batch 64), eval mode, on `--sentences` sources of
         the same length mix: tokens/s, and the mean ACT steps the encoder and the decoder actually took (read by
         wrappers around model.encode and model.decode_step, from cache.steps); beam 4 at mean ponder 2.

Forcing the ponder: each stack's halting unit gets weights ~ Normal(0, (spread / sqrt(D))^2) (one fixed draw, so
positions halt at different steps) and one bias shared by both stacks, found by bisection so that the mean steps
per real position (encoder and decoder together, `model(...).ponder`, train mode, a fixed seed) hit the target;
ponder 1 uses bias +1000 (every position halts at step 1), max -1000 (every position runs max_steps; at -30
the growing states of an untrained stack still halted some positions early). The
graph model's weights are loaded into the padded one. Dropout draws differ between the layouts, so in train mode
the two can halt a few positions differently; the eval-mode check counts positions whose steps differ.

Time: a warm-up call each, then the two models take turns on every batch (order alternating) for `--repeats`
rounds; per batch the median, summed over batches. "useful GFLOP" counts the matrix products a position needs at
the steps it runs (projections, FFN, cross attention's memory projection once, generator; backward = 2 x
forward): its ratio to max ponder is what an ideal packed implementation would reach.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, gemm_ceiling, report  # noqa: E402

from tformer.config import DecodeConfig, ModelConfig  # noqa: E402
from tformer.data import Vocab, collate, token_budget_batches  # noqa: E402
from tformer.inference import decode_batches, translate_ids  # noqa: E402
from tformer.model import build_model  # noqa: E402
from tformer.training.loss import generator_loss  # noqa: E402

V, D, H, DFF, MAX_STEPS = 8000, 256, 4, 1024, 8
TARGET_RATIO = 0.40  # the target: graph UT time at mean ponder 2 <= 40% of its max-ponder time
KINDS = ("graph", "sdpa")


# --------------------------------------------------------------------------- data


def length_pairs(n: int, seed: int) -> tuple[list[tuple[int, int]], str]:
    """n (source words, target words) pairs, clipped to 2 .. 39 (3 .. 40 tokens with </s> or <s>)."""
    g = torch.Generator().manual_seed(seed)
    folder = SHARED_DATA / "multi30k"
    if (folder / "train.en.gz").exists():
        with gzip.open(folder / "train.en.gz", "rt", encoding="utf-8") as f:
            en = [len(line.split()) for line in f]
        with gzip.open(folder / "train.de.gz", "rt", encoding="utf-8") as f:
            de = [len(line.split()) for line in f]
        picks = torch.randint(len(en), (n,), generator=g).tolist()
        pairs, source = [(en[i], de[i]) for i in picks], "Multi30k train word counts"
    else:  # Normal(12, 4.5) words, as Multi30k's
        w = (torch.randn(n, 2, generator=g) * 4.5 + 12).round().long().tolist()
        pairs, source = [(a, b) for a, b in w], "Normal(12, 4.5) words (Multi30k not found)"
    return [(min(max(a, 2), 39), min(max(b, 2), 39)) for a, b in pairs], source


def random_ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(4, V, (n,), generator=g).tolist()


def train_batches(n: int, tokens: int, bucketed: bool, seed: int = 0):
    """n batches of random ids at lengths drawn from the mix. Mixed (default): pairs drawn at random until the
    batch holds `tokens` real source + target tokens. Bucketed: the trainer's token-budget batcher (sorted by
    length, sentences x longest <= `tokens` per side) over 29,000 drawn pairs, n batches spread over the
    length range (nearly no padding)."""
    g = torch.Generator().manual_seed(seed + 1)
    if bucketed:
        pairs, source = length_pairs(29000, seed)
        src_lens, tgt_lens = [a + 1 for a, _ in pairs], [b + 1 for _, b in pairs]
        every = token_budget_batches(src_lens, tgt_lens, tokens, seed=seed)
        every.sort(key=lambda b: src_lens[b[0]])
        picks = [every[int((i + 0.5) * len(every) / n)] for i in range(n)]  # quantiles of the sentence length
    else:
        pairs, source = length_pairs(n * tokens // 6 + 1, seed)  # enough: a pair holds >= 6 tokens
        picks, it = [], iter(range(len(pairs)))
        for _ in range(n):
            batch, size = [], 0
            while size < tokens:
                i = next(it)
                batch.append(i)
                size += pairs[i][0] + pairs[i][1] + 2
            picks.append(batch)
    out = []
    for b in picks:
        examples = [(random_ids(pairs[i][0], g), random_ids(pairs[i][1], g)) for i in b]
        out.append(collate(examples, b, Vocab.pad, Vocab.bos, Vocab.eos))
    return out, source


def decode_sources(n: int, seed: int = 2) -> list[list[int]]:
    pairs, _ = length_pairs(n, seed)
    g = torch.Generator().manual_seed(seed + 1)
    return [random_ids(a, g) for a, _ in pairs]


# --------------------------------------------------------------------------- models and forced ponder


def build(kind: str):
    torch.manual_seed(0)
    cfg = ModelConfig(kind="universal", d_model=D, n_heads=H, d_ff=DFF, max_steps=MAX_STEPS, norm="pre",
                      dropout=0.1, attention_dropout=0.1, ffn_dropout=0.1, attention=kind)
    return build_model(cfg, V, V)


@torch.no_grad()
def set_halting(model, bias: float, spread: float, seed: int = 0) -> None:
    """Halting weights ~ Normal(0, (spread / sqrt(D))^2), one fixed draw per stack; the bias of both stacks."""
    g = torch.Generator().manual_seed(seed)
    for stack in (model.encoder, model.decoder):
        stack.halt.weight.copy_(torch.randn(stack.halt.weight.shape, generator=g) * spread / math.sqrt(D))
        stack.halt.bias.fill_(bias)


def step_counts(model, batch):
    """(source steps, target steps) of the real positions, flattened, from one forward (no gradient)."""
    with torch.no_grad():
        out = model(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_lengths)
    src_p, tgt_p = out.ponder
    return src_p.steps[src_p.steps > 0], tgt_p.steps[tgt_p.steps > 0]


def mean_ponder(model, batches, seed: int = 123) -> tuple[float, int]:
    """Mean steps per real position (encoder and decoder together) and the most steps, train mode, fixed seed."""
    torch.manual_seed(seed)
    total = count = most = 0
    for b in batches:
        for s in step_counts(model, b):
            total, count, most = total + float(s.sum()), count + s.numel(), max(most, int(s.max()))
    return total / count, most


def force_bias(model, batches, target: float, spread: float, iters: int) -> float:
    """The halting bias at which the mean ponder is `target` (bisection; the mean falls as the bias rises)."""
    if target <= 1:
        return 1000.0  # p = 1 at the first step
    if target >= MAX_STEPS:
        return -1000.0  # p = 0: no state grows large enough to halt before max_steps
    lo, hi = -20.0, 20.0  # ponder(lo) high, ponder(hi) low
    for _ in range(iters):
        mid = (lo + hi) / 2
        set_halting(model, mid, spread)
        m, _ = mean_ponder(model, batches)
        if abs(m - target) < 0.02:
            return mid
        lo, hi = (mid, hi) if m > target else (lo, mid)
    return (lo + hi) / 2


# --------------------------------------------------------------------------- useful work


def useful_gflop(src_steps: float, tgt_steps: float, n_src: int, n_tgt: int) -> float:
    """Matrix FLOPs a training step needs (forward x 3) at these summed steps: per position-step, encoder
    q/k/v/o + FFN, decoder self q/k/v/o + cross q/o + FFN; cross k/v of the memory once; the generator."""
    enc = 2 * (4 * D * D + 2 * D * DFF)
    dec = 2 * (6 * D * D + 2 * D * DFF)
    fwd = src_steps * enc + tgt_steps * dec + n_src * 2 * 2 * D * D + n_tgt * 2 * D * V
    return 3 * fwd / 1e9


# --------------------------------------------------------------------------- timing


def timed_step(model, batch):
    """One forward + backward; seconds and the ponder of the forward (source steps, target steps)."""
    tic = time.perf_counter()
    output = model(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_lengths)
    real = batch.tgt_out != Vocab.pad
    loss = generator_loss(output.real(), model.generator, batch.tgt_out[real], 0.1, Vocab.pad).loss
    loss = loss + 0.01 * sum(p.cost for p in output.ponder)
    loss.backward()
    model.zero_grad(set_to_none=True)
    secs = time.perf_counter() - tic
    return secs, tuple(p.steps.detach() for p in output.ponder)


def bench_train(models, batches, settings, repeats: int) -> tuple[dict, dict]:
    """Per setting: ms per batch (fwd + bwd) of each kind, the sum over batches of each batch's median over the
    rounds (the two models take turns on every batch, the order alternating), and the steps of the timed calls:
    (mean per real position, most, summed source steps per round, summed target steps per round)."""
    times, ponders = {}, {}
    for name, bias in settings:
        for m in models.values():
            set_halting(m, bias, ARGS.spread)
        for k in KINDS:
            timed_step(models[k], batches[0])  # warm
        per = {k: [[] for _ in batches] for k in KINDS}
        steps = {k: [0.0, 0, 0, 0.0, 0.0] for k in KINDS}  # total steps, positions, most, src steps, tgt steps
        for r in range(repeats):
            for i, b in enumerate(batches):
                for k in (KINDS if (r + i) % 2 == 0 else KINDS[::-1]):
                    secs, (sp, tp) = timed_step(models[k], b)
                    per[k][i].append(secs)
                    st = steps[k]
                    st[0] += float(sp.sum() + tp.sum())
                    st[1] += int((sp > 0).sum() + (tp > 0).sum())
                    st[2] = max(st[2], int(sp.max()), int(tp.max()))
                    st[3] += float(sp.sum()) / repeats
                    st[4] += float(tp.sum()) / repeats
        times[name] = {k: sum(statistics.median(v) for v in per[k]) / len(batches) * 1000 for k in KINDS}
        ponders[name] = {k: (s[0] / s[1], s[2], s[3], s[4]) for k, s in steps.items()}
        print(f"  [{time.perf_counter() - T0:.0f} s] train {name}: "
              + ", ".join(f"{k} {times[name][k]:.0f} ms (ponder {ponders[name][k][0]:.2f}, "
                                              f"max {ponders[name][k][1]})" for k in KINDS), flush=True)
    return times, ponders


def eval_agreement(models, batch) -> tuple[int, int]:
    """Eval mode (no dropout): positions whose steps differ between graph and padded, out of all real ones."""
    diff = total = 0
    for m in models.values():
        m.eval()
    try:
        a, b = (step_counts(models[k], batch) for k in KINDS)
        for x, y in zip(a, b):
            diff, total = diff + int((x != y).sum()), total + x.numel()
    finally:
        for m in models.values():
            m.train()
    return diff, total


class StepCounter:
    """Wraps model.encode / model.decode_step to add up the ACT steps taken while decoding."""

    def __init__(self, model) -> None:
        self.model, self.enc, self.dec = model, [0.0, 0], [0.0, 0]
        encode, decode_step = model.encode, model.decode_step

        def counted_encode(src, src_lengths, need_weights=False):
            out = encode(src, src_lengths, need_weights)
            s = out.ponder.steps
            self.enc[0] += float(s.sum())
            self.enc[1] += int((s > 0).sum())
            return out

        def counted_step(tokens, cache):
            logits, cache = decode_step(tokens, cache)
            self.dec[0] += float(cache.steps[:, -1].sum())
            self.dec[1] += cache.steps.shape[0]
            return logits, cache

        model.encode, model.decode_step = counted_encode, counted_step

    def reset(self) -> None:
        self.enc, self.dec = [0.0, 0], [0.0, 0]

    def means(self) -> tuple[float, float]:
        return self.enc[0] / max(self.enc[1], 1), self.dec[0] / max(self.dec[1], 1)


def bench_decode(models, sources, settings, repeats: int, beam_at: str | None) -> list[str]:
    """Tokens/s of each kind per setting. The sources are cut into translate_ids's own batches (longest first,
    64 each); the two models take turns on every batch, the order alternating; per batch the median over the
    rounds, summed."""
    counters = {k: StepCounter(models[k]) for k in KINDS}
    chunks = [[sources[i] for i in rows] for rows in decode_batches([len(s) + 1 for s in sources], 64)]
    rows = []
    runs = [(name, bias, 1) for name, bias in settings] + ([(beam_at, dict(settings)[beam_at], 4)] if beam_at else [])
    for name, bias, beam in runs:
        cfg = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                           max_len_a=1.0, max_len_b=5, batch_size=64)
        for m in models.values():
            set_halting(m, bias, ARGS.spread)
            m.eval()
        for k in KINDS:
            translate_ids(models[k], chunks[-1], cfg)  # warm
            counters[k].reset()
        per = {k: [[] for _ in chunks] for k in KINDS}
        toks = {k: 0 for k in KINDS}
        reps = repeats if beam == 1 else max(1, repeats - 1)
        for r in range(reps):
            for i, chunk in enumerate(chunks):
                for k in (KINDS if (r + i) % 2 == 0 else KINDS[::-1]):
                    tic = time.perf_counter()
                    out = translate_ids(models[k], chunk, cfg).tokens
                    per[k][i].append(time.perf_counter() - tic)
                    if r == 0:
                        toks[k] += sum(len(h[0]) + 1 for h in out)
        med = {k: sum(statistics.median(v) for v in per[k]) for k in KINDS}
        steps = {k: counters[k].means() for k in KINDS}
        label = "greedy" if beam == 1 else f"beam {beam}"
        rows.append(f"| {name} | {label} | {steps['graph'][0]:.2f} / {steps['sdpa'][0]:.2f} | "
                    f"{steps['graph'][1]:.2f} / {steps['sdpa'][1]:.2f} | {toks['graph']:,} / {toks['sdpa']:,} | "
                    f"{toks['graph'] / med['graph']:,.0f} | {toks['sdpa'] / med['sdpa']:,.0f} | "
                    f"{med['sdpa'] / med['graph']:.2f}x |")
        print(f"  [{time.perf_counter() - T0:.0f} s] decode " + rows[-1], flush=True)
    for m in models.values():
        m.train()
    return rows


# --------------------------------------------------------------------------- main


ARGS: argparse.Namespace
LOADS: list[float] = []  # 1-minute load average at the section boundaries
T0 = time.perf_counter()


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke version: 1 batch of 1000 tokens, 3 rounds, 32 sentences, 1 decoding round")
    ap.add_argument("--batches", type=int, default=2, help="training batches per timed round")
    ap.add_argument("--tokens", type=int, default=3000, help="real source + target tokens a training batch "
                    "(--bucketed: the trainer's max_tokens, sentences x longest, per side)")
    ap.add_argument("--bucketed", action="store_true", help="the trainer's length-sorted token-budget batches")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (models taking turns)")
    ap.add_argument("--sentences", type=int, default=200, help="decoding sources")
    ap.add_argument("--decode-repeats", type=int, default=3)
    ap.add_argument("--spread", type=float, default=4.0, help="halting weight std x sqrt(D)")
    ap.add_argument("--bisect", type=int, default=12, help="bisection iterations per forced ponder")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default). 1 by default: "
                    "with 2 threads on 2 shared cores, another process's load stalls every parallel op (5x and more "
                    "seen here), which drowns the ratios this script is for")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    ARGS = args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # before the GEMM ceiling: it is measured at the same thread count
    if args.quick:
        args.tokens, args.batches, args.repeats, args.sentences, args.decode_repeats, args.bisect = 1000, 1, 3, 32, 1, 8
    start = time.perf_counter()
    LOADS.append(os.getloadavg()[0])
    ceiling = gemm_ceiling()
    batches, length_source = train_batches(args.batches, args.tokens, args.bucketed)
    n_src = sum(b.n_src_tokens for b in batches)
    n_tgt = sum(b.n_tgt_tokens for b in batches)
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
    print(f"{len(batches)} batches: {n_src} source + {n_tgt} target real tokens ({(n_src + n_tgt) / len(batches):.0f} "
          f"a batch; padded layout {padded / len(batches):.0f}); fp32 GEMM ceiling {ceiling:.0f} GFLOP/s", flush=True)

    models = {k: build(k).train() for k in KINDS}
    targets = [("1", 1.0), ("2", 2.0), ("4", 4.0), (f"max ({MAX_STEPS})", float(MAX_STEPS))]
    settings = []
    for name, target in targets:
        bias = force_bias(models["graph"], batches, target, args.spread, args.bisect)
        settings.append((name, bias))
        set_halting(models["graph"], bias, args.spread)
        m, most = mean_ponder(models["graph"], batches)
        print(f"  [{time.perf_counter() - T0:.0f} s] ponder {name}: bias {bias:+.3f} -> mean {m:.3f}, "
              f"max steps {most}", flush=True)
    models["sdpa"].load_state_dict(models["graph"].state_dict())

    LOADS.append(os.getloadavg()[0])
    agree = {}
    for name, bias in settings:
        for m in models.values():
            set_halting(m, bias, args.spread)
        agree[name] = eval_agreement(models, batches[0])
    times, ponders = bench_train(models, batches, settings, args.repeats)

    maxname = settings[-1][0]
    useful = {name: useful_gflop(ponders[name]["graph"][2], ponders[name]["graph"][3], n_src, n_tgt)
              for name, _ in settings}
    table = ["| mean ponder (graph / padded) | max steps | halting bias | eval steps differ | "
             "graph ms | padded ms | padded / graph | graph vs own max | padded vs own max | "
             "useful GFLOP vs max | graph GFLOP/s | padded GFLOP/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, bias in settings:
        t, p = times[name], ponders[name]
        gf = useful[name] / len(batches)
        split = f" (source {p['graph'][2] / n_src:.2f}, target {p['graph'][3] / n_tgt:.2f})"
        table.append(
            f"| {name}: {p['graph'][0]:.2f} / {p['sdpa'][0]:.2f}{split} | {p['graph'][1]} / {p['sdpa'][1]} | "
            f"{bias:+.2f} | {agree[name][0]} of {agree[name][1]} | {t['graph']:.0f} | {t['sdpa']:.0f} | "
            f"{t['sdpa'] / t['graph']:.2f}x | "
            f"{t['graph'] / times[maxname]['graph']:.0%} | {t['sdpa'] / times[maxname]['sdpa']:.0%} | "
            f"{useful[name] / useful[maxname]:.0%} | {gf / t['graph'] * 1000:.0f} | {gf / t['sdpa'] * 1000:.0f} |")
    ratio2 = times["2"]["graph"] / times[maxname]["graph"]
    flat2 = times["2"]["sdpa"] / times[maxname]["sdpa"]
    verdict = (f"target (graph UT at mean ponder 2 <= {TARGET_RATIO:.0%} of its max-ponder time): "
               f"{'MET' if ratio2 <= TARGET_RATIO else 'NOT MET'}, {ratio2:.0%} "
               f"({times['2']['graph']:.0f} ms vs {times[maxname]['graph']:.0f} ms); padded UT at ponder 2: "
               f"{flat2:.0%} of its max-ponder time; ideal (useful FLOPs) {useful['2'] / useful[maxname]:.0%}")
    print("\n".join(table) + "\n" + verdict, flush=True)

    dec_table = []
    LOADS.append(os.getloadavg()[0])
    if not args.no_decode:
        sources = decode_sources(args.sentences)
        dec_table = ["| forced ponder | search | encoder steps (graph / padded) | decoder steps (graph / padded) | "
                     "tokens (graph / padded) | graph tokens/s | padded tokens/s | graph speed-up |",
                     "|---|---|---:|---:|---:|---:|---:|---:|"]
        dec_table += bench_decode(models, sources, settings, args.decode_repeats, "2")

    LOADS.append(os.getloadavg()[0])
    secs = time.perf_counter() - start
    notes = (f"{verdict}.\n\n"
             f"Training step (forward + backward, generator and loss included, no optimiser step): UT d {D}, "
             f"{H} heads, d_ff {DFF}, max_steps {MAX_STEPS}, pre-norm, dropout 0.1 (all three), train mode; "
             + (f"{len(batches)} length-sorted token-budget batches (the trainer's, max_tokens {args.tokens}) "
                if args.bucketed else f"{len(batches)} batches of pairs drawn at random (mixed lengths) ")
             + f"with lengths from {length_source}, random ids: "
             f"{(n_src + n_tgt) / len(batches):.0f} real tokens a batch (source + target), "
             f"{padded / len(batches):.0f} in the padded layout; ms per batch: per batch the median of "
             f"{args.repeats} rounds, the two models taking turns on every batch (order alternating). "
             f"Halting weights std {args.spread}/sqrt(D), bias by bisection on the "
             f"mean ponder. 'eval steps differ': positions of the first batch whose steps differ between the two "
             f"layouts in eval mode (no dropout). Useful GFLOP: matrix products of the running positions only "
             f"(x3 for backward), fp32 GEMM ceiling {ceiling:.0f} GFLOP/s measured in this run. Torch on "
             f"{torch.get_num_threads()} thread(s) (--threads)."
             + (f"\n\nDecoding: {args.sentences} random-id sources of the same length mix, untrained weights "
                f"(halting on generated tokens differs from teacher forcing, so the decoder's steps are read "
                f"from cache.steps), output limit 1.0 x source + 5, batch 64, length penalty 0, eval mode, "
                f"the two models taking turns on every batch of 64, per batch the median of {args.decode_repeats} "
                f"rounds (beam: {max(1, args.decode_repeats - 1)})."
                if dec_table else "")
             + f"\n\nLoad average (1 min) at the section boundaries: {', '.join(f'{x:.1f}' for x in LOADS)} "
             f"(2 cores: above 1, other processes shared them); run took {secs:.0f} s.")
    out = table + ([""] + dec_table if dec_table else [])
    report("Adaptive Universal Transformer: time vs forced mean ponder, graph vs padded", out, notes, args.record)


if __name__ == "__main__":
    main()
