"""Translating documents rather than sentences: paragraphs split into sentences, HTML with its markup, and
glossaries whose terms the outputs must hold. Everything here composes over the Translator's public API
(`translate` with `constraints` and `return_attention`); nothing decodes on its own.

    from tformer.documents import Glossary, translate_documents
    translate_documents(translator, ["First sentence. Second one."])               # split, joined back
    translate_documents(translator, ["<p>A <b>dog</b> runs.</p>"], format="html")   # tags follow their words
    translate_documents(translator, texts, glossary=Glossary.read("terms.tsv"), beam=5)

Two steps, so that a server can batch many requests' sentences in one model call: `prepare` a text (its
sentences to translate, each one's glossary constraints) and `assemble` it from their translations, which
must have been made with the options `Prepared.options` names (html: HTML_OPTIONS).

- text: each line is split into sentences (`split=False`: each line is one sentence, as the model was trained);
  the translations are put back between the input's own whitespace.
- html: the markup is read by lxml (documents.markup): each block's text is one segment, split into sentences;
  the translations come back with their attention maps (Translator.translate's `return_attention`), from
  which `word_alignment` gives each source word the target word that attends to it most, and inline tags
  follow their words. Alignments come from one model: an ensemble cannot translate HTML.

Word alignment, for tags. A tag holds source words and must be put around their translation, so the question
is asked per source word: which target word attends to it most? The cross-attention of every decoder layer
and head is averaged (a universal transformer's positions over the steps they computed), a target word's row
is the mean of its pieces' rows and a source word's column the sum of its pieces' columns, and each source
word is paired with its column's largest entry. A Translation without attention maps (a caller who asked for
`alignment` only) is read from its hard piece alignment instead: each target piece's argmax source piece,
every pair kept. On Multi30k test2016 (benchmarks/documents.py, RESULTS.md; multi30k_quick) a one-word tag
holds its word's translation, and nothing else, in 96.7% of outputs with the per-source-word pairs; with the
hard piece pairs it holds it in 91.4%, and nothing else in 46.4%: a piece's argmax often falls on a neighbour
of its word, and every such stray pair widens a tag. Chosen on the validation split (97.4%) over the last
layer alone (96.7%), sums over a target word's pieces (95.4%), and adding each target word's row argmax
(the tag holds it in 98.7%, nothing else in 74%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tformer.documents.glossary import Glossary
from tformer.documents.markup import MarkupDocument, parse_html
from tformer.documents.sentences import split_sentences
from tformer.errors import ConfigError, DataError
from tformer.results import Translation

FORMATS = ("text", "html")
HTML_OPTIONS = {"return_attention": True}  # what Translator.translate must give for markup: word_alignment
HTML_CHUNK = 256  # html: sentences per Translator.translate call, whose attention maps are held until assembled


def line_spans(text: str) -> list[tuple[int, int]]:
    """The spans of `text`'s non-empty lines, stripped: one sentence per line."""
    out, at = [], 0
    for line in text.splitlines(keepends=True):
        body = line.strip()
        if body:
            start = at + line.index(body)
            out.append((start, start + len(body)))
        at += len(line)
    return out


def word_of(pieces: Sequence[str]) -> list[int]:
    """The whitespace word each piece belongs to, counting from 0: SentencePiece marks a word's first piece
    with '▁'; pieces without any mark (a word-level vocabulary) are a word each."""
    if not any(p.startswith("▁") for p in pieces):
        return list(range(len(pieces)))
    out, word = [], -1
    for p in pieces:
        word += p.startswith("▁") or word < 0
        out.append(word)
    return out


def word_attention(translation: Translation, which: int = 0) -> np.ndarray:
    """(target words, source words): hypothesis `which`'s cross-attention (it must carry attention maps)
    averaged over every decoder layer and head, a target word's row the mean of its pieces' rows, a source
    word's column the sum of its pieces' columns; </s> on neither side. Words as `word_alignment` counts them."""
    hyp = translation.hypotheses[which]
    src, tgt = word_of(translation.source_tokens), word_of(hyp.tokens)
    if not src or not tgt:
        return np.zeros((max(tgt, default=-1) + 1, max(src, default=-1) + 1))
    last = max(len(hyp.text.split()) - 1, 0)  # detokenisation may glue what the pieces split
    tgt = [min(j, last) for j in tgt]
    cross = hyp.attention.weights["cross"]  # (layers, H, T + 1, S + 1): queries y1 .. yn </s>, keys x1 .. xm </s>
    # a universal transformer's NaN rows are the steps a position did not compute: each averages its own
    pieces = np.nanmean(cross[:, :, :len(tgt), :len(src)], axis=(0, 1))  # (T, S)
    rows = np.zeros((tgt[-1] + 1, len(src)))  # (target words, S)
    np.add.at(rows, tgt, pieces)
    rows /= np.bincount(tgt)[:, None].clip(1)  # the mean of each target word's pieces
    words = np.zeros((len(rows), src[-1] + 1))  # (target words, source words)
    np.add.at(words.T, src, rows.T)  # the sum over each source word's pieces
    return words


def word_alignment(translation: Translation, which: int = 0) -> list[tuple[int, int]]:
    """Hypothesis `which`'s word alignment as (source word, target word) pairs, each once, in order, over the
    source's words and its text's whitespace words. With attention maps (translate's `return_attention`),
    each source word is paired with the target word that attends to it most (`word_attention`'s column
    argmax); without them, its hard piece alignment (translate's `alignment`) gives every pair of words
    some of whose pieces are aligned."""
    hyp = translation.hypotheses[which]
    if hyp.attention is not None:
        words = word_attention(translation, which)
        return [(i, int(words[:, i].argmax())) for i in range(words.shape[1])] if words.size else []
    src, tgt = word_of(translation.source_tokens), word_of(hyp.tokens)
    last = max(len(hyp.text.split()) - 1, 0)  # detokenisation may glue what the pieces split
    pairs = {(src[i], min(tgt[j], last)) for i, j in hyp.alignment or () if i < len(src) and j < len(tgt)}
    return sorted(pairs)


