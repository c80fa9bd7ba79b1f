"""Shared by the benchmark scripts: machine description, timing, and appending to RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
SHARED_DATA = Path(os.environ.get("TFORMER_SHARED_DATA", HERE.parent.parent / "shared" / "data"))


def gemm_ceiling(n: int = 1024, reps: int = 10, dtype: torch.dtype = torch.float32) -> float:
    """Measured GFLOP/s of torch.mm on n x n matrices in `dtype` (best of `reps`): the machine's matrix ceiling
    now, in that format."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        tic = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - tic)
    return 2 * n ** 3 / best / 1e9


def read_bandwidth(threads: int, gib: float = 1.0, reps: int = 7) -> float:
    """Measured GB/s at which `threads` threads read memory: a float32 tensor of `gib` GiB (far beyond any
    cache) summed, best of `reps`. What a step that streams its weights once (a decoding step of one sentence)
    can reach at most; the thread count is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(int(gib * (1 << 30)) // 4)
        x.sum()
        best = float("inf")
        for _ in range(reps):
            tic = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - tic)
        return x.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(before)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}, {platform.system()}")


def append_results(title: str, table: str, notes: str = "") -> None:
    """Append a section with the command, machine and date to benchmarks/RESULTS.md."""
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"\n## {title}\n\n- command: `{command}`\n- machine: {machine()}\n- date: {when}\n\n{table}\n"
            + (f"\n{notes}\n" if notes else ""))
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(text)
    print(f"appended to {RESULTS}")


def report(title: str, table: list[str], notes: str, record: bool) -> None:
    """Print a benchmark's table and notes; with `record`, append them to benchmarks/RESULTS.md."""
    print("\n".join(table))
    print(notes)
    if record:
        append_results(title, "\n".join(table), notes)
