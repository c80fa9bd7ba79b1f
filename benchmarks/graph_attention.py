"""Graph attention (packed, no padding) against padded dense attention, in one run: ratios, not absolutes.

    python benchmarks/graph_attention.py [--sections kernels train window] [--rounds 2] [--flex] [--record]

kernels  one attention call, forward + backward, attention dropout 0.1, on Multi30k token-budget batches
         (3000 tokens, SentencePiece BPE 6000 trained on the training split: the real length mix). Backends:
         padded dense (tformer's reference), padded SDPA, and the graph kernel's three executions (segments,
         blocks, edges) plus PyTorch Geometric's edge softmax + scatter (how TransformerConv does it), when
         torch_geometric is installed. H = 4, Dh = 64. The graph's plan is built in the warm-up call and reused,
         as layers 2 and 3 of a forward reuse layer 1's (the training step below pays for it once per forward).
train    a whole training step (forward, loss, backward) of the Multi30k recipe's model (d 256, 3+3 layers,
         pre-norm, dropout 0.1) with model.attention dense / sdpa / graph, on the same real-mix batches and
         on equal-length batches (176 sentences x 17 tokens per side, no padding to skip). Time: the kernels
         take turns on every batch; ratios are medians of per-batch ratios. Peak memory: each (kernel, batch set) in its own process, the rise of the
         resident set's high-water mark during one step.
window   local-window attention (+-32, one sentence, H = 4, Dh = 64), forward + backward, against dense attention
         with the equivalent mask, at lengths 256 .. 4096: time and peak memory (own process each, after a
         call at length 64 that takes the one-time allocations).
         --flex adds torch.compile(flex_attention) forward-only times (no CPU backward in torch 2.13).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, append_results  # noqa: E402

from tformer.attention.graph import graph_attention  # noqa: E402
from tformer.attention.kernels import dense_attention, sdpa_attention  # noqa: E402
from tformer.config import load_config  # noqa: E402
from tformer.data import Vocab, collate, load_task, model_lengths, token_budget_batches  # noqa: E402
from tformer.dropout import dropout  # noqa: E402
from tformer.masks import bipartite_graph, padding_mask, self_graph  # noqa: E402
from tformer.model import build_model  # noqa: E402
from tformer.recipes import find_recipe  # noqa: E402
from tformer.structures import FULL, Structure  # noqa: E402
from tformer.training.loop import train_step_loss  # noqa: E402

H, DH, WINDOW = 4, 64, 32


def multi30k_config():
    return load_config(find_recipe("multi30k_en_de"), [f"data.dir={SHARED_DATA / 'multi30k'}"])


def real_batches(n: int = 8):
    cfg = multi30k_config()
    data = load_task(cfg.data, splits=("train",), joint=True)
    examples = data.examples["train"]
    src, tgt = model_lengths(examples)
    every = token_budget_batches(src, tgt, 3000, seed=1)
    order = every[:: len(every) // n][:n]  # spread over the epoch: a representative padding share
    return cfg, len(data.src_vocab), [collate([examples[i] for i in b], b, Vocab.pad, Vocab.bos, Vocab.eos) for b in order]


def equal_batches(n: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ex = [(torch.randint(4, vocab, (16,), generator=g).tolist(), torch.randint(4, vocab, (16,), generator=g).tolist())
              for _ in range(176)]
        out.append(collate(ex, list(range(176)), Vocab.pad, Vocab.bos, Vocab.eos))
    return out


def timed(fn, repeats: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def peak_rss_delta(fn) -> float:
    """MiB the resident set's high-water mark rises while fn runs (Linux: /proc/self/clear_refs resets it)."""
    def read(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
        return 0
    Path("/proc/self/clear_refs").write_text("5")
    before = read("VmRSS:")
    fn()
    return (read("VmHWM:") - before) / 1024


# --------------------------------------------------------------------------- one attention call


def pyg_attention(q, k, v, graph, dropout_p):
    from torch_geometric.utils import scatter, softmax

    qn, kn, vn = (x.transpose(1, 2).reshape(-1, H, DH) for x in (q, k, v))
    s = (qn[graph.query] * kn[graph.key]).sum(-1) / DH ** 0.5  # (E, H)
    a = dropout(softmax(s, graph.query, num_nodes=qn.shape[0]), dropout_p)
    return scatter(a[..., None] * vn[graph.key], graph.query, dim=0, dim_size=qn.shape[0], reduce="sum")


def attention_cases(batch):
    """(name, padded inputs maker, padded mask, packed graph) for encoder, decoder and cross attention."""
    sl, tl = batch.src_lengths, batch.tgt_lengths
    S, T = int(sl.max()), int(tl.max())
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return [("encoder self", sl, sl, padding_mask(sl, S)[:, None, None, :], self_graph(sl, FULL, False)),
            ("decoder self", tl, tl, (padding_mask(tl, T)[:, None, None, :] & causal), self_graph(tl, FULL, True)),
            ("cross", tl, sl, padding_mask(sl, S)[:, None, None, :], bipartite_graph(tl, sl))]


def bench_kernels(batches, rounds: int) -> str:
    backends = ["dense", "sdpa", "segments", "blocks", "edges"]
    try:
        import torch_geometric  # noqa: F401

        backends.append("pyg")
    except ImportError:
        pass
    rows = []
    for case in range(3):
        totals = {b: [] for b in backends}
        for _ in range(rounds):
            acc = dict.fromkeys(backends, 0.0)
            for batch in batches:
                name, lq, lk, mask, graph = attention_cases(batch)[case]
                B, T, S, Nq, Nk = lq.numel(), int(lq.max()), int(lk.max()), int(lq.sum()), int(lk.sum())
                padded = [torch.randn(B, L, H, DH).requires_grad_() for L in (T, S, S)]
                packed = [torch.randn(1, N, H, DH).requires_grad_() for N in (Nq, Nk, Nk)]
                for b in backends:
                    xs = padded if b in ("dense", "sdpa") else packed
                    q, k, v = (x.transpose(1, 2) for x in xs)  # (B, H, L, Dh), as MultiHeadAttention passes them

                    def run():
                        if b == "dense":
                            out = dense_attention(q, k, v, mask=mask, dropout_p=0.1)[0]
                        elif b == "sdpa":
                            out = sdpa_attention(q, k, v, mask=mask, dropout_p=0.1)[0]
                        elif b == "pyg":
                            out = pyg_attention(q, k, v, graph, 0.1)
                        else:
                            out = graph_attention(q, k, v, mask=graph, dropout_p=0.1, method=b)[0]
                        out.sum().backward()
                    run()  # warm
                    acc[b] += timed(run, 2)
            for b in backends:
                totals[b].append(acc[b] / len(batches) * 1000)
        med = {b: statistics.median(v) for b, v in totals.items()}
        rows.append((name, med))
    head = "| attention | " + " | ".join(backends) + " |\n|---|" + "---:|" * len(backends)
    lines = [head]
    for name, med in rows:
        cells = [f"{med[b]:.1f} ms ({med[b] / med['dense']:.2f}x)" for b in backends]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- training step


def model_for(kind: str, cfg, vocab: int):
    torch.manual_seed(0)
    return build_model(dataclasses.replace(cfg.model, attention=kind), vocab, vocab).train()


def step(model, batch):
    loss = train_step_loss(model, batch, 0.1).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def bench_train(rounds: int) -> str:
    cfg, vocab, real = real_batches()
    sets = {"Multi30k real mix": real, "equal lengths (176 x 17)": equal_batches(len(real), vocab)}
    kinds = ["dense", "sdpa", "graph"]
    models = {k: model_for(k, cfg, vocab) for k in kinds}
    lines = ["| batches | kernel | tokens/s (src+tgt, real) | step time vs dense | vs sdpa | padding skipped | "
             "peak memory of a step | vs dense |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for set_name, batches in sets.items():
        tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
        padded = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
        for k in kinds:
            step(models[k], batches[0])  # warm
        # the kernels take turns on every batch (the order rotating), so the machine's drifts hit them alike;
        # ratios are medians over (batch, round) of the step time against dense / sdpa on the same batch
        times = {k: [] for k in kinds}
        for r in range(rounds):
            for i, b in enumerate(batches):
                turn = kinds[(i + r) % len(kinds):] + kinds[:(i + r) % len(kinds)]
                for k in turn:
                    times[k].append(timed(lambda: step(models[k], b)))
        mem = {k: memory_of("train", k, set_name) for k in kinds}
        for k in kinds:
            total = sum(times[k]) / rounds
            vs = {ref: statistics.median(a / b for a, b in zip(times[k], times[ref])) for ref in ("dense", "sdpa")}
            lines.append(f"| {set_name} | {k} | {tokens / total:,.0f} | {vs['dense']:.2f}x | {vs['sdpa']:.2f}x | "
                         f"{(1 - tokens / padded) * 100 if k == 'graph' else 0:.1f}% | "
                         f"{mem[k]:.0f} MiB | {mem[k] / mem['dense']:.2f}x |")
    return "\n".join(lines)


def memory_of(section: str, *args) -> float:
    out = subprocess.run([sys.executable, __file__, "--_memory", section, *map(str, args)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["mib"]


def child_memory(section: str, args: list[str]) -> None:
    if section == "train":
        kind, set_name = args
        cfg, vocab, real = real_batches(2)
        batch = real[1] if set_name.startswith("Multi30k") else equal_batches(1, vocab)[0]
        model = model_for(kind, cfg, vocab)
        mib = peak_rss_delta(lambda: step(model, batch))
    else:
        kind, length = args[0], int(args[1])
        window_case(kind, 64)()  # one-time allocations (thread pools, caches) happen here, not in the figure
        run = window_case(kind, length)
        mib = peak_rss_delta(run)
    print(json.dumps({"mib": mib}))


# --------------------------------------------------------------------------- local window


def window_case(kind: str, length: int, backward: bool = True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, length, H, DH, generator=g).requires_grad_(backward).transpose(1, 2) for _ in range(3))
    structure = Structure(window=WINDOW)
    if kind == "graph":
        graph = self_graph(torch.tensor([length]), structure, causal=False)

        def attend():
            graph.plans.clear()
            return graph_attention(q, k, v, mask=graph)[0]
    elif kind == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block = create_block_mask(lambda b, h, i, j: (i - j).abs() <= WINDOW, 1, 1, length, length, device="cpu")
        compiled = torch.compile(flex_attention)

        def attend():
            return compiled(q, k, v, block_mask=block)
    else:
        mask = structure.mask(length)[None, None]
        kernel = dense_attention if kind == "dense" else sdpa_attention

        def attend():
            return kernel(q, k, v, mask=mask)[0]

    def run():
        out = attend()
        if backward:
            out.sum().backward()
    return run


def bench_window(rounds: int, flex: bool) -> str:
    kinds = ["dense", "sdpa", "graph"]
    lines = ["| length | " + " | ".join(f"{k} time" for k in kinds) + " | graph / dense time | "
             + " | ".join(f"{k} peak" for k in kinds) + " | graph / dense memory |" + (" flex fwd | graph fwd |" if flex else ""),
             "|---:|" + "---:|" * (2 * len(kinds) + 2) + ("---:|---:|" if flex else "")]
    for length in (256, 512, 1024, 2048, 4096):
        med = {}
        for k in kinds:
            run = window_case(k, length)
            run()
            med[k] = statistics.median(timed(run) for _ in range(rounds + 1)) * 1000
        mem = {k: memory_of("window", k, length) for k in kinds}
        line = (f"| {length} | " + " | ".join(f"{med[k]:.1f} ms" for k in kinds) + f" | {med['graph'] / med['dense']:.2f}x | "
                + " | ".join(f"{mem[k]:.1f} MiB" for k in kinds) + f" | {mem['graph'] / max(mem['dense'], 1e-9):.2f}x |")
        if flex:
            with torch.no_grad():
                f_run, g_run = window_case("flex", length, backward=False), window_case("graph", length, backward=False)
                f_run()
                g_run()
                line += f" {timed(f_run, 5) * 1000:.1f} ms | {timed(g_run, 5) * 1000:.1f} ms |"
        lines.append(line)
        print(line, flush=True)
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_memory":
        child_memory(sys.argv[2], sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", default=["kernels", "train", "window"],
                   choices=("kernels", "train", "window"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--flex", action="store_true", help="window: add compiled flex_attention forward times")
    p.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the tables to benchmarks/RESULTS.md (--append: the old spelling)")
    args = p.parse_args()
    tables = []
    if "kernels" in args.sections:
        _, _, batches = real_batches(6)
        t = bench_kernels(batches, args.rounds)
        print(t, flush=True)
        tables.append("One attention call, forward + backward, mean over 6 Multi30k batches (median of rounds):\n\n" + t)
    if "train" in args.sections:
        t = bench_train(args.rounds)
        print(t, flush=True)
        tables.append("Whole training step (forward, loss, backward), 8 batches per round:\n\n" + t)
    if "window" in args.sections:
        t = bench_window(args.rounds, args.flex)
        print(t, flush=True)
        tables.append(f"Local window +-{WINDOW} vs dense attention, one sentence, forward + backward:\n\n" + t)
    if args.record:
        append_results("Graph attention: packed graph vs padded dense", "\n\n".join(tables))


if __name__ == "__main__":
    main()
