"""How long the documentation site takes to build, each executed page's time, and the README's length.

    python benchmarks/docs_build.py [--threads 1] [--before REV] [--record]

Builds the site with the README's command (`python -m sphinx -W --keep-going -b html docs OUT`) into a fresh
folder, every notebook page executed (the multi30k_quick model trained by the first page that needs it), on
`--threads` threads (1: as one pytest-xdist worker of the test command runs it). Prints the wall time of the
whole build, each executed page's time (myst-nb's execution record), and the README's line count now and at
`--before` (a git revision).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def readme_lines(rev: str | None) -> int:
    if rev is None:
        return len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    text = subprocess.run(["git", "show", f"{rev}:README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return len(text.stdout.splitlines())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--before", default="aae58c0", help="the revision whose README to compare with")
    p.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "html"
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
               "TFORMER_DOCS_WORK": str(Path(tmp) / "work")}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
                       cwd=ROOT, env=env, check=True)
        total = time.perf_counter() - start
        pages = json.loads((out / "_tformer" / "execution.json").read_text(encoding="utf-8"))
        files = sum(1 for _ in out.rglob("*.html"))
    executed = sum(r["seconds"] for r in pages.values())
    table = ["| what | seconds |", "|---|---:|", f"| the whole build ({files} HTML pages) | {total:.0f} |",
             f"| executing notebook pages, all together | {executed:.0f} |",
             f"| everything else (reading, autodoc, writing) | {total - executed:.0f} |"]
    table += [f"| `{name}` | {row['seconds']:.1f} |" for name, row in sorted(pages.items())]
    before, now = readme_lines(args.before), readme_lines(None)
    notes = (f"{args.threads} thread(s) (`OMP_NUM_THREADS`), nothing else running. The first executed page trains "
             f"the `multi30k_quick` model that later pages load. README: {before} lines at {args.before}, {now} "
             f"now (target <= 250). Budget: the docs part of CI <= 600 s.")
    report("Documentation build: wall time, each executed page, README length", table, notes, args.record)


if __name__ == "__main__":
    main()
