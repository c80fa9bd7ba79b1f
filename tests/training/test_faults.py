"""Faults during training: kill -9 at random moments and inside every stage of a checkpoint write, Ctrl-C,
a full disk, a read-only folder, NaN/inf losses.

Oracle for the crash tests: an uninterrupted run of the same configuration (deterministic mode). After any
number of kills and resumes, the metrics of every update (loss, nll, accuracy, learning rate), of every
evaluation, and the final weights equal the uninterrupted run's bit for bit: no batch was skipped or repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tformer.checkpoint import CheckpointError, check_room, load_checkpoint
from tformer.model import build_model
from tformer.training import loop, step
from tformer.training.loop import TrainingError, build_optimizer, train

from helpers.faults import EVENTS_PER_WRITE, RUN, _final_weights, _records, _start
from helpers.models import tiny_config

pytestmark = pytest.mark.slow  # integration runs of whole commands: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[2]


def _check_latest_loads(run: Path) -> int | None:
    """The last checkpoint loads completely (weights, optimizer, RNG) whenever one exists; its step."""
    root = run / "checkpoints"
    if not root.is_dir() or not any(p.name.startswith("step_") and (p / "trainer.json").exists()
                                    for p in root.iterdir()):
        return None
    ckpt = load_checkpoint(run, "latest")
    model = build_model(ckpt.cfg.model, len(ckpt.tokenizers[0].vocab), len(ckpt.tokenizers[1].vocab))
    ckpt.load_model_state(model)
    ckpt.load_training_state(build_optimizer(model, ckpt.cfg))
    return ckpt.trainer["step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("crash") / "straight"
    p = _start(run, resume=False)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return run


def _finish_and_compare(run: Path, reference: Path) -> None:
    p = _start(run, resume=True)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert _records(run) == _records(reference)
    want, got = _final_weights(reference), _final_weights(run)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_kill_inside_every_stage_of_a_checkpoint_write_then_resume(tmp_path, reference):
    run = tmp_path / "run"
    steps = []
    for k in range(1, EVENTS_PER_WRITE + 2):  # each process dies in its own first write, at stage k (k=9: best)
        p = _start(run, resume=k > 1, kill_at=k)
        _, err = p.communicate(timeout=300)
        assert p.returncode == -signal.SIGKILL, err
        steps.append(_check_latest_loads(run))
    assert steps[0] is None  # died before its first checkpoint was complete: --resume restarts from zero
    assert any(s is not None for s in steps)
    _finish_and_compare(run, reference)


LAST_KILL = 54  # training kills aim at updates up to here, well before the run's 60 (see below)


class Stderr:
    """A child's stderr, read by a thread: every line, and the last update the run has logged."""

    def __init__(self, p: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.step, self.closed = 0, False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(p.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            update = re.search(r" step (\d+) ", line)  # '... step N  epoch E  loss L ...', once per update
            with self.cond:
                self.lines.append(line)
                if update and " loss " in line:
                    self.step = int(update.group(1))
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_for_update(self, step: int, timeout: float | None = None) -> None:
        """Until the run has logged update `step` (or its stderr closed, or `timeout` seconds passed)."""
        with self.cond:
            self.cond.wait_for(lambda: self.step >= step or self.closed, timeout)

    def text(self) -> str:
        self.thread.join(timeout=60)
        return "".join(self.lines)


def test_kill_9_and_ctrl_c_at_random_moments_then_resume(tmp_path, reference):
    """Kill the run at random moments and resume, until it completes: mostly SIGKILL during training (an
    update, an evaluation or a checkpoint write), every 5th cycle SIGKILL during start-up, every 5th SIGINT
    (Ctrl-C) during training. The moments are counted in what the run has logged, so that a fast machine
    cannot finish the run first: a training kill waits for a random update in the first half of what is
    left, then a random 0-50 ms more; a start-up kill comes a random 0.5-3 s after the start, or at the first
    update if that is sooner. Once the latest checkpoint has passed LAST_KILL the run is left to finish."""
    rng = random.Random(int(os.environ.get("TFORMER_TEST_SEED", "0")))
    run = tmp_path / "run"
    outcomes = []
    while True:
        cycle = len(outcomes)
        done = (outcomes[-1][2] or 0) if outcomes else 0  # the step of the latest checkpoint
        p = _start(run, resume=run.exists())
        stderr = Stderr(p)
        sig = signal.SIGINT if cycle % 5 == 3 else signal.SIGKILL
        if cycle % 5 == 1:  # start-up: imports, data, tokenizers, the checkpoint load
            stderr.wait_for_update(done + 1, timeout=rng.uniform(0.5, 3.0))
        elif done < LAST_KILL:
            stderr.wait_for_update(rng.randint(done + 1, done + 1 + (LAST_KILL - done) // 2), timeout=300)
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            sig = None
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)
        p.wait(timeout=300)
        err = stderr.text()
        outcomes.append((sig.name if sig else "none", p.returncode, _check_latest_loads(run)))
        if p.returncode == 0:
            break
        if p.returncode == -signal.SIGINT and outcomes[-1][2] == 60:  # Ctrl-C as the finished run exits
            continue
        assert p.returncode in (-signal.SIGKILL, 130), (outcomes, err[-3000:])  # killed, or stopped by Ctrl-C
        if sig == signal.SIGINT:  # during training: saved a checkpoint; during start-up: stopped, nothing begun
            assert ("saved" in err and "--resume" in err) or err.rstrip().endswith("tformer train: interrupted"), \
                (outcomes, err[-3000:])
        assert cycle < 40, outcomes
    assert sum(rc == -signal.SIGKILL for _, rc, _ in outcomes) >= 3, outcomes
    assert _records(run) == _records(reference), outcomes
    want, got = _final_weights(reference), _final_weights(run)
    assert all(torch.equal(want[k], got[k]) for k in want), outcomes


# ------------------------------------------------------------------------------------------ disks


# Each disk fault runs twice: on a real small (or read-only) tmpfs where the tests may mount one (root with
# CAP_SYS_ADMIN), and, everywhere, the same fault made without mounting: a file-size limit (RLIMIT_FSIZE: a write
# past it fails with EFBIG, as one on a full disk fails with ENOSPC), a folder without write permission (root
# loses CAP_DAC_OVERRIDE for the test's thread meanwhile), a filesystem that reports 1 MiB free.


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False):
    """A real small (or read-only) filesystem; skips where mounting is not allowed (not root, or a container
    without CAP_SYS_ADMIN): the variants without a mount run there."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    opts = f"size={size}" + (",ro" if read_only else "")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def unwritable(path: Path):
    """A folder this process may not write into: mode 0555, and for root (whom permission bits do not stop)
    this thread's effective capabilities without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH until the end (Linux
    capabilities are per thread; capset on the calling thread needs no privilege to drop and raise again)."""
    import ctypes

    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    try:
        if os.geteuid() != 0:
            yield path
            return

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        libc = ctypes.CDLL(None, use_errno=True)
        header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3, this thread
        if libc.capget(ctypes.byref(header), data):
            pytest.skip(f"capget: {os.strerror(ctypes.get_errno())}")
        saved = data[0].effective
        data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.capset(ctypes.byref(header), data):
            pytest.skip(f"capset: {os.strerror(ctypes.get_errno())}")
        try:
            yield path
        finally:
            data[0].effective = saved
            assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    finally:
        path.chmod(0o755)


def _small(**train_kw):
    cfg = tiny_config()
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_kw))


@pytest.mark.parametrize("disk", ["tmpfs", "reported"])
def test_a_full_disk_is_detected_before_training(tmp_path, monkeypatch, disk):
    """On a real 1 MiB tmpfs (where the tests may mount), and everywhere on a folder whose filesystem reports
    1 MiB free."""
    import shutil

    if disk == "tmpfs":
        context = tmpfs(tmp_path / "disk", "1m")
    else:
        (tmp_path / "disk").mkdir()
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=2**20))
        context = contextlib.nullcontext(tmp_path / "disk")
    with context as disk:
        with pytest.raises(CheckpointError, match=r"disk has 1\.0 MiB free, but this run needs about .* keeps up "
                                                  r"to 5 checkpoints .*lower train\.keep_last"):
            train(_small(), disk / "run")
        assert list(disk.iterdir()) == []  # nothing written


@pytest.mark.parametrize("folder", ["read-only tmpfs", "no write permission"])
def test_a_read_only_folder_is_detected_before_training(tmp_path, folder):
    if folder == "read-only tmpfs":
        context, why = tmpfs(tmp_path / "ro", "1m", read_only=True), "Read-only file system"
    else:
        context, why = unwritable(tmp_path / "ro"), "Permission denied"
    with context as ro:
        with pytest.raises(CheckpointError, match=rf"cannot write into .*ro \({why}\).*--run-dir"):
            train(_small(), ro / "run")
        assert list(ro.iterdir()) == []  # nothing written


def test_a_run_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="file is a file, not a folder"):
        train(_small(), tmp_path / "file" / "run")


def test_room_check_counts_every_kept_checkpoint(tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    n = 1_000_000  # 12 MB per checkpoint
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=16 * 2**20 + 5 * 12 * n - 1))
    with pytest.raises(CheckpointError, match="keeps up to 5 checkpoints of 11.4 MiB"):
        check_room(tmp_path / "run", n, keep_last=3)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=16 * 2**20 + 5 * 12 * n))
    check_room(tmp_path / "run", n, keep_last=3)  # exactly enough


def _hashes(folder: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _first_checkpoint_kept(run: Path, hashes: dict[str, str]) -> None:
    """After a write failed past step 3's checkpoint: that checkpoint byte for byte as it was written, `latest`
    naming it, and nothing else in the folder (no temporary folder, no half-written step)."""
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000003"]
    assert (root / "latest").read_text().strip() == "step_0000003"
    assert _hashes(root / "step_0000003") == hashes
    assert load_checkpoint(run, "latest").trainer["step"] == 3


def test_the_disk_filling_up_mid_run_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """A real ENOSPC after the first checkpoint: a clear error, the first checkpoint intact and `latest` still
    naming it, no temporary folder left; after space is freed, resume finishes the run."""
    with tmpfs(tmp_path / "disk", "24m") as disk:
        real = loop.save_checkpoint
        calls, hashes = [], {}

        def then_fill(*a, **k):
            path = real(*a, **k)
            calls.append(path)
            if len(calls) == 1:  # fill the disk right after the first checkpoint
                hashes.update(_hashes(path))
                with open(disk / "filler", "wb", buffering=0) as f:
                    for chunk in (1 << 20, 4096, 1):  # to the last byte
                        with contextlib.suppress(OSError):
                            while True:
                                f.write(b"\0" * chunk)
            return path

        monkeypatch.setattr(loop, "save_checkpoint", then_fill)
        cfg = _small(epochs=2, max_steps=6, save_every=3, log_every=1)  # no epoch-end evaluation: seconds, not tens
        with pytest.raises(ValueError, match=r"could not write .*No space left on device.*intact.*resume=True"):
            train(cfg, disk / "run")  # the checkpoint, or a metrics line before it, whichever needs space first
        _first_checkpoint_kept(disk / "run", hashes)
        (disk / "filler").unlink()
        monkeypatch.setattr(loop, "save_checkpoint", real)
        assert train(cfg, disk / "run", resume=True).step == 6


# The command line in a child that, once its first checkpoint is written, records the SHA-256 of its files in
# $TFORMER_TEST_HASHES and from then on may write no file past half that checkpoint's model.safetensors
# (RLIMIT_FSIZE): the next checkpoint's first file fails half-way, as on a disk that filled up meanwhile.
FILL_AFTER_FIRST_CHECKPOINT = r"""
import hashlib, json, os, resource, signal, sys
from tformer.training import loop
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
real, calls = loop.save_checkpoint, []
def save_checkpoint(*a, **k):
    path = real(*a, **k)
    calls.append(path)
    if len(calls) == 1:
        with open(os.environ["TFORMER_TEST_HASHES"], "w") as f:
            json.dump({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}, f)
        limit = (path / "model.safetensors").stat().st_size // 2
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return path
loop.save_checkpoint = save_checkpoint
from tformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_failing_mid_checkpoint_keeps_the_last_checkpoint(tmp_path):
    """Without a mount, anywhere: the step 6 checkpoint's weights file fails half-way (EFBIG from a file-size
    limit set after step 3's checkpoint). One line names the checkpoint, the reason and --resume; step 3's
    checkpoint is byte for byte as written and `latest` names it; nothing half-written stays; resumed without
    the limit, the run completes."""
    from tformer.cli import main

    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), *RUN, "train.max_steps=9"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFORMER_TEST_HASHES": str(tmp_path / "hashes.json")}
    r = subprocess.run([sys.executable, "-c", FILL_AFTER_FIRST_CHECKPOINT, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    message = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"tformer train: error: could not write checkpoint \S+/step_0000006 \(.*File too large.*\); "
                        r"the previous one, \S+/step_0000003, is intact: .*--resume", message), message
    _first_checkpoint_kept(run, json.loads((tmp_path / "hashes.json").read_text()))
    assert main([*args, "--resume"]) == 0
    assert load_checkpoint(run, "latest").trainer["step"] == 9


# ------------------------------------------------------------------------------------------ NaN / inf


def _poison(monkeypatch, bad_calls: set[int]):
    """train_step_loss returning a NaN loss on the given calls (1-based), as a corrupt batch or an overflow
    would; the parameters before and after each update are recorded."""
    real, n = step.train_step_loss, [0]

    def poisoned(*args, **kwargs):
        n[0] += 1
        out = real(*args, **kwargs)
        if n[0] in bad_calls:
            return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(step, "train_step_loss", poisoned)
    seen = []
    real_update = loop.take_update

    def update(model, optimizer, *a, **k):
        before = [p.detach().clone() for p in model.parameters()]
        ok = real_update(model, optimizer, *a, **k)
        seen.append((ok, before, [p.detach().clone() for p in model.parameters()],
                     float(optimizer.state[next(iter(model.parameters()))].get("step", 0))))
        return ok

    monkeypatch.setattr(loop, "take_update", update)
    return seen


def test_a_nan_update_is_skipped_with_a_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    seen = _poison(monkeypatch, {3})
    with caplog.at_level("WARNING", logger="tformer"):
        result = train(_small(max_steps=6, log_every=1), tmp_path / "run")
    assert result.step == 6
    assert [ok for ok, *_ in seen] == [True, True, False, True, True, True]
    ok, before, after, adam_step = seen[2]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # weights untouched by the skipped update
    assert adam_step == 2 and seen[3][3] == 3  # nor Adam's step count
    assert "step 3: the loss or the gradients are NaN/inf; update skipped" in caplog.text
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in records if "loss" in r)  # no NaN logged
    assert next(r for r in records if r["kind"] == "train" and r["step"] == 4)["skipped"] == 1
    assert load_checkpoint(tmp_path / "run", "latest").trainer["skipped_updates"] == 1


