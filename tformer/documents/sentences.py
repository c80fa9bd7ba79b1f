"""Split paragraph text into sentences, as character spans, so each sentence can be translated on its own.

`split_sentences(text, lang)` returns `(start, end)` spans: in order, non-overlapping, each stripped of the
whitespace around it, together covering every non-whitespace character of `text` exactly once. The caller
translates `text[start:end]` for each span and rebuilds the paragraph with the original whitespace between
them. A line break always ends a sentence.

The splitter is Wikimedia's sentencex (rules and abbreviation lists for ~300 languages; the only candidate
with a release since 2022), chosen by benchmarks/sentence_split.py on paragraphs of joined WMT newstest,
Multi30k and Tatoeba lines: boundary F1 0.979 on German news (pysbd 0.976, Moses prefixes 0.966), within 0.004
of the best of four alternatives on en and fr, at 280x pysbd's speed or more (benchmarks/RESULTS.md,
"Sentence splitting"). Its known slips: English "me." read as an abbreviation, French "M." (Monsieur) ending a sentence,
no break before a sentence that starts with a digit.
"""

from __future__ import annotations

import re
from itertools import pairwise

from tformer.errors import DataError

# Every character str.splitlines() breaks at: a line break ends a sentence whatever the splitter says.
_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")
# Quotes after a space at the end of a sentence open the next one (sentencex leaves them behind: `Maas. "|I`).
_OPENING = "\"'“„«‘‚"


def align(text: str, sentences: list[str], start: int = 0, end: int | None = None) -> list[int]:
    """Where each of `sentences` (a splitter's output for `text[start:end]`, in order) begins in `text`.

    A splitter may normalise whitespace, so a sentence is matched first as is, then by its non-whitespace
    characters with any whitespace between; one that cannot be found is skipped (it stays part of the sentence
    before it). Returns the start offsets found, increasing.
    """
    end = len(text) if end is None else end
    starts, cursor = [], start
    for sentence in sentences:
        piece = sentence.strip()
        if not piece:
            continue
        pos = cursor
        while pos < end and text[pos].isspace():
            pos += 1
        if text.startswith(piece, pos, end):
            stop = pos + len(piece)
        else:
            loose = re.compile(r"\s*".join(re.escape(c) for c in piece if not c.isspace()))
            found = loose.match(text, pos, end) or loose.search(text, pos, end)
            if found is None:
                continue
            pos, stop = found.span()
        starts.append(pos)
        cursor = stop
    return starts


def spans_at(text: str, cuts: list[int]) -> list[tuple[int, int]]:
    """Cut `text` at the offsets `cuts` and at every line break; the pieces, stripped, empty ones dropped."""
    bounds = sorted({0, len(text), *(c for c in cuts if 0 < c < len(text))})
    spans = []
    for lo, hi in pairwise(bounds):
        for line in _LINE.finditer(text, lo, hi):
            s, e = line.span()
            while s < e and text[s].isspace():
                s += 1
            while e > s and text[e - 1].isspace():
                e -= 1
            if s < e:
                spans.append((s, e))
    return spans


def _before_opening_quotes(text: str, cut: int, lo: int) -> int:
    """`cut` moved back before quotes that follow a space and end the text before it (`Maas. "|I` -> `Maas. |"I`)."""
    end = cut
    while end > lo and text[end - 1].isspace():
        end -= 1
    quote = end
    while quote > lo and text[quote - 1] in _OPENING:
        quote -= 1
    return quote if quote < end and quote > lo and text[quote - 1].isspace() else cut


def split_sentences(text: str, lang: str) -> list[tuple[int, int]]:
    """The sentences of `text` as character spans `(start, end)`, in order, stripped, non-overlapping.

    `lang` is an ISO 639-1 code ("en", "de", "fr"; a region such as "en-GB" is ignored). sentencex falls back
    along its own language chains, and a code it does not know at all gets its English rules (abbreviations
    such as "Mr." and "U.S." kept, "z. B." too). Quotes that open a sentence go with it, not with the sentence
    before. Empty or whitespace-only text gives [].
    """
    if not isinstance(text, str):
        raise DataError(f"split_sentences: text must be a str, got {type(text).__name__}")
    if not isinstance(lang, str):
        raise DataError(f"split_sentences: lang must be a language code such as 'en', got {lang!r}")
    import sentencex

    code = re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0] or "en"
    cuts = []
    for line in _LINE.finditer(text):
        if line.group().isspace():
            continue
        try:
            pieces = sentencex.segment(code, line.group())
        except UnicodeEncodeError as e:
            raise DataError(f"split_sentences: text holds a character that is not valid Unicode text "
                            f"(offset {line.start() + e.start}: {text[line.start() + e.start]!r})") from None
        for cut in align(text, list(pieces), *line.span()):
            cuts.append(_before_opening_quotes(text, cut, line.start()))
    return spans_at(text, cuts)


__all__ = ["align", "spans_at", "split_sentences"]
