"""torchrun with 2 CPU processes (gloo): the same parameters as one process with the same global batch, exact
resume, one writer, and errors that stop every process instead of hanging."""

import dataclasses
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tformer.config import save_config
from tformer.training.loop import train

from helpers.models import tiny_config

pytestmark = pytest.mark.slow  # integration runs of whole commands: `pytest -m "not slow"` skips them


def _cfg(**train):
    cfg = tiny_config()
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device="cpu", threads=1, **train))


def _torchrun(config, run_dir, *extra, nproc=2, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "tformer", "train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hang: kill torchrun and its workers, then fail
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s (a hang?)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:07d}" / "model.safetensors"))


def _assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=k)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, precision):
    # Adam's epsilon is raised here: the key projection's bias gets a gradient that is zero in exact
    # arithmetic (softmax ignores a constant per query), and Adam turns its float noise, which depends on the
    # order of the sums, into full-size steps of either sign. Under bf16 autocast each process runs its batch's
    # forward in bf16 as the single process runs each of its micro-batches: only the sums' order differs
    two = _cfg(max_steps=3, epochs=5, adam_eps=1e-4, precision=precision)
    save_config(two, tmp_path / "two.yaml")
    proc = _torchrun(tmp_path / "two.yaml", tmp_path / "ddp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    train(_cfg(max_steps=3, epochs=5, adam_eps=1e-4, accum_steps=2, precision=precision),
          tmp_path / "single")  # same 2 batches per update
    _assert_same(_weights(tmp_path / "ddp", 3), _weights(tmp_path / "single", 3))
    # one writer: one metrics log with one record per step and evaluation, the logged loss of the whole update
    ddp = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    single = (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()
    assert len(ddp) == len(single)
    import json

    a, b = json.loads(ddp[0]), json.loads(single[0])
    assert a["step"] == b["step"] == 1 and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert proc.stdout.count("run folder:") == 1  # rank 0 reports


def test_resume_under_torchrun_continues_exactly_and_needs_the_same_process_count(tmp_path):
    whole = _cfg(max_steps=4, epochs=5, eval_every=2)
    save_config(whole, tmp_path / "whole.yaml")
    assert _torchrun(tmp_path / "whole.yaml", tmp_path / "a").returncode == 0
    half = _cfg(max_steps=2, epochs=5, eval_every=2)
    save_config(half, tmp_path / "half.yaml")
    assert _torchrun(tmp_path / "half.yaml", tmp_path / "b").returncode == 0
    proc = _torchrun(tmp_path / "whole.yaml", tmp_path / "b", "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same(_weights(tmp_path / "a", 4), _weights(tmp_path / "b", 4), atol=0)
    single = subprocess.run([sys.executable, "-m", "tformer", "train", "--run-dir", str(tmp_path / "b"), "--resume",
                             "train.max_steps=6"], capture_output=True, text=True, timeout=120)
    assert single.returncode == 2 and "written by 2 training process(es), this run has 1" in single.stderr


def test_a_data_error_on_rank_0_stops_every_process(tmp_path):
    cfg = _cfg(max_steps=2)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, task="text", dir=str(tmp_path / "missing")))
    save_config(cfg, tmp_path / "bad.yaml")
    proc = _torchrun(tmp_path / "bad.yaml", tmp_path / "run", timeout=120)
    assert proc.returncode != 0
    assert "rank 0 could not read the data" in proc.stderr  # rank 1 says why it stopped
    assert not (tmp_path / "run").exists()


def test_non_finite_updates_stop_every_process_together(tmp_path):
    """A real blow-up under torchrun: resumed with a learning rate beyond float32, one update sends the weights
    to inf on both processes; the next updates' loss is NaN on both (the summed statistics agree), they are
    skipped, and after train.max_bad_updates both processes stop with the message: no hang, nothing saved over
    the last finite checkpoint."""
    cfg = _cfg(max_steps=2, epochs=5, save_every=1)
    save_config(cfg, tmp_path / "c.yaml")
    assert _torchrun(tmp_path / "c.yaml", tmp_path / "run").returncode == 0
    proc = _torchrun(tmp_path / "c.yaml", tmp_path / "run", "--resume", "train.max_steps=20", "train.save_every=0",
                     "train.eval_every=100", "train.lr=1e39", "train.schedule=constant", "train.clip_norm=0",
                     "train.max_bad_updates=2")
    assert proc.returncode != 0
    assert "NaN/inf in 2 updates in a row (steps 4-5)" in proc.stderr
    assert "no longer finite, so nothing was saved" in proc.stderr
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_0000002"
