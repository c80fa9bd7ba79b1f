"""`tformer serve` throughput under N concurrent clients, several servers side by side taking turns: another
checkout (before a change), this one, and this one with other flags (--precision bf16, --int8).

    python benchmarks/studies/serve_variants.py --checkpoint RUN [--before PATH] [--flags='--precision bf16' --flags=--int8]
                                        [--clients 16] [--requests 120] [--rounds 3] [--beam 4] [--record]

Every server runs at once (each its own process, started the same way as benchmarks/serve_load.py does), and
each round sends the same requests (1-8 Multi30k test2016 sentences, seeded) to each server in turn, the
order rotating by round (the machine is shared and noisy). Reports the median sentences/s over the rounds,
its ratio to this checkout's plain server, request latency p50 / p99, the server's RSS at its peak, and how
many answers differ in text from this checkout's fp32 server (bf16 and int8 may differ slightly).
"""

from __future__ import annotations

import argparse
import gzip
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402
from explorer_load import pct  # noqa: E402
from serve_load import ROOT, answers, post, requests, run_clients, start_server, stop_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--before", help="another checkout of tformer, served beside this one (e.g. a git worktree)")
    ap.add_argument("--before-checkpoint", help="the checkpoint that checkout serves (default --checkpoint; an "
                    "older checkout refuses config keys added since)")
    ap.add_argument("--flags", action="append", default=[], help="a server of this checkout with these flags; "
                    "repeat for several; write it with '=' (--flags='--precision bf16')")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    bodies = requests(sentences, args.requests, args.beam, args.seed)
    n_sentences = sum(len(b["src"]) for b in bodies)
    ckpt = args.checkpoint
    variants = ([(f"before ({args.before})", Path(args.before), [], args.before_checkpoint or ckpt)] if args.before
                else []) + [("this checkout", ROOT, [], ckpt)] + \
        [(f"this checkout, {f}", ROOT, shlex.split(f), ckpt) for f in args.flags]
    servers = {}
    try:
        for name, repo, flags, checkpoint in variants:
            servers[name] = start_server(checkpoint, *flags, repo=repo)
            post(servers[name][1], bodies[0])  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in servers}
        latency: dict[str, list[float]] = {name: [] for name in servers}
        peak: dict[str, float] = {name: 0.0 for name in servers}
        texts: dict[str, list] = {}
        names = list(servers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                proc, url = servers[name]
                out = run_clients(url, bodies, args.clients, proc.pid)
                rates[name].append(n_sentences / out["wall"])
                latency[name] += [s for _, _, s in out["results"]]
                peak[name] = max(peak[name], out["peak"])
                texts[name] = [[t for t, _ in answers(got)] if status == 200 else None
                               for status, got, _ in out["results"]]
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    base = statistics.median(rates["this checkout"])
    reference = texts["this checkout"]
    table = ["| server | sentences/s (median) | rounds | vs this checkout | latency p50 / p99 (s) | failed | "
             "answers differing from fp32 | RSS peak (MiB) |", "|---|---:|---|---:|---|---:|---:|---:|"]
    for name in names:
        rate = statistics.median(rates[name])
        failed = sum(t is None for t in texts[name])
        differ = sum(a != b for a, b in zip(texts[name], reference) if a is not None and b is not None)
        table.append(f"| {name} | {rate:.1f} | {' / '.join(f'{x:.1f}' for x in rates[name])} | {rate / base:.2f}x | "
                     f"{pct(latency[name], .5):.3f} / {pct(latency[name], .99):.3f} | {failed} | "
                     f"{differ}/{len(bodies)} | {peak[name]:.0f} |")
    notes = (f"Checkpoint {args.checkpoint}, beam {args.beam}, {args.clients} concurrent clients, {len(bodies)} "
             f"requests of 1-8 Multi30k test2016 sentences ({n_sentences} sentences, seed {args.seed}) per round, "
             f"{args.rounds} rounds, the servers taking turns (all running at once, default batching flags).")
    report("tformer serve: servers side by side, taking turns", table, notes, args.record)


if __name__ == "__main__":
    main()
