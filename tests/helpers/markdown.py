"""The repository's Markdown pages as the tests read them: their Python blocks, as the README and the guides
show them, and the anchors GitHub gives their headings."""

from __future__ import annotations

import re
from collections import Counter

from helpers import ROOT


def python_blocks(page: str, section: str | None = None) -> list[str]:
    """The ```python blocks of a Markdown file of the repository (of one `## section` of it, if named)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if section is not None:
        start = text.index(f"\n## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", text, re.S)


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found