def test_k_nan_updates_in_a_row_stop_with_a_message_and_a_finite_checkpoint(tmp_path, monkeypatch):
    _poison(monkeypatch, {4, 5, 6})
    with pytest.raises(TrainingError, match=r"stopped at step 6: the loss or the gradients were NaN/inf in 3 "
                                            r"updates in a row \(steps 4-6\).*saved .*step_0000006.*train\.lr"):
        train(_small(max_steps=20, max_bad_updates=3), tmp_path / "run")
    ckpt = load_checkpoint(tmp_path / "run", "latest")
    assert ckpt.trainer["step"] == 6 and ckpt.trainer["bad_updates"] == 3
    weights = load_file(str(ckpt.path / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_weights_that_went_non_finite_are_not_saved_over_the_last_checkpoint(tmp_path):
    """A real blow-up: resumed with a learning rate beyond float32 (and no clipping), one update drives the
    weights to inf/NaN; the next checkpoint refuses to save them and `latest` still names the finite one."""
    cfg = _small(max_steps=2, save_every=1)
    train(cfg, tmp_path / "run")
    blown = _small(max_steps=6, save_every=1, clip_norm=0.0, schedule="constant", lr=1e39)
    with pytest.raises(TrainingError, match=r"stopped at step 3: the weights are no longer finite.*nothing was "
                                            r"saved.*Lower train\.lr"):
        train(blown, tmp_path / "run", resume=True)
    ckpt = load_checkpoint(tmp_path / "run", "latest")
    assert ckpt.trainer["step"] == 2
    weights = load_file(str(ckpt.path / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
