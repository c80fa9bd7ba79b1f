"""Translate HTML while keeping its markup: the text of each block goes out, translations come back in.

    doc = parse_html(html)                  # a fragment ("<p>Hi <b>there</b></p>") or a whole document
    doc.segments                            # one plain text per translation unit, in document order
    doc.render([(target, alignment), ...])  # the HTML again, each unit's text translated

A translation unit is the inline content of one block (a <p>, <li>, <h1>, <td>, <title>, or text lying
directly in the fragment) between two block children, so text is translated in context, never per text node.
Inline elements (b, i, a, span, sup, br, img, ..., and any tag HTML does not know: XML-like inline tags such as
<g id="1"> and custom elements) do not split a unit; an inline element that holds a block
(<a><div>..</div></a>) is treated as a block itself. A unit's segment is its words joined by single spaces.

Notation: n source words = segment.split(), m target words = target.split(); an alignment is any set of
pairs (i, j), source word i -> target word j. Inline elements follow their words:

  span       an element covers target words min(T) .. max(T), T = targets aligned to the source words it
             holds (a word split by a tag, un<b>believ</b>able, belongs to every element holding part of it)
  nesting    a child's span is clamped into its parent's; siblings, taken in target order, are clamped to
             start where the previous one ended (the later one shrinks), so the output is a well-nested tree
  anchor     an element with no aligned target word, and one without words (<br>, <img>, a comment,
             <code>x</code>), is placed after the last target word aligned to the nearest aligned source
             word before it (or at the start), copied whole
  words      a word that ran across a tag (<a>Link</a>, or un<b>believ</b>able) keeps the outside part
             outside when its target word starts/ends with the same part; punctuation just inside an
             element's edge ends a word there (geometry.<sup>[1]</sup> is two words)
  spaces     target words are joined by single spaces outside element boundaries, except that target words
             aligned i -> j and i+1 -> j+1 keep the source's whitespace between them (an &nbsp;, or none in
             geometry.<sup>[1]</sup>); around an anchored element its source whitespace is kept, two words
             never run together; a block's leading and trailing whitespace is kept

Passed through untouched (not translated, in no segment, same tag, attributes and text): comments, <code>,
<pre>, <script>, <style>, <kbd>, <samp>, <var>, <textarea>, <svg>, <math> and any element with
translate="no", with everything inside. Attribute values, alt= and title= included, are never translated.
Entities are decoded by the parser and escaped again on output (&amp; stays &amp;, &eacute; becomes é).

The parser is lxml.html (libxml2), fragments read as lxml.html.fragment_fromstring does: inside
<html><body>. Markup it recovers from (an unclosed <b> or <p>) is fine; input it cannot read (no text, a
control character, nesting past libxml2's depth limit) raises DataError naming line and column. Limits:
libxml2 drops some input silently (text after </html>; after an unterminated attribute quote, caught only
when nothing at all is left); whitespace inside an element after its last word is not kept; words are
whitespace-separated, so a tag inside a word moves with the whole word unless the cut above applies.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import lxml.etree
import lxml.html

from tformer.errors import DataError

# HTML's block-level elements (and those of <head>, tables and lists): every other tag, XML-like inline tags
# (<g id="1">, <x1/>) and custom elements included, is inline, as a browser lays out an unknown element.
BLOCK = frozenset("""address article aside blockquote body caption center col colgroup dd details dialog dir div
    dl dt fieldset figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html legend li
    link main menu meta nav noscript ol optgroup option p pre section summary table tbody td template tfoot th
    thead title tr ul""".split())
PASS_THROUGH = frozenset("code pre script style kbd samp var textarea svg math".split())
_DOCUMENT = re.compile(r"<!doctype|<html[\s>]|<head[\s>]|<body[\s>]|</html\s*>|</body\s*>", re.IGNORECASE)
_NOT_XML_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_PREFIX = "<html><body>"


@dataclass
class _Item:
    """An inline element over run text [start, end): it holds words and has its inline children, or it is
    an atom (no words: <br>, <img>, a comment, a pass-through element), copied whole."""
    element: lxml.etree._Element
    start: int
    end: int
    children: list = field(default_factory=list)
    atom: bool = False


@dataclass
class _Run:
    """One translation unit: container's inline content after block child `after` (None: container.text)."""
    container: lxml.etree._Element
    after: lxml.etree._Element | None
    text: str = ""
    cuts: list = field(default_factory=list)      # offsets in text that end a word without a space
    members: list = field(default_factory=list)   # the container's inline children in this run
    children: list = field(default_factory=list)  # the same, read into _Items


