"""The Python of the repository's Markdown pages, as the README and the guides show it."""

from __future__ import annotations

import re

from helpers import ROOT

def python_blocks(page: str, section: str | None = None) -> list[str]:
    """The ```python blocks of a Markdown file of the repository (of one `## section` of it, if named)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if section is not None:
        start = text.index(f"\n## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", text, re.S)
