"""Render the results pages from the records: docs/results/<topic>.md, docs/results/index.md and the headline
rows (docs/results/headline.md, and the block that README.md and the docs' landing page quote, BLOCKS).

    python -m benchmarks render [--check]

Each benchmark has one section per page, under a heading taken from benchmarks/catalogue.py by the benchmark's
name (so its anchor never moves) with a MyST target `(results-NAME)=` above it. The section shows the current
figures per CPU kind first (the latest value of each figure on that kind; quick runs apart from full ones, which
archive records count as) and the history below, newest first, each row naming the CPU, date, commit and command.
The output depends on the records alone (no clock, no machine), so rendering twice gives the same bytes.
--check renders in memory and fails when a page on disk differs (a record added without rendering).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks import records as R
from benchmarks.catalogue import BENCHMARKS, HEADLINE, anchor, label

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "results"
TOPIC_TITLES = {"quality": "Translation quality", "decoding": "Decoding speed", "training": "Training speed",
                "serving": "Serving", "reliability": "Reliability", "interop": "Interoperability"}
ARCHIVE = "../reference/figures.md"  # benchmarks/RESULTS.md as the docs site shows it
HEADLINE_CELL = 120


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def value(f: R.Figure) -> str:
    if f.value == int(f.value):
        v = f"{int(f.value):,}"
    else:  # scores and ratios as the archive writes them (20.90, 0.96x); other units as short as they go
        v = f"{f.value:,.2f}" if f.unit in ("x", "BLEU", "chrF") else f"{f.value:,g}"
    return f"{v}{f.unit}" if f.unit in ("x", "%") else f"{v} {f.unit}"


def target(f: R.Figure) -> tuple[str, str]:
    if f.target is None:
        return "", ""
    t = f.target
    v = f"{t.value:g}{f.unit}" if f.unit in ("x", "%") else f"{t.value:g} {f.unit}"
    return f"{t.op} {v}" + (f" ({t.text})" if t.text else ""), "met" if t.met else "missed"


def where(record: R.Record, base: str = ARCHIVE) -> str:
    """The record's source as a link into the archive (archive records), else its command."""
    if record.source and "(#" in record.source:
        anchor_ = record.source.split("(#", 1)[1].split(")", 1)[0]
        return f"[archive]({base}#{anchor_})"
    return ""


def check(records: list[R.Record]) -> None:
    for r in records:
        entry = BENCHMARKS.get(r.benchmark)
        if entry is None:
            raise R.RecordError(f"record of {r.benchmark!r} ({r.date}): field 'benchmark': not in "
                                f"benchmarks/catalogue.py's BENCHMARKS; add it there with its topic and title")
        if entry.topic != r.topic:
            raise R.RecordError(f"record of {r.benchmark!r} ({r.date}): field 'topic': {r.topic!r}, but "
                                f"benchmarks/catalogue.py files {r.benchmark!r} under {entry.topic!r}")


def current(records: list[R.Record]) -> list[tuple[str, str, R.Record, R.Figure]]:
    """(CPU kind, mode group, record, figure): the latest value of each figure per CPU kind, quick runs apart."""
    latest: dict[tuple[str, str, str], tuple[R.Record, R.Figure]] = {}
    order: list[tuple[str, str, str]] = []
    for r in sorted(records, key=lambda r: r.date):
        group = "quick" if r.mode == "quick" else "full"
        for f in r.figures:
            key = (r.cpu.kind, group, f.name)
            if key not in latest:
                order.append(key)
            latest[key] = (r, f)
    order.sort(key=lambda k: (k[0], k[1]))  # stable: figures keep their first order within a kind
    return [(k[0], k[1], *latest[k]) for k in order]