@dataclass
class _Placed:
    """An item placed over target words [start, end); start == end: anchored there, nothing inside."""
    item: _Item
    start: int
    end: int
    children: list


def _is_opaque(el) -> bool:
    return not isinstance(el.tag, str) or el.tag in PASS_THROUGH or el.get("translate", "").lower() == "no"


def _is_inline(el) -> bool:
    if not isinstance(el.tag, str):  # comment, processing instruction
        return True
    return el.tag not in BLOCK and (_is_opaque(el) or all(_is_inline(c) for c in el))


def _read_inline(el, run: _Run) -> _Item:
    """Append el's translatable text to run.text and return it as an _Item."""
    start = len(run.text)
    if not _is_opaque(el):
        run.text += el.text or ""
        children = []
        for child in el:
            children.append(_read_inline(child, run))
            run.text += child.tail or ""
        if run.text[start:].strip():  # punctuation just inside an edge cuts the word there: geometry.<sup>[1]
            end = len(run.text)
            run.cuts += [x for x, c in ((start, run.text[start]), (end, run.text[end - 1])) if not c.isalnum()]
            return _Item(el, start, end, children)
    if el.tag == "br":  # a line break ends a word
        run.cuts.append(start)
    return _Item(el, start, len(run.text), atom=True)


def _read_runs(root) -> list[_Run]:
    """Every run of inline content under root, in document order (whitespace-only ones included)."""
    runs = []

    def visit(container):
        run = _Run(container, None, container.text or "")
        for child in container:
            if _is_inline(child):
                run.members.append(child)
                run.children.append(_read_inline(child, run))
                run.text += child.tail or ""
            else:
                runs.append(run)
                if not _is_opaque(child):
                    visit(child)
                run = _Run(container, child, child.tail or "")
        runs.append(run)

    visit(root)
    return runs


def _word_spans(run: _Run) -> list[tuple[int, int]]:
    """[start, end) of each word of the run: run.text.split(), cut again at run.cuts, in order."""
    spans = []
    for word in re.finditer(r"\S+", run.text):
        cuts = sorted({word.start(), word.end(), *(b for b in run.cuts if word.start() < b < word.end())})
        spans += itertools.pairwise(cuts)
    return spans


def _segment(run: _Run) -> str:
    return " ".join(run.text[s:e] for s, e in _word_spans(run))


def _anchor(before: int, by_source: list[list[int]]) -> int:
    """The target position after the last target word aligned to the nearest aligned word before `before`."""
    for i in range(before - 1, -1, -1):
        if by_source[i]:
            return max(by_source[i]) + 1
    return 0


def _place(items: list, lo: int, hi: int, words, by_source) -> list[_Placed]:
    """Target spans for sibling items inside their parent's [lo, hi): aligned, clamped, non-overlapping."""
    wanted = []
    for order, item in enumerate(items):
        if not item.atom:  # the words it holds, even in part
            held = [i for i, (s, e) in enumerate(words) if s < item.end and e > item.start]
            before, targets = held[0], [j for i in held for j in by_source[i]]
        else:
            before, targets = sum(s < item.start for s, _ in words), []
        if targets:
            start, end = min(targets), max(targets) + 1
        else:
            start = end = _anchor(before, by_source)
        start, end = min(max(start, lo), hi), min(max(end, lo), hi)
        wanted.append((start, end > start, order, end, item))
    placed, cursor = [], lo
    for start, _, _, end, item in sorted(wanted, key=lambda w: w[:3]):
        start = max(start, cursor)
        cursor = end = max(end, start)
        placed.append(_Placed(item, start, end, _place(item.children, start, end, words, by_source)))
    return placed


