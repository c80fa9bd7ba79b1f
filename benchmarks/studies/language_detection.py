"""Language detection as `tformer serve` does it (tformer.data.clean.ranking: py3langid's bundled model, offline,
restricted to the languages asked), on Multi30k test2016: each line of each language file detected among the
languages given, the share detected right per language. Issue 65's target: >= 98% over English, German, French and
Czech.

    python benchmarks/studies/language_detection.py [--languages en de fr cs] [--record]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402

from tformer.data.clean import ranking  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--languages", nargs="+", default=["en", "de", "fr", "cs"])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    rank = ranking(args.languages)
    table = ["| language | lines | detected right | share | taken for |", "|---|---:|---:|---:|---|"]
    right_all = total = 0
    tic = time.perf_counter()
    for code in args.languages:
        with gzip.open(SHARED_DATA / "multi30k" / f"test2016.{code}.gz", "rt", encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        found = [rank(line)[0][0] for line in lines]
        right = sum(x == code for x in found)
        wrong = {x: found.count(x) for x in sorted(set(found) - {code})}
        table.append(f"| {code} | {len(lines)} | {right} | {100 * right / len(lines):.1f}% | "
                     f"{', '.join(f'{x} {n}' for x, n in wrong.items()) or '-'} |")
        right_all, total = right_all + right, total + len(lines)
    seconds = time.perf_counter() - tic
    table.append(f"| all | {total} | {right_all} | {100 * right_all / total:.1f}% | |")
    notes = f"each line detected among {', '.join(args.languages)}; {1e6 * seconds / total:.0f} us per line"
    report("Language detection on Multi30k test2016 (source auto)", table, notes, args.record)


if __name__ == "__main__":
    main()
