"""Training on a CPU that other work shares. torch's OpenMP threads (as many as the cores unless train.threads
says otherwise) spin while they wait for work, ~300,000 rounds of a busy loop, before they sleep. When another
process holds a core, a spinning thread burns the time slice that the thread it waits for needs, and every
parallel operation waits for a descheduled thread. The copy recipe on 2 cores (benchmarks/RESULTS.md, issue 62):
~76k tokens/s alone, ~17k beside two busy processes, ~3k beside the mixed work of other developers. With OpenMP's
passive wait policy the waiting threads sleep instead: ~70k alone (8% less), ~35-44k beside two busy processes
(half the machine: the fair share), ~29k beside that mixed work. But on a quiet machine sleeping threads made
decoding on 2 threads 1.6-2.6x slower (each small product waits for its threads to wake), so tformer does not
set the policy: the environment chooses (`sleep_while_waiting` sets it for a process that wants it, before torch
loads, as OpenMP reads it once then), and training warns when other work leaves fewer cores than it has spinning
threads, naming OMP_WAIT_POLICY=PASSIVE and train.threads=1. The policy changes no number a run computes;
the thread count would (1 thread instead of 2 moves the weights by ~1e-4 within 5 updates).

`Sharing` measures, over a stretch of training, how many cores the rest of the machine kept busy (Linux: the
machine's busy time in /proc/stat less this process's own), and `advice` says what to do when spinning threads
outnumber the cores left (torch loaded before tformer, or OMP_WAIT_POLICY=ACTIVE). Nothing here changes the
thread count: the numbers a run computes stay a function of its settings, not of the machine's load.
"""

from __future__ import annotations

import os
import sys
import time

LEFT_BUSY = 0.5  # cores the rest of the machine must keep busy before the advice speaks


def sleep_while_waiting() -> bool:
    """OpenMP threads waiting for work sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE), unless the environment
    set a policy; only before torch loads, when OpenMP reads it. Returns whether the passive policy is in effect
    as far as this process can tell."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


def _machine_busy() -> float | None:
    """Seconds the machine's cores have been busy since boot (Linux), else None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _own_busy() -> float:
    t = os.times()
    return t.user + t.system


class Sharing:
    """Cores the rest of the machine kept busy between `start` and `others`."""

    def __init__(self) -> None:
        self.begin: tuple[float, float, float] | None = None

    def start(self) -> None:
        machine = _machine_busy()
        self.begin = None if machine is None else (time.monotonic(), machine, _own_busy())

    def others(self) -> float | None:
        """The mean number of cores other processes kept busy since `start` (None where unknown)."""
        machine = _machine_busy()
        if self.begin is None or machine is None:
            return None
        wall0, machine0, own0 = self.begin
        wall = time.monotonic() - wall0
        if wall <= 0:
            return None
        return max(0.0, (machine - machine0) - (_own_busy() - own0)) / wall


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def advice(threads: int, others: float | None, n_cores: int, wait_policy: str | None) -> str:
    """What to do when other processes keep so many of the `n_cores` cores busy (`others`, from Sharing) that
    torch's `threads` outnumber the cores left ('' when they do not, or when waiting threads sleep anyway:
    `wait_policy`, the OMP_WAIT_POLICY the process started with)."""
    if others is None or threads < 2 or others < LEFT_BUSY or (wait_policy or "").upper() == "PASSIVE":
        return ""
    free = n_cores - others
    if threads <= free:
        return ""
    return (f"other processes kept {others:.1f} of this machine's {n_cores} cores busy while these updates ran: "
            f"torch's {threads} threads spin while they wait for each other, and wait whenever one is descheduled "
            "(4-25x slower here; benchmarks/RESULTS.md, issue 62). OMP_WAIT_POLICY=PASSIVE in the environment of "
            "the command avoids it (import tformer before torch sets it), as does train.threads=1 (slower alone, "
            "and the numbers change a little)")