def _tokens(placed: list[_Placed], lo: int, hi: int) -> list[tuple]:
    """The placed tree as a flat stream: ("word", j), ("open", p), ("close", p), ("atom", p)."""
    out, k = [], lo
    for p in placed:
        out += [("word", j) for j in range(k, p.start)]
        if p.start == p.end:
            out.append(("atom", p))
        else:
            out += [("open", p), *_tokens(p.children, p.start, p.end), ("close", p)]
        k = max(k, p.end)
    return out + [("word", j) for j in range(k, hi)]


def _spaced(tokens: list[tuple], text: str, m: int, seps: dict[int, str]) -> list[tuple]:
    """Put ("text", whitespace) tokens in each gap between target words: see _gap_spaces."""
    out, gap, k = [], [], 0
    for token in tokens + [("end",)]:
        if token[0] not in ("word", "end"):
            gap.append(token)
            continue
        spaces = _gap_spaces(gap, k, m, text, seps)
        for z, t in enumerate(gap + [token]):
            out += [("text", spaces[z]), t] if z in spaces else [t]
        gap, k = [], k + 1
    return out[:-1]


def _gap_spaces(gap: list[tuple], k: int, m: int, text: str, seps: dict[int, str]) -> dict[int, str]:
    """{token index: whitespace to put before it} for the gap before target word k (closes, anchored
    elements, opens): between two words seps[k] (the source's, for words that follow on as their sources
    did) or one space; around anchored elements the whitespace they had in the source; never two words run
    together. Each goes after the closes and before the opens that separate its neighbours."""
    def after(x):  # gap[x] had whitespace after it (x == -1: the word before, "")
        end = gap[x][1].item.end if x >= 0 else None
        return "" if end is None else re.match(r"\s*", text[end:]).group() if end < len(text) else " "

    def before(y):
        start = gap[y][1].item.start if y < len(gap) else None
        return "" if start is None else re.search(r"\s*$", text[:start]).group() if start else " "

    ends = ([-1] if k > 0 else []) + [x for x, t in enumerate(gap) if t[0] == "atom"] + [len(gap)] * (k < m)
    pairs = list(itertools.pairwise(ends))
    wants = [seps.get(k, " ") if (x, y) == (-1, len(gap)) else after(x) or before(y) for x, y in pairs]
    if 0 < k < m and seps.get(k) != "" and not any(wants):
        wants[-1] = " "
    spaces = {}
    for (x, y), want in zip(pairs, wants):
        closes = [z for z in range(x + 1, y) if gap[z][0] == "close"]
        spaces.update({closes[-1] + 1 if closes else x + 1: want} if want else {})
    return spaces


def _cut_words(tokens: list[tuple], target: list[str], text: str, spans) -> list[tuple]:
    """Words become ("text", s); where a source word ran across tags (<a>Link</a>, or un<b>believ</b>able)
    and the target word starts/ends with the same outside part, that part goes back outside the tags."""
    words, before, after = {}, {}, {}  # token index -> text: the word, a piece before an open / after a close
    for x, (kind, *rest) in enumerate(tokens):
        if kind != "word":
            continue
        word = target[rest[0]]
        closes = list(itertools.takewhile(lambda y: tokens[y][0] == "close", range(x + 1, len(tokens))))
        opens = list(itertools.takewhile(lambda y: tokens[y][0] == "open", range(x - 1, -1, -1)))[::-1]
        if closes:  # innermost first
            first = tokens[closes[0]][1].item.end
            word_end = next((e for s, e in spans if s < first < e), first)  # the word the tag ends inside
            ends = [min(tokens[y][1].item.end, word_end) for y in closes] + [word_end]
            suffix = text[ends[0]:word_end]
            if suffix and word.endswith(suffix) and len(word) > len(suffix):
                word = word[:-len(suffix)]
                after.update((y, text[a:b]) for y, a, b in zip(closes, ends, ends[1:]))
        if opens:  # outermost first
            last = tokens[opens[-1]][1].item.start
            word_start = next((s for s, e in spans if s < last < e), last)  # the word the tag starts inside
            starts = [word_start] + [max(tokens[y][1].item.start, word_start) for y in opens]
            prefix = text[word_start:starts[-1]]
            if prefix and word.startswith(prefix) and len(word) > len(prefix):
                word = word[len(prefix):]
                before.update((y, text[a:b]) for y, a, b in zip(opens, starts, starts[1:]))
        words[x] = word
    out = []
    for y, token in enumerate(tokens):
        word_or_tag = ("text", words[y]) if y in words else token
        out += [("text", before.get(y, "")), word_or_tag, ("text", after.get(y, ""))]  # "" adds nothing
    return out


