"""The tracked benchmarks, as one suite: `python -m benchmarks run NAME [--quick|--full] [--record]`.

Each runs its existing script (benchmarks/NAME.py, unchanged and still runnable alone) in a quick mode (minutes, a
smaller sample of the same measurement) or a full mode (the archive's settings), reads the figures from the table
the script prints, makes one record (benchmarks/records.py), prints the figures and what moved beyond noise since
the last record of the same benchmark, mode and CPU kind, and with --record saves it under benchmarks/records/.
Then `python -m benchmarks render` updates docs/results/.

decode, serve and the quick quality run share one small model, `multi30k_quick` trained once into
runs/bench/m30q (about 2-3 minutes on one thread; kept, so later runs reuse it).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks import records as R

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
DATA = Path(os.environ.get("TFORMER_SHARED_DATA", ROOT.parent / "shared" / "data"))
QUICK_MODEL = ROOT / "runs" / "bench" / "m30q"


def tables(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table in `text`, as {header: cell} (bold marks removed)."""
    out, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            out.append(dict(zip(header, cells)))
    return out


def number(cell: str) -> float:
    m = re.search(r"-?[\d,]*\.?\d+", cell)
    if not m:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(m.group(0).replace(",", ""))


def quick_model() -> Path:
    """`multi30k_quick` trained once into runs/bench/m30q (reused when its best checkpoint is there)."""
    if not (QUICK_MODEL / "checkpoint").exists() and not any(QUICK_MODEL.glob("**/*.safetensors")):
        QUICK_MODEL.parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(Path(PY).with_name("tformer")), "train", "--config", "multi30k_quick", "--run-dir",
               str(QUICK_MODEL), f"data.dir={DATA / 'multi30k'}", "train.threads=1"]
        print("training the shared quick model:", shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    return QUICK_MODEL


# ---------------------------------------------------------------------------------------------------- figures

def train_figures(out: str) -> list[R.Figure]:
    ratio = next(r for r in tables(out) if r.get("model") == "ratio tformer / reference")
    rounds = [number(v) for k, v in ratio.items() if k.startswith("round") and v]
    median = statistics.median(rounds)
    return [R.Figure("tokens/s vs torch.nn.Transformer, small, fp32", median, "x", True,
                     peer="torch.nn.Transformer, same size and batches",
                     spread=round((max(rounds) - min(rounds)) / median, 4))]


def decode_figures(out: str) -> list[R.Figure]:
    figures = []
    for row in tables(out):
        if row.get("engine") in ("tformer", "tformer-int8") and row.get("vs ct2 of its precision"):
            prec = "int8" if row["engine"] == "tformer-int8" else "fp32"
            batch = row.get("batch", "64")
            figures.append(R.Figure(f"{row['decoding']} {prec} vs CTranslate2 {prec}, batch {batch}",
                                    number(row["vs ct2 of its precision"]), "x", True, peer=f"CTranslate2 {prec}"))
    return figures


def serve_figures(out: str) -> list[R.Figure]:
    row = next(r for r in tables(out) if r.get("clients") == "16")
    return [R.Figure("throughput vs one by one, 16 clients", number(row["vs one by one"]), "x", True,
                     peer="the same server, one request at a time", target=R.Target(">=", 3.0,
                                                                                    number(row["vs one by one"]) >= 3)),
            R.Figure("failed requests, 16 clients", number(row["failed"]), "requests", False)]


def quality_figures(out: str) -> list[R.Figure]:
    figures = []
    for row in tables(out):
        if "sacreBLEU" in row and row.get("decoding"):
            figures.append(R.Figure(f"sacreBLEU test2016, {row['decoding']}", number(row["sacreBLEU"]), "BLEU", True))
    return figures


def suite_figures(out: str) -> list[R.Figure]:
    m = re.search(r"(\d+) passed", out)
    wall = re.search(r"^WALL ([\d.]+)$", out, re.M)
    failed = re.search(r"(\d+) failed", out)
    return [R.Figure("pytest wall time", round(float(wall.group(1)) / 60, 2), "min", False),
            R.Figure("tests passed", float(m.group(1) if m else 0), "tests", True),
            R.Figure("tests failed", float(failed.group(1) if failed else 0), "tests", False)]


# ------------------------------------------------------------------------------------------------ the suite

QUICK_TESTS = ["tests/test_masks.py", "tests/test_results_table.py", "tests/test_results_records.py"]


@dataclass(frozen=True)
class Tracked:
    topic: str
    script: str
    quick: Callable[[], list[str]]   # the command (argv) of a quick run
    full: Callable[[], list[str]]
    figures: Callable[[str], list[R.Figure]]
    threads: int = 2


def _pytest(paths: list[str]) -> list[str]:
    code = ("import subprocess, sys, time; t = time.perf_counter(); "
            "r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *sys.argv[1:]]); "
            "print(f'WALL {time.perf_counter() - t:.1f}'); sys.exit(r.returncode)")
    return [PY, "-c", code, *paths]


TRACKED: dict[str, Tracked] = {
    "decode": Tracked(
        "decoding", "decoding_peers.py",
        lambda: [PY, "benchmarks/decoding_peers.py", "--checkpoint", str(quick_model()), "--sentences", "256",
                 "--rounds", "1", "--batch-size", "64", "--beams", "1", "5", "--engines", "tformer", "tformer-int8",
                 "ct2-fp32", "ct2-int8"],
        lambda: [PY, "benchmarks/decoding_peers.py", "--checkpoint", "runs/multi30k_en_de", "--rounds", "3",
                 "--batch-size", "64", "--beams", "1", "5", "--engines", "tformer", "tformer-int8", "ct2-fp32",
                 "ct2-int8"],
        decode_figures),
    "train": Tracked(
        "training", "train_throughput.py",
        lambda: [PY, "benchmarks/train_throughput.py", "--size", "small", "--steps", "4", "--rounds", "3"],
        lambda: [PY, "benchmarks/train_throughput.py", "--size", "small"],
        train_figures),
    "serve": Tracked(
        "serving", "serve_load.py",
        lambda: [PY, "benchmarks/serve_load.py", "--checkpoint", str(quick_model()), "--clients", "16",
                 "--requests", "48", "--beam", "1"],
        lambda: [PY, "benchmarks/serve_load.py", "--checkpoint", "runs/multi30k_en_de", "--beam", "1"],
        serve_figures),
    "quality": Tracked(
        "quality", "translation.py",
        lambda: [PY, "benchmarks/translation.py", "quality", str(quick_model()), "--split", "test",
                 "--beams", "1", "--threads", "2"],
        lambda: [PY, "benchmarks/translation.py", "quality", "runs/multi30k_en_de", "--split", "test",
                 "--beams", "1", "5"],
        quality_figures),
    "suite": Tracked("reliability", "suite_time.py", lambda: _pytest(QUICK_TESTS),
                     lambda: _pytest(["-n", "auto"]), suite_figures),
}


def run(name: str, mode: str, record: bool, records_root: Path) -> int:
    t = TRACKED[name]
    tic = time.perf_counter()
    argv = t.quick() if mode == "quick" else t.full()
    shown = shlex.join([Path(a).name if a == PY else a for a in argv]).replace(str(ROOT) + "/", "")
    print(f"running {name} ({mode}): {shown}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-4000:])
    if proc.returncode != 0 and name != "suite":
        sys.stderr.write(proc.stderr[-4000:])
        print(f"error: {name} failed (exit {proc.returncode}); nothing recorded", file=sys.stderr)
        return 1
    figures = t.figures(proc.stdout)
    new = R.new_record(name if name != "suite" else "suite", t.topic, mode,
                       f"python -m benchmarks run {name} --{mode}  # {shown}", figures, t.threads)
    print(f"\n{name} ({mode}) on {new.cpu.kind}, {time.perf_counter() - tic:.0f} s:")
    for f in figures:
        print(f"  {f.name}: {f.value:g} {f.unit}")
    print(R.describe(R.compare(new, R.load_all(records_root))))
    if record:
        print(f"recorded: {R.save(new, records_root)}  (then: python -m benchmarks render)")
    return 0 if proc.returncode == 0 else 1


def main(argv: list[str]) -> int:
    if argv[0] == "list":
        for name, t in TRACKED.items():
            print(f"{name:8s} {t.topic:12s} benchmarks/{t.script}")
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks run")
    ap.add_argument("name", choices=sorted(TRACKED))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="minutes (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="the archive's settings")
    ap.add_argument("--record", action="store_true", help="save the record under benchmarks/records/")
    args = ap.parse_args(argv[1:])
    return run(args.name, args.mode or "quick", args.record, R.root_from_env())
