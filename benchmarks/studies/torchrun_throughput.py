"""Training throughput under torchrun on this machine: 1 process with all threads against N processes with
threads split between them (gloo), the same recipe and the same global batch.

    python benchmarks/studies/torchrun_throughput.py [--nproc 2] [--steps 40] [--record]

Trains the multi30k_en_de recipe on ../shared/data/multi30k for --steps updates in each set-up, in turn,
and reads source+target tokens/s from the run's metrics.jsonl (update time only; the first log window,
which holds the warm-up, is left out). The single process accumulates N batches per update so both see
the same batches per update.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, append_results  # noqa: E402


def tok_per_s(run: Path) -> float:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["tok_per_s"] for r in records if r["kind"] == "train"][1:]
    return statistics.median(train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="tformer-torchrun-"))
    common = ["--config", "multi30k_en_de", "--no-progress",
              f"data.dir={SHARED_DATA / 'multi30k'}", f"train.max_steps={args.steps}", "train.log_every=5",
              "train.attention_examples=0", "train.device=cpu"]
    env = dict(os.environ)
    runs = {
        f"1 process, {cores} threads, {args.nproc} batches accumulated": (
            [sys.executable, "-m", "tformer", "train", *common, f"train.threads={cores}",
             f"train.accum_steps={args.nproc}"]),
        f"torchrun {args.nproc} processes x {max(1, cores // args.nproc)} threads": (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
             "-m", "tformer", "train", *common, f"train.threads={max(1, cores // args.nproc)}"]),
    }
    rows = []
    for name, cmd in runs.items():
        run = work / name.split(",")[0].replace(" ", "-")
        proc = subprocess.run([*cmd, "--run-dir", str(run)], capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        rows.append((name, tok_per_s(run)))
        print(f"{name}: {rows[-1][1]:,.0f} tokens/s", flush=True)
    base = rows[0][1]
    table = ["| set-up | source+target tokens/s | vs 1 process |", "|---|---:|---:|"]
    table += [f"| {name} | {v:,.0f} | {v / base:.2f}x |" for name, v in rows]
    notes = (f"the multi30k_en_de recipe, {args.steps} updates each, {cores} cores, torch {torch.__version__}; "
             "the eval at the end is not counted. Both see the same batches per update (the torchrun run's "
             "parameters equal the single process's: tests/training/test_distributed.py).")
    print("\n".join(table) + "\n" + notes)
    if args.record:
        append_results(f"torchrun: {args.nproc} processes on this machine", "\n".join(table), notes)


if __name__ == "__main__":
    main()
