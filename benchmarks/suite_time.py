"""Where a test suite's time goes, before and after a change: two pytest JUnit reports compared per file.

    # in a clone of each revision, the README's test command with a report of every test's time:
    .venv/bin/python -m pytest -q -n auto -p no:cacheprovider --durations=0 --junitxml=before.xml
    python benchmarks/suite_time.py before.xml after.xml [--top 25] [--record --note '...']

Wall time on this shared 2-core machine moves by minutes from run to run (the same commit has taken 7.7 and
13.2 minutes), so a change's cost is read inside one run as well as across two: the summed time of the
tests the change added, against the summed time of all tests in the same report (with `-n auto`, wall time is
about that sum over the workers, or the slowest single test where that is longer). Per file: summed test time
(setup, call and teardown, as pytest reports them) in each report, and the difference.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402


def load(path: Path) -> tuple[dict[str, float], float]:
    """({test id: seconds}, the report's wall time in seconds)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    times = {f"{tc.get('classname')}::{tc.get('name')}": float(tc.get("time", 0)) for tc in root.iter("testcase")}
    return times, float(suite.get("time", 0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="JUnit XML of the suite before the change")
    ap.add_argument("after", type=Path, help="JUnit XML of the suite after it")
    ap.add_argument("--top", type=int, default=25, help="files shown, by the size of their change")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    ap.add_argument("--note", default="", help="a line under the tables (conditions of the two runs)")
    args = ap.parse_args(argv)

    before, wall_b = load(args.before)
    after, wall_a = load(args.after)
    new = {k: v for k, v in after.items() if k not in before}
    gone = {k: v for k, v in before.items() if k not in after}
    common = [k for k in after if k in before]
    summary = [
        "| report | tests | summed test time (s) | pytest wall time (s) |",
        "|---|---:|---:|---:|",
        f"| before | {len(before)} | {sum(before.values()):.0f} | {wall_b:.0f} |",
        f"| after | {len(after)} | {sum(after.values()):.0f} | {wall_a:.0f} |",
        f"| after: the {len(new)} tests added | {len(new)} | {sum(new.values()):.1f} "
        f"({100 * sum(new.values()) / max(sum(after.values()), 1e-9):.1f}% of the run) | |",
        f"| the {len(common)} tests in both: before / after | {len(common)} | "
        f"{sum(before[k] for k in common):.0f} / {sum(after[k] for k in common):.0f} | |",
    ]
    if gone:
        summary.append(f"| before: the {len(gone)} tests removed | {len(gone)} | {sum(gone.values()):.1f} | |")

    per_b, per_a = collections.Counter(), collections.Counter()
    for k, v in before.items():
        per_b[k.split("::")[0]] += v
    for k, v in after.items():
        per_a[k.split("::")[0]] += v
    files = sorted(set(per_b) | set(per_a), key=lambda f: -abs(per_a[f] - per_b[f]))[: args.top]
    table = ["| test file | before (s) | after (s) | change (s) |", "|---|---:|---:|---:|"]
    table += [f"| {f} | {per_b[f]:.1f} | {per_a[f]:.1f} | {per_a[f] - per_b[f]:+.1f} |" for f in files]
    report("Test suite time, before and after a change, per file", summary + [""] + table, args.note, args.record)

if __name__ == "__main__":
    main()