@dataclass(frozen=True)
class Prepared:
    """A text read for translation: `sentences` to translate in one batch, with `phrases` (each one's glossary
    terms by the phrase input they feed: Glossary.phrases), and what `assemble` needs to put the translations
    back."""

    format: str
    text: str
    sentences: list[str]
    phrases: list[dict[str, list[str]]]
    spans: list[tuple[int, int]]  # text: each sentence's span in `text`
    parts: list[tuple[int, list[tuple[int, int]]]]  # html: per segment, its first sentence and their spans
    markup: MarkupDocument | None = None

    @property
    def needs_alignment(self) -> bool:
        return self.markup is not None

    @property
    def options(self) -> dict[str, Any]:
        """What Translator.translate must be asked for, besides the text, for `assemble` to place the markup:
        each hypothesis' attention maps (word_alignment)."""
        return dict(HTML_OPTIONS) if self.markup is not None else {}

    def assemble(self, translations: Sequence[Translation], which: int = 0) -> str:
        """The document with each sentence replaced by hypothesis `which` of its translation (its last where it
        has fewer), one Translation per sentence, in order."""
        if len(translations) != len(self.sentences):
            raise DataError(f"assemble got {len(translations)} translations for {len(self.sentences)} sentences")
        hyps = [t.hypotheses[min(which, len(t.hypotheses) - 1)] for t in translations]
        if self.markup is None:
            out, at = [], 0
            for (start, end), hyp in zip(self.spans, hyps):
                out += [self.text[at:start], hyp.text]
                at = end
            return "".join(out) + self.text[at:]
        segments = []
        for (first, spans), segment in zip(self.parts, self.markup.segments):
            words, pairs = [], []
            for k, (start, _) in enumerate(spans):
                t = translations[first + k]
                picked = min(which, len(t.hypotheses) - 1)
                src_offset = len(segment[:start].split())
                pairs += [(src_offset + i, len(words) + j) for i, j in word_alignment(t, picked)]
                words += hyps[first + k].text.split()
            n_src = len(segment.split())
            segments.append((" ".join(words), [(min(i, n_src - 1), j) for i, j in pairs]))
        return self.markup.render(segments)


def prepare(text: str, format: str = "text", lang: str = "en", split: bool = True,
            glossary: Glossary | None = None) -> Prepared:
    """Read one text for translation (module docstring); `lang` picks the sentence splitter's rules."""
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if not isinstance(text, str):
        raise DataError(f"a text to translate must be a string, got {type(text).__name__}")
    spans_of = (lambda s: split_sentences(s, lang)) if split else line_spans
    if format == "text":
        spans = spans_of(text)
        sentences = [text[a:b] for a, b in spans]
        return Prepared(format, text, sentences, _terms(sentences, glossary), spans, [])
    markup = parse_html(text)
    sentences, parts = [], []
    for segment in markup.segments:
        spans = spans_of(segment)
        parts.append((len(sentences), spans))
        sentences += [segment[a:b] for a, b in spans]
    return Prepared(format, text, sentences, _terms(sentences, glossary), [], parts, markup)


def _terms(sentences: list[str], glossary: Glossary | None) -> list[dict[str, list[str]]]:
    return [glossary.phrases(s) if glossary is not None else {} for s in sentences]


def translate_documents(translator, texts: Sequence[str], *, format: str = "text", lang: str | None = None,
                        split: bool = True, glossary: Glossary | None = None, **options: Any) -> list[str]:
    """Translate whole texts (module docstring): every sentence of every text in one Translator.translate
    call (html: of about HTML_CHUNK sentences' texts, whose attention maps are dropped once they are put back),
    with `options` (beam, DecodeConfig fields, ...). `lang`: the source language for the splitter (None: the
    model's). A glossary's terms are enforced by constrained beam search, so decoding must be beam search where
    a term matches."""
    if isinstance(texts, str):
        raise DataError("texts must be a list of texts: wrap one text in a list, [text]")
    lang = lang or translator.config.data.src_lang
    prepared = [prepare(t, format, lang, split, glossary) for t in texts]
    if format == "html":
        if translator.ensemble:
            raise ConfigError("HTML needs word alignments, which come from one model's cross-attention; this "
                              "Translator is an ensemble: load one checkpoint")
        options.update(HTML_OPTIONS)
    results = []
    for group in _groups(prepared, HTML_CHUNK if format == "html" else None):
        sentences = [s for p in group for s in p.sentences]
        found = [f for p in group for f in p.phrases]
        phrases = {name: [f.get(name) for f in found] for name in {name for f in found for name in f}}
        out = translator.translate(sentences, **phrases, **options) if sentences else []
        at = 0
        for p in group:
            results.append(p.assemble(out[at:at + len(p.sentences)]))
            at += len(p.sentences)
    return results


def _groups(prepared: list[Prepared], size: int | None) -> list[list[Prepared]]:
    """Consecutive texts, about `size` sentences a group (a longer text alone; None: all in one group)."""
    groups: list[list[Prepared]] = [[]]
    n = 0
    for p in prepared:
        if size is not None and groups[-1] and n + len(p.sentences) > size:
            groups.append([])
            n = 0
        groups[-1].append(p)
        n += len(p.sentences)
    return groups


__all__ = ["FORMATS", "HTML_OPTIONS", "Glossary", "Prepared", "line_spans", "prepare", "split_sentences",
           "translate_documents", "word_alignment", "word_attention", "word_of"]
