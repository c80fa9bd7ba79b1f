"""Kill/resume cycles: how many crashes a training run survives with results identical to an uninterrupted
run (the long version of tests/training/test_faults.py).

    python benchmarks/crash_cycles.py [--runs 3] [--steps 200] [--seed 0] [--record]

For each run: start training (a small copy-task model, deterministic mode, a checkpoint every 3 updates and
an evaluation every 25), wait until it is under way, kill it after a random 0-0.4 s with SIGKILL (every 6th
cycle during start-up instead, every 5th with Ctrl-C), check that the latest checkpoint loads completely,
resume, and repeat until the run completes. Then compare its per-update metrics, evaluations and final
weights with an uninterrupted run of the same configuration: they must be equal bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

from tformer.checkpoint import NoCheckpointError, load_checkpoint  # noqa: E402
from tformer.model import build_model  # noqa: E402
from tformer.training.loop import build_optimizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_args(steps: int) -> list[str]:
    return ["--config", "copy", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
            "model.encoder_layers=1", "model.decoder_layers=1", "model.dropout=0.1", "data.symbols=6",
            "data.length_mean=5", "data.max_len=8", "data.train_size=200", "data.valid_size=20",
            "data.test_size=20", "train.max_tokens=128", "train.epochs=1000", f"train.max_steps={steps}",
            "train.log_every=1", "train.save_every=3", "train.eval_every=25", "train.keep_last=2",
            "train.threads=1", "train.deterministic=true", "train.target_exact_match=0", "--no-progress"]


def start(run: Path, steps: int, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tformer", "train", "--run-dir", str(run), *run_args(steps),
           *(["--resume"] if resume else [])]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def records(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        for k in ("elapsed", "tok_per_s", "eval_seconds"):
            r.pop(k, None)
        out.append(r)
    return out


def latest_loads(run: Path) -> int | None:
    try:
        ckpt = load_checkpoint(run, "latest")
    except NoCheckpointError:
        return None
    model = build_model(ckpt.cfg.model, len(ckpt.tokenizers[0].vocab), len(ckpt.tokenizers[1].vocab))
    ckpt.load_model_state(model)
    ckpt.load_training_state(build_optimizer(model, ckpt.cfg))
    return ckpt.trainer["step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="tformer-crash-"))
    ref = work / "reference"
    p = start(ref, args.steps, resume=False)
    _, err = p.communicate()
    if p.returncode:
        sys.exit(err)
    want_records = records(ref)
    want_weights = load_file(str(load_checkpoint(ref, "latest").path / "model.safetensors"))
    rows, total = [], {"kill": 0, "startup": 0, "sigint": 0, "loads": 0, "identical": 0}
    for r in range(args.runs):
        run = work / f"run{r}"
        counts = {"kill": 0, "startup": 0, "sigint": 0, "loads": 0, "completed-after-signal": 0}
        tic = time.perf_counter()
        cycle = 0
        while True:
            p = start(run, args.steps, resume=run.exists())
            if cycle % 6 == 5:
                kind, sig = "startup", signal.SIGKILL
                time.sleep(rng.uniform(0.3, 3.0))
            else:
                kind, sig = ("sigint", signal.SIGINT) if cycle % 5 == 4 else ("kill", signal.SIGKILL)
                for line in p.stderr:
                    if " step " in line and " loss " in line:
                        break
                time.sleep(rng.uniform(0.0, 0.4))
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)
            _, err = p.communicate()
            cycle += 1
            step = latest_loads(run)  # raises if the latest checkpoint does not load
            if p.returncode == 0 or (p.returncode == -signal.SIGINT and step == args.steps):
                counts["completed-after-signal"] += 1
                if p.returncode == 0:
                    break
                continue
            if p.returncode not in (-signal.SIGKILL, 130):
                sys.exit(f"unexpected exit {p.returncode}:\n{err[-3000:]}")
            counts[kind] += 1
            counts["loads"] += step is not None
        got_weights = load_file(str(load_checkpoint(run, "latest").path / "model.safetensors"))
        identical = records(run) == want_records and all(torch.equal(want_weights[k], got_weights[k])
                                                         for k in want_weights)
        rows.append((r, counts, identical, time.perf_counter() - tic))
        for k in ("kill", "startup", "sigint", "loads"):
            total[k] += counts[k]
        total["identical"] += identical
        print(f"run {r}: {counts}, identical={identical}", flush=True)
    table = ["| run | SIGKILL in training | SIGKILL in start-up | Ctrl-C | latest checkpoint loaded after a kill | "
             "finished despite the signal | result identical to uninterrupted | wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r, c, identical, wall in rows:
        table.append(f"| {r} | {c['kill']} | {c['startup']} | {c['sigint']} | {c['loads']} | "
                     f"{c['completed-after-signal']} | {'yes' if identical else '**NO**'} | {wall:.0f} |")
    table.append(f"| **all** | **{total['kill']}** | **{total['startup']}** | **{total['sigint']}** | "
                 f"**{total['loads']}** | | **{total['identical']}/{len(rows)}** | |")
    notes = (f"{args.steps} updates per run (copy task, d=32, dropout 0.1, train.deterministic=true, a checkpoint "
             "every 3 updates, an evaluation every 25), compared with one uninterrupted run: metrics of every "
             "update and evaluation, and the final weights, bit for bit. 'latest checkpoint loaded' counts kills "
             "after which a checkpoint existed (weights, optimizer and random state loaded); before the first "
             "one, --resume restarts the run from step 0.")
    report("Kill/resume cycles (crash safety)", table, notes, args.record)
    sys.exit(0 if total["identical"] == len(rows) else 1)


if __name__ == "__main__":
    main()
