"""Translating documents rather than sentences: paragraphs split into sentences, HTML with its markup, and
glossaries whose terms the outputs must hold. Everything here composes over the Translator's public API
(`translate` with `constraints` and `alignment`); nothing decodes on its own.

    from tformer.documents import Glossary, translate_documents
    translate_documents(translator, ["First sentence. Second one."])               # split, joined back
    translate_documents(translator, ["<p>A <b>dog</b> runs.</p>"], format="html")   # tags follow their words
    translate_documents(translator, texts, glossary=Glossary.read("terms.tsv"), beam=5)

Two steps, so that a server can batch many requests' sentences in one model call: `prepare` a text (its
sentences to translate, each one's glossary constraints) and `assemble` it from their translations.

- text: each line is split into sentences (`split=False`: each line is one sentence, as the model was trained);
  the translations are put back between the input's own whitespace.
- html: the markup is read by lxml (documents.markup): each block's text is one segment, split into sentences;
  the translations come back with word alignments (the model's cross-attention, Translator.translate's
  `alignment`), by which inline tags follow their words. Alignments come from one model: an ensemble cannot
  translate HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tformer.documents.glossary import Glossary
from tformer.documents.markup import MarkupDocument, parse_html
from tformer.documents.sentences import split_sentences
from tformer.errors import ConfigError, DataError
from tformer.results import Translation

FORMATS = ("text", "html")


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


def word_alignment(translation: Translation, which: int = 0) -> list[tuple[int, int]]:
    """Hypothesis `which`'s piece alignment as (source word, target word) pairs, each once, in order, over the
    source's words and its text's whitespace words."""
    hyp = translation.hypotheses[which]
    src, tgt = word_of(translation.source_tokens), word_of(hyp.tokens)
    last = max(len(hyp.text.split()) - 1, 0)  # detokenisation may glue what the pieces split
    pairs = {(src[i], min(tgt[j], last)) for i, j in hyp.alignment or () if i < len(src) and j < len(tgt)}
    return sorted(pairs)


@dataclass(frozen=True)
class Prepared:
    """A text read for translation: `sentences` to translate in one batch, with `constraints` (each one's
    glossary terms), and what `assemble` needs to put the translations back."""

    format: str
    text: str
    sentences: list[str]
    constraints: list[list[str]]
    spans: list[tuple[int, int]]  # text: each sentence's span in `text`
    parts: list[tuple[int, list[tuple[int, int]]]]  # html: per segment, its first sentence and their spans
    markup: MarkupDocument | None = None

    @property
    def needs_alignment(self) -> bool:
        return self.markup is not None

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


def _terms(sentences: list[str], glossary: Glossary | None) -> list[list[str]]:
    return [glossary.match(s) if glossary is not None else [] for s in sentences]


def translate_documents(translator, texts: Sequence[str], *, format: str = "text", lang: str | None = None,
                        split: bool = True, glossary: Glossary | None = None, **options: Any) -> list[str]:
    """Translate whole texts (module docstring): every sentence of every text in one Translator.translate
    call, with `options` (beam, DecodeConfig fields, ...). `lang`: the source language for the splitter (None:
    the model's). A glossary's terms are enforced by constrained beam search, so decoding must be beam search
    where a term matches."""
    if isinstance(texts, str):
        raise DataError("texts must be a list of texts: wrap one text in a list, [text]")
    lang = lang or translator.config.data.src_lang
    prepared = [prepare(t, format, lang, split, glossary) for t in texts]
    sentences = [s for p in prepared for s in p.sentences]
    constraints = [c for p in prepared for c in p.constraints]
    if format == "html":
        if translator.ensemble:
            raise ConfigError("HTML needs word alignments, which come from one model's cross-attention; this "
                              "Translator is an ensemble: load one checkpoint")
        options["alignment"] = True
    out = translator.translate(sentences, constraints=constraints if any(constraints) else None,
                               **options) if sentences else []
    results, at = [], 0
    for p in prepared:
        results.append(p.assemble(out[at:at + len(p.sentences)]))
        at += len(p.sentences)
    return results


__all__ = ["FORMATS", "Glossary", "Prepared", "line_spans", "prepare", "split_sentences",
           "translate_documents", "word_alignment", "word_of"]
