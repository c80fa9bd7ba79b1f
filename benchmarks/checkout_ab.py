"""Decoding speed of two checkouts of tformer (before and after a change), in one run, taking turns: each
(checkout, precision) decodes the same sentences in a fresh process of its own, round after round, the order
rotating by round (the machine is shared and noisy).

    python benchmarks/checkout_ab.py --before PATH --checkpoint RUN [--precisions fp32 int8 bf16]
                                     [--batch-size 32] [--beams 1 4] [--sentences 128] [--max-len 24] [--rounds 3]
                                     [--shortlist FILE]

A precision the other checkout does not know (bf16 before issue 45) is run by this one alone. Each process
loads the model (untimed), decodes one batch to warm up, then times `translate_ids` over the sentences at
every beam; the table gives the median over rounds and the ratio after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gzip, json, sys, time, torch
import tformer
from tformer.config import DecodeConfig
from tformer.inference import translate_ids
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
kw = {"int8": {"quantize": "int8"}, "bf16": {"precision": "bf16"}, "fp32": {}}[spec["precision"]]
t = tformer.load(spec["checkpoint"], device="cpu", **kw)
with gzip.open(spec["data"], "rt", encoding="utf-8") as f:
    ids = [t.encode(line.strip()) for line in f][: spec["sentences"]]
out = {}
for beam in spec["beams"]:
    cfg = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0, max_len_a=0.0,
                       max_len_b=spec["max_len"], batch_size=spec["batch_size"],
                       **({"shortlist": spec["shortlist"]} if spec["shortlist"] else {}))
    translate_ids(t.model, ids[: spec["batch_size"]], cfg)
    tic = time.perf_counter()
    translate_ids(t.model, ids, cfg)
    out[beam] = time.perf_counter() - tic
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the other checkout (e.g. a git worktree of the old commit)")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--before-checkpoint", help="the checkpoint the other checkout reads (default --checkpoint)")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int8", "bf16"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shortlist", default="", help="decode with this lexical shortlist (both checkouts)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    runs = [("after", ROOT, args.checkpoint, p) for p in args.precisions]
    runs += [("before", Path(args.before), args.before_checkpoint or args.checkpoint, p) for p in args.precisions
             if p != "bf16" or (Path(args.before) / "tformer" / "precision.py").exists()]
    times: dict[tuple[str, str, int], list[float]] = {}
    for r in range(args.rounds):
        for which, repo, checkpoint, precision in runs[r % len(runs):] + runs[: r % len(runs)]:
            spec = dict(checkpoint=checkpoint, precision=precision, beams=args.beams, batch_size=args.batch_size,
                        sentences=args.sentences, max_len=args.max_len, threads=args.threads,
                        shortlist=args.shortlist,
                        data=str(SHARED_DATA / "multi30k" / "test2016.en.gz"))
            # each checkout keeps its own cache (the matrix libraries' saved choices: their form may differ)
            cache = Path(tempfile.gettempdir()) / f"checkout_ab-cache-{which}"
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=repo, capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(repo), "TFORMER_CACHE": str(cache)})
            if done.returncode:
                sys.exit(f"{which} {precision} failed:\n{done.stderr[-2000:]}")
            for beam, secs in json.loads(done.stdout.strip().splitlines()[-1]).items():
                times.setdefault((which, precision, int(beam)), []).append(secs)
    table = ["| precision | decoding | before: sentences/s | after: sentences/s | after / before | rounds (s, after) |",
             "|---|---|---:|---:|---:|---|"]
    for precision in args.precisions:
        for beam in args.beams:
            after = statistics.median(times[("after", precision, beam)])
            before = times.get(("before", precision, beam))
            b = statistics.median(before) if before else None
            table.append(f"| {precision} | {'greedy' if beam == 1 else f'beam {beam}'} | "
                         f"{f'{args.sentences / b:.1f}' if b else 'n/a'} | {args.sentences / after:.1f} | "
                         f"{f'{b / after:.2f}x' if b else 'n/a'} | "
                         f"{' / '.join(f'{x:.2f}' for x in times[('after', precision, beam)])} |")
    shortlist = f", shortlist {args.shortlist}" if args.shortlist else ""
    notes = (f"Checkpoint {args.checkpoint}; before: the checkout {args.before}; {args.sentences} Multi30k test2016 "
             f"sentences, batch {args.batch_size}, outputs up to {args.max_len} tokens, length penalty 0, "
             f"{args.threads} threads{shortlist}; each (checkout, precision) in a fresh process per round, "
             f"{args.rounds} rounds taking turns; n/a: the other checkout has no such precision.")
    report("Decoding before and after a change, two checkouts taking turns", table, notes, args.record)


if __name__ == "__main__":
    main()
