"""Multilingual corpora as the tests write them: the languages, and one gzip file's lines."""

import gzip
from pathlib import Path

LANGS = ("en", "de", "fr", "cs")


def _lines(folder: Path, split: str, lang: str) -> list[str]:
    with gzip.open(folder / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()
