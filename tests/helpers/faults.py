"""Training runs as subprocesses that can be killed inside a checkpoint write, and what they leave: the
metrics of every update, the final weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers import ROOT
from tformer.checkpoint import load_checkpoint

RUN = ["--config", "copy", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
       "model.encoder_layers=1", "model.decoder_layers=1", "model.dropout=0.1", "data.symbols=6",
       "data.length_mean=5", "data.max_len=8", "data.train_size=200", "data.valid_size=20", "data.test_size=20",
       "train.max_tokens=128", "train.epochs=100", "train.max_steps=60", "train.log_every=1", "train.save_every=3",
       "train.eval_every=20", "train.keep_last=2", "train.threads=1", "train.deterministic=true",
       "train.target_exact_match=0", "train.max_hours=0", "--no-progress"]  # no wall-clock stop: equal runs
# A child that runs the command line, killing itself with SIGKILL at the K-th checkpoint-writing event of
# its life: before the call, or, for safetensors files, after writing half of the file.
KILLER = r"""
import os, signal, sys
from tformer import checkpoint as ck
K, n = int(os.environ["TFORMER_TEST_KILL_AT"]), [0]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def event():
    n[0] += 1
    return n[0] == K
def wrap(name):
    real = getattr(ck, name)
    def f(*a, **k):
        if event():
            if name == "save_file":  # half a file on disk, then death
                real(*a, **k)
                path = a[1]
                with open(path, "r+b") as fh:
                    fh.truncate(os.path.getsize(path) // 2)
            die()
        return real(*a, **k)
    setattr(ck, name, f)
for name in ("save_file", "save_config", "save_tokenizers", "_fsync_write", "_replace_text", "_prune"):
    wrap(name)
real_rename = ck.os.rename
class Os:
    def __getattr__(self, a):
        return getattr(os, a)
    @staticmethod
    def rename(*a):
        if event():
            die()
        return real_rename(*a)
ck.os = Os()
from tformer.cli import main
sys.exit(main(sys.argv[1:]))
"""
EVENTS_PER_WRITE = 8  # save_file x2, save_config, save_tokenizers, _fsync_write, rename, _replace_text, _prune


def _start(run: Path, resume: bool, kill_at: int | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    args = ["train", "--run-dir", str(run), *RUN, *extra, *(["--resume"] if resume else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kill_at is None:
        cmd = [sys.executable, "-m", "tformer", *args]
    else:
        cmd = [sys.executable, "-c", KILLER, *args]
        env["TFORMER_TEST_KILL_AT"] = str(kill_at)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        for k in ("elapsed", "tok_per_s", "eval_seconds"):  # wall-clock figures differ run to run
            r.pop(k, None)
        out.append(r)
    return out


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(load_checkpoint(run, "latest").path / "model.safetensors"))
