"""The headline table of benchmarks/RESULTS.md (the archive's own; the README quotes the records' since issue
66, tests/test_results_records.py): every link reaches a section of the file. Anchors follow GitHub's rule (as github-slugger computes them): lowercase,
characters other than letters, digits, spaces, '-' and '_' dropped, spaces made '-', and a repeated heading
suffixed -1, -2, ... in order of appearance."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.markdown import anchors, slug

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def headline_rows(markdown: str) -> list[str]:
    """The rows of the first table after the '## Headline figures' heading."""
    lines = markdown[markdown.index("## Headline figures"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def test_slug_follows_githubs_rule():
    assert slug("Translation quality: multi30k_en_de, test") == "translation-quality-multi30k_en_de-test"
    assert slug("Copy and sort (DGL splits 9000/1000/1000)") == "copy-and-sort-dgl-splits-900010001000"
    assert slug("Training throughput vs torch.nn.Transformer") == "training-throughput-vs-torchnntransformer"
    assert anchors("## A\n```\n## A\n```\n## A\n### A b\n") == {"a", "a-1", "a-b"}


def test_every_headline_link_reaches_a_section():
    text = RESULTS.read_text(encoding="utf-8")
    rows = headline_rows(text)
    assert len(rows) >= 6 and rows[0].startswith("| task |"), rows[:2]
    targets = re.findall(r"\]\(#([^)]+)\)", "\n".join(rows))
    assert len(targets) >= len(rows) - 2  # every figure row links at least once
    missing = sorted(set(targets) - anchors(text))
    assert not missing, f"headline links without a section in {RESULTS.name}: {missing}"

