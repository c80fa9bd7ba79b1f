"""The README's test command on fresh clones, again and again, under varied conditions: is the suite green on
every fresh machine, and how long does it take?

    python benchmarks/fresh_runs.py [--conditions plain seed=1 load=1,seed=2 order=1,load=1 load=2,seed=3]
                                    [--rev HEAD] [--record]

Each condition gets a new clone of this repository at --rev, beside this checkout (so that the tests find
../shared/data as CI does), and runs the README's setup and test command in it (`.ci/run` reads the same),
with:
    seed=N     PYTHONHASHSEED=N, and hypothesis drawing its examples afresh (HYPOTHESIS_PROFILE=random,
               --hypothesis-seed=N) instead of the derandomized `ci` profile
    load=K     K processes each burning one core for the whole run (this machine has 2)
    order=N    the tests in a random order (pytest-randomly, --randomly-seed=N), installed in that clone only
'plain' is the command exactly as CI runs it. Reported per condition: the pytest summary (passed, failed,
errors, skipped), pytest's own wall time and the whole command's (setup included), and the failing tests.
The clones are removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / ".ci" / "run"


def parse(condition: str) -> dict[str, int]:
    out = {}
    for part in condition.split(","):
        if part == "plain":
            continue
        key, _, value = part.partition("=")
        if key not in ("seed", "load", "order") or not value.isdigit():
            sys.exit(f"unknown condition {part!r}: give plain, seed=N, load=K or order=N, joined by commas")
        out[key] = int(value)
    return out


def setup_and_test_command() -> tuple[str, str]:
    """The README's setup (everything before pytest) and test (pytest ...) parts of .ci/run's last line."""
    line = [ln for ln in RUN.read_text(encoding="utf-8").splitlines() if "pytest" in ln][-1]
    setup, _, test = line.rpartition(" && ")
    return setup, test


def one(condition: str, rev: str, index: int, keep: bool) -> dict:
    opts = parse(condition)
    clone = ROOT.parent / f"fresh-run-{index}"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
    setup, test = setup_and_test_command()
    env = {**os.environ, "CI": "true"}
    tic = time.perf_counter()
    subprocess.run(["bash", "-c", setup], cwd=clone, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if "seed" in opts:
        env.update(PYTHONHASHSEED=str(opts["seed"]), HYPOTHESIS_PROFILE="random")
        test += f" --hypothesis-seed={opts['seed']}"
    if "order" in opts:
        subprocess.run([str(clone / ".venv/bin/pip"), "install", "-q", "pytest-randomly"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        test += f" -p randomly --randomly-seed={opts['order']}"
    else:
        test += " -p no:randomly"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(opts.get("load", 0))]
    try:
        started = time.perf_counter()
        proc = subprocess.run(["bash", "-c", test + " -p no:cacheprovider"], cwd=clone, env=env, capture_output=True,
                              text=True)
        pytest_seconds = time.perf_counter() - started
    finally:
        for b in burners:
            b.kill()
            b.wait()
    total = time.perf_counter() - tic
    (ROOT.parent / f"fresh-run-{index}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    summary = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    if not keep:
        shutil.rmtree(clone, ignore_errors=True)
    return {"condition": condition, "rc": proc.returncode, "summary": summary[-1].strip("= ") if summary else "?",
            "pytest": pytest_seconds, "total": total, "failing": failing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conditions", nargs="+", default=["plain", "seed=1", "load=1,seed=2", "order=1,load=1",
                                                          "load=2,seed=3"])
    ap.add_argument("--rev", default="HEAD", help="the commit to clone (default: this checkout's HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the clones (fresh-run-N beside this checkout)")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    table = ["| condition | pytest summary | pytest wall | with setup | exit | failing tests |",
             "|---|---|---:|---:|---:|---|"]
    results = []
    for i, condition in enumerate(args.conditions, 1):
        r = one(condition, rev, i, args.keep)
        results.append(r)
        table.append(f"| {r['condition']} | {r['summary']} | {r['pytest'] / 60:.1f} min | {r['total'] / 60:.1f} min | "
                     f"{r['rc']} | {', '.join(r['failing']) or 'none'} |")
        print(table[-1], flush=True)
    failed = sum(r["rc"] != 0 for r in results)
    notes = (f"Commit {rev}; {len(results)} fresh clones, each set up by the README's command (a new .venv, "
             f"pip installs from the registry's cache); {failed} of {len(results)} runs failed. Conditions: "
             "seed=N sets PYTHONHASHSEED=N and draws hypothesis examples afresh (profile `random`, "
             "--hypothesis-seed=N); load=K burns K of the 2 cores for the whole run; order=N shuffles the tests "
             "(pytest-randomly, --randomly-seed=N). Logs: fresh-run-N.log beside the checkout.")
    report(f"Fresh-clone test runs ({rev})", table, notes, args.record)


if __name__ == "__main__":
    main()