def section(name: str, records: list[R.Record]) -> list[str]:
    entry = BENCHMARKS[name]
    out = [f"({label(name)})=", f"## {entry.title}", "", entry.about, ""]
    out += ["Current figures, per CPU kind:", "",
            "| CPU kind | mode | figure | value | target | met | date | commit |", "|---|---|---|---:|---|---|---|---|"]
    for kind, _, r, f in current(records):
        t, met = target(f)
        out.append(f"| {cell(kind)} | {r.mode} | {cell(f.name)} | {value(f)} | {cell(t)} | {met} | {r.date} | "
                   f"{r.commit or 'not recorded'} |")
    out += ["", "History, newest first:", "", "| date | CPU | mode | commit | threads | command | figures | source |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r.date, R.file_name(r)), reverse=True):
        figs = "; ".join(f"{f.name} {value(f)}" for f in r.figures)
        cpu = r.cpu.kind if r.cpu.model in r.cpu.kind else f"{r.cpu.kind} ({r.cpu.model})"
        out.append(f"| {r.date} | {cell(cpu)} | {r.mode} | {r.commit or 'not recorded'} | "
                   f"{r.threads if r.threads is not None else 'not recorded'} | `{cell(r.command)}` | {cell(figs)} | "
                   f"{where(r)} |")
    notes = [f"- {r.date}: {r.notes}" for r in sorted(records, key=lambda r: r.date, reverse=True) if r.notes]
    return out + (["", "Notes:", "", *notes] if notes else []) + [""]


def topic_page(topic: str, records: list[R.Record]) -> str:
    names = sorted({r.benchmark for r in records if r.topic == topic})
    head = [f"# Results: {TOPIC_TITLES[topic].lower()}", "",
            f"Rendered by `python -m benchmarks render` from `benchmarks/records/{topic}/`, one JSON record per run; "
            "do not edit by hand. Archive records were transcribed from [the archive](" + ARCHIVE + ") "
            "(benchmarks/RESULTS.md), whose section each names.", ""]
    if not names:
        head += ["No records yet.", ""]
    body = [line for name in names for line in section(name, [r for r in records if r.benchmark == name])]
    return "\n".join(head + body).rstrip("\n") + "\n"


def headline(records: list[R.Record], base: str = "", compact: bool = False) -> str:
    """The README's headline rows as a Markdown table: one figure per cell, its target, met or missed, the CPU,
    the date and a link to its section. `base`: the path from where the table is shown to docs/results/ ("" on
    the results pages, "docs/results/" in the README, "results/" on the docs' landing page). `compact` (the
    landing page, where it shares the first screen): the task links to its section, and the CPU and the date
    are left to that section. Only full and archive records count: a quick run never becomes a headline
    figure."""
    rows = (["| task | figure | value | target | met |", "|---|---|---:|---|---|"] if compact else
            ["| task | figure | value | target | met | CPU | date | details |", "|---|---|---:|---|---|---|---|---|"])
    for h in HEADLINE:
        found = [(r, f) for r in records if r.benchmark == h.benchmark and r.mode != "quick"
                 for f in r.figures if f.name == h.figure]
        if not found:
            continue
        r, f = max(found, key=lambda rf: rf[0].date)
        t, met = target(f)
        if f.target is not None and f.target.text:
            t = t.split(" (", 1)[0]
        page = f"{base}{BENCHMARKS[h.benchmark].topic}.md#{anchor(h.benchmark)}"
        cells = [h.task, f.name, value(f), t, met, r.cpu.kind, r.date[:10], f"[{r.topic}]({page})"]
        for c in cells:
            if len(c) > HEADLINE_CELL:
                raise ValueError(f"headline cell over {HEADLINE_CELL} characters: {c!r}")
        if compact:
            cells = [f"[{cell(h.task)}]({page})", *map(cell, cells[1:5])]
        rows.append("| " + " | ".join(cells if compact else map(cell, cells)) + " |")
    return "\n".join(rows) + "\n"


def index_page(records: list[R.Record]) -> str:
    lines = ["# Results", "",
             "What tformer measures, by topic: each page gives, per benchmark, the current figures per CPU kind "
             "and the history below. The pages are rendered from `benchmarks/records/` by "
             "`python -m benchmarks render`; [the archive](" + ARCHIVE + ") (benchmarks/RESULTS.md) keeps "
             "every section measured before the records.", "",
             "The tracked benchmarks run as one suite: `python -m benchmarks list` names them, `python -m "
             "benchmarks run NAME --quick` (minutes; `--full` for the archive's settings) measures one and compares "
             "it with the last record of the same CPU kind, and `--record` keeps the run as a record.", "",
             "## Headline figures", "",
             "```{include} headline.md", "```", "",
             "```{toctree}", ":maxdepth: 1", "", *TOPIC_TITLES, "```", ""]
    return "\n".join(lines)


BLOCKS = {"README.md": ("docs/results/", False), "docs/index.md": ("results/", True)}  # the files quoting the
# headline rows, each with its path to docs/results/ and whether compact; the rows stand between these two lines
OPEN, CLOSE = "<!-- headline: written by `python -m benchmarks render` from benchmarks/records; do not edit by hand -->", \
    "<!-- /headline -->"


def render(records: list[R.Record]) -> dict[str, str]:
    """File name under docs/results/ -> its text."""
    check(records)
    pages = {f"{t}.md": topic_page(t, records) for t in R.TOPICS}
    pages["headline.md"] = headline(records)
    pages["index.md"] = index_page(records)
    return pages


def quoted(text: str, table: str, where: str) -> str:
    """`text` with the headline rows between its OPEN and CLOSE lines replaced by `table`."""
    start, end = text.find(OPEN + "\n"), text.find(CLOSE)
    if start < 0 or end < start:
        raise ValueError(f"{where}: no headline block ({OPEN} ... {CLOSE}) to fill")
    return text[: start + len(OPEN) + 1] + table + text[end:]


def blocks(records: list[R.Record], root: Path = ROOT) -> dict[Path, str]:
    """The files that quote the headline rows (BLOCKS), as they should read."""
    return {root / name: quoted((root / name).read_text("utf-8"), headline(records, base, compact), name)
            for name, (base, compact) in BLOCKS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks render", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, default=R.root_from_env(), help="the records' folder")
    ap.add_argument("--out", type=Path, default=PAGES, help="where the pages go")
    ap.add_argument("--check", action="store_true", help="fail when a page on disk differs from the records")
    args = ap.parse_args(argv)
    try:
        records = R.load_all(args.records)
        files = {args.out / n: text for n, text in render(records).items()}
        if args.out == PAGES:  # the real site: the README and the landing page quote the headline rows
            files.update(blocks(records))
    except (R.RecordError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = [path for path, text in files.items() if not path.exists() or path.read_text("utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path}: differs from the records; run: python -m benchmarks render", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    print(f"rendered {len(files)} files ({len(stale)} changed): the pages in {args.out}"
          + (", the headline rows in " + " and ".join(BLOCKS) if args.out == PAGES else ""))
    return 0