def _zero_width(p: _Placed):
    """An anchored element: the source element copied whole, or emptied with its children anchored inside."""
    if p.item.atom:
        el = copy.deepcopy(p.item.element)
    else:
        el = p.item.element.makeelement(p.item.element.tag, dict(p.item.element.attrib))
        el.extend(_zero_width(c) for c in p.children)
    el.tail = None
    return el


def _add_text(parent, text: str) -> None:
    """text after parent's last child (its tail), or as parent's text; no empty text nodes."""
    if text and len(parent):
        parent[-1].tail = (parent[-1].tail or "") + text
    elif text:
        parent.text = (parent.text or "") + text


def _render_run(run: _Run, target: list[str], alignment: list[tuple[int, int]]):
    """The run's new content, in a <div>: its leading text, then the elements with their tails."""
    words = _word_spans(run)
    by_source = [[] for _ in words]
    for i, j in alignment:
        by_source[i].append(j)
    seps = {j + 1: run.text[words[i][1]:words[i + 1][0]] for i, j in alignment
            if i + 1 < len(words) and j + 1 in by_source[i + 1]}  # target words that follow on as in the source
    placed = _place(run.children, 0, len(target), words, by_source)
    tokens = _cut_words(_spaced(_tokens(placed, 0, len(target)), run.text, len(target), seps),
                        target, run.text, words)
    first = min([words[0][0]] + [c.start for c in run.children])
    last = max([words[-1][1]] + [c.end for c in run.children])
    stack = [run.container.makeelement("div", {})]
    _add_text(stack[0], run.text[:first])
    for kind, *rest in tokens:
        if kind == "text":
            _add_text(stack[-1], rest[0])
        elif kind == "open":
            stack.append(stack[-1].makeelement(rest[0].item.element.tag, dict(rest[0].item.element.attrib)))
            stack[-2].append(stack[-1])
        elif kind == "close":
            stack.pop()
        else:
            stack[-1].append(_zero_width(rest[0]))
    _add_text(stack[0], run.text[last:])
    return stack[0]


def _check_text(html) -> None:
    if not isinstance(html, str):
        raise DataError(f"parse_html needs the HTML as text (str), got {type(html).__name__}; decode bytes first")
    bad = _NOT_XML_CHAR.search(html)
    if bad:
        line = html.count("\n", 0, bad.start()) + 1
        column = bad.start() - html.rfind("\n", 0, bad.start())
        raise DataError(f"HTML line {line}, column {column}: character {bad.group()!r} cannot be read "
                        f"(control character, NUL or lone surrogate); remove or replace it")


def _parse(html: str) -> tuple[lxml.etree._Element, bool]:
    """(root to translate under, is a whole document); DataError if libxml2 cannot read it."""
    document = bool(_DOCUMENT.search(html))
    parser = lxml.html.HTMLParser()
    try:
        root = lxml.html.document_fromstring(html if document else _PREFIX + html + "</body></html>", parser)
    except (lxml.etree.ParserError, ValueError) as error:
        raise DataError(f"HTML cannot be read: {error}; check that it is HTML text") from None
    for entry in parser.error_log:
        if entry.level_name == "FATAL":
            column = entry.column - (len(_PREFIX) if entry.line == 1 and not document else 0)
            raise DataError(f"HTML line {entry.line}, column {max(column, 1)}: {entry.message.strip()}; "
                            f"fix the markup there")
    if document:
        return root, True
    body = root.find("body")
    if html.strip() and not (body.text or "").strip() and len(body) == 0:
        raise DataError("HTML cannot be read: the parser found no text or element in it; look for an "
                        "unclosed quote (<p title='...>) or a tag that swallows the rest")
    return body, False


