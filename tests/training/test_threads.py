"""Training beside other work: idle OpenMP threads sleep (the wait policy `import tformer` sets before torch
loads), the cores other processes keep busy are measured, and a run whose threads outnumber the cores left says
what to do."""

import dataclasses
import os
import subprocess
import sys

import pytest

from tformer.training import threads
from tformer.training.limits import Clock
from tformer.training.loop import train

from helpers.models import tiny_config


def _with(cfg, **train):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


def openmp_spin_count(code: str, **env: str) -> int | None:
    """The spin count GNU OpenMP read when torch loaded in a fresh `python -c code` (its own report,
    OMP_DISPLAY_ENV=verbose): 0 when idle threads sleep; None when torch's OpenMP is not GNU's."""
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**environ, "OMP_DISPLAY_ENV": "verbose", **env})
    assert r.returncode == 0, r.stderr
    found = [line.split("=")[1].strip(" '") for line in r.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    return int(found[0]) if found else None


def test_import_tformer_leaves_openmps_wait_policy_to_the_environment():
    """Sleeping idle threads (OMP_WAIT_POLICY=PASSIVE) kept training's speed beside other work (issue 62), but
    made decoding on 2 threads of a quiet machine 1.6-2.6x slower (benchmarks/RESULTS.md), so tformer does not set
    it: the environment chooses, and training tells its user when spinning threads outnumber the free cores."""
    spins = openmp_spin_count("import tformer, torch")
    if spins is None:
        pytest.skip("torch's OpenMP here is not GNU OpenMP, which reports its spin count")
    assert spins > 0
    assert openmp_spin_count("import tformer, torch", OMP_WAIT_POLICY="PASSIVE") == 0  # the advice's way out


def test_cores_kept_busy_elsewhere_are_the_machines_busy_time_less_this_process(monkeypatch):
    clock = {"wall": 100.0, "machine": 50.0, "own": 5.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(threads, "_machine_busy", lambda: clock["machine"])
    monkeypatch.setattr(threads, "_own_busy", lambda: clock["own"])
    sharing = threads.Sharing()
    sharing.start()
    clock.update(wall=102.0, machine=54.0, own=6.0)  # 4 core-seconds in 2 s, 1 of them this process's
    assert sharing.others() == pytest.approx(1.5)
    monkeypatch.setattr(threads, "_machine_busy", lambda: None)  # no /proc/stat: nothing is claimed
    assert threads.Sharing().others() is None


def test_a_busy_process_beside_training_is_seen():
    """Another process burning a core for 1.5 s: either it gets its core, or the machine is busier still."""
    if threads._machine_busy() is None:
        pytest.skip("no /proc/stat here: the advice stays silent")
    sharing = threads.Sharing()
    sharing.start()
    subprocess.run([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"],
                   check=True)
    assert sharing.others() >= 0.7


@pytest.mark.parametrize("n_threads, n_cores, others, policy, warned", [
    (2, 2, 1.5, None, True), (2, 2, 0.3, None, False), (1, 2, 1.5, None, False), (2, 2, 1.5, "passive", False),
    (4, 4, 1.0, None, True), (4, 4, 0.6, "ACTIVE", True), (2, 4, 1.0, None, False), (2, 2, None, None, False)])
def test_the_thread_advice_speaks_when_threads_outnumber_the_cores_left(n_threads, n_cores, others, policy,
                                                                        warned):
    text = threads.advice(n_threads, others, n_cores, policy)
    assert bool(text) == warned
    if warned:
        assert "train.threads=1" in text and "OMP_WAIT_POLICY=PASSIVE" in text


@pytest.mark.parametrize("train_threads, warned", [(2, True), (1, False)])
def test_training_beside_busy_processes_warns_once_with_what_to_do(tmp_path, caplog, monkeypatch, train_threads,
                                                                    warned):
    monkeypatch.setattr(Clock, "UPDATES", 3)
    monkeypatch.setattr(threads.Sharing, "others", lambda self: 1.5)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with caplog.at_level("INFO", logger="tformer"):
        train(_with(tiny_config(), max_steps=10, threads=train_threads), tmp_path / "run")
    told = [r.getMessage() for r in caplog.records if "spin while they wait" in r.getMessage()]
    assert len(told) == int(warned)