def _serialise(root, document: bool, doctype: bool) -> str:
    """lxml's HTML, except that an empty element keeps its end tag: libxml2 writes an empty <li> or <p>
    as a bare start tag, and reading that back pulls the following text inside."""
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag not in lxml.html.defs.empty_tags and el.text is None and not len(el):
            el.text = ""
    if not document:
        body = lxml.etree.tostring(root, encoding="unicode", method="html")
        assert body.startswith("<body>") and body.endswith("</body>"), body[:40]
        return body[len("<body>"):-len("</body>")]
    tree = root.getroottree()
    if doctype:
        return lxml.etree.tostring(tree, encoding="unicode", method="html")
    return lxml.etree.tostring(tree, encoding="unicode", method="html", doctype="").removeprefix("\n")


@dataclass(frozen=True)
class MarkupDocument:
    """HTML read for translation: `segments` to translate, `render` to put the translations back.

    segments: the plain text of each translation unit (words joined by single spaces), in document order;
    html: the input as the parser read it, serialised again (what render keeps of everything else)."""
    segments: list[str]
    html: str
    _source: str = field(repr=False)

    def render(self, translations: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> str:
        """One (target text, word alignment) per segment: alignment pairs (source word i, target word j) over
        segment.split() and target.split() (whitespace-separated words; any subset of pairs, maybe empty).
        Returns the HTML with each segment's text replaced by its translation and inline elements placed
        around the target words aligned to the source words they held."""
        if len(translations) != len(self.segments):
            raise DataError(f"render got {len(translations)} translations for {len(self.segments)} segments; "
                            f"pass one (target text, alignment) per segment, in order")
        root, document = _parse(self._source)
        runs = [run for run in _read_runs(root) if run.text.strip()]
        checked = [_check_translation(n, segment, translation)
                   for n, (segment, translation) in enumerate(zip(self.segments, translations))]
        for run, (target, alignment) in zip(runs, checked):
            new = _render_run(run, target, alignment)
            for member in run.members:
                run.container.remove(member)
            if run.after is None:
                run.container.text, index = new.text, 0
            else:
                run.after.tail, index = new.text, run.container.index(run.after) + 1
            run.container[index:index] = list(new)
        return _serialise(root, document, bool(re.search(r"<!doctype", self._source, re.IGNORECASE)))


def _check_translation(n: int, segment: str, translation) -> tuple[list[str], list[tuple[int, int]]]:
    """(target words, alignment pairs) of translation n, or DataError naming the segment and the pair."""
    target, alignment = translation if isinstance(translation, (tuple, list)) and len(translation) == 2 \
        else (None, None)
    if not isinstance(target, str):
        raise DataError(f"translation {n} is not a (target text, alignment) pair with the target as text: "
                        f"{translation!r:.80}")
    n_source, n_target = len(segment.split()), len(target.split())
    try:
        pairs = [(int(i), int(j)) for i, j in alignment]
    except (TypeError, ValueError):
        raise DataError(f"translation {n}: the alignment must be (source word i, target word j) pairs of "
                        f"integers, got {alignment!r:.80}") from None
    for i, j in pairs:
        if not (0 <= i < n_source and 0 <= j < n_target):
            raise DataError(f"translation {n}: alignment pair ({i}, {j}) is out of range for {n_source} source "
                            f"and {n_target} target words; indices count whitespace-separated words from 0")
    return target.split(), pairs


def parse_html(html: str) -> MarkupDocument:
    """Read an HTML fragment or document for translation; DataError naming line/column if it cannot be read."""
    _check_text(html)
    if not html.strip():
        return MarkupDocument([], html, html)
    root, document = _parse(html)
    segments = [_segment(run) for run in _read_runs(root) if run.text.strip()]
    doctype = bool(re.search(r"<!doctype", html, re.IGNORECASE))
    return MarkupDocument(segments, _serialise(root, document, doctype), html)


__all__ = ["BLOCK", "PASS_THROUGH", "MarkupDocument", "parse_html"]
