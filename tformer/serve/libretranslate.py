"""LibreTranslate's API over the model, so that its clients work unchanged (libretranslatepy, the JavaScript
and browser plug-ins, anything that speaks POST /translate and GET /languages).

    POST /translate   JSON or application/x-www-form-urlencoded: q (a string or a list of strings; in a form,
                      repeat q for a list), source, target, format ("text"), api_key, alternatives (0..)
                      -> {"translatedText": str or list, "alternatives": [...] when asked}
    GET  /languages   -> [{"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", ..., "targets": []}]

Differences, on purpose: the model translates one language pair (the checkpoint's data.src_lang ->
data.tgt_lang): any other source or target is a 400 naming the pair; source "auto" is taken to be the model's
source language (there is no language detection). A text is translated line by line (each line a sentence,
as the model was trained) and the lines joined again with "\\n". format "html" is refused (400): the model
reads plain text, and translating markup as words would break it; send the text without tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tformer.api import Translation, Translator
from tformer.config import Config
from tformer.serve.requests import (RequestError, Settings, TranslateRequest, check_text, decode_settings,
                                    parse_form, parse_json, pieces)

FIELDS = ("q", "source", "target", "format", "api_key", "alternatives")
NAMES = {"ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
         "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French", "hi": "Hindi", "hu": "Hungarian",
         "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch",
         "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "tr": "Turkish",
         "uk": "Ukrainian", "zh": "Chinese"}


def languages(cfg: Config) -> list[dict[str, Any]]:
    """GET /languages: the model's source language, whose one target is the model's target language; then the
    target language (translated into nothing here)."""
    src, tgt = cfg.data.src_lang, cfg.data.tgt_lang
    out = [{"code": src, "name": NAMES.get(src, src), "targets": [tgt]}]
    if tgt != src:
        out.append({"code": tgt, "name": NAMES.get(tgt, tgt), "targets": []})
    return out


def parse_body(body: bytes, media_type: str) -> Any:
    """A /translate body: JSON, else a urlencoded form (what libretranslatepy sends)."""
    return parse_json(body) if media_type == "application/json" else parse_form(body)


@dataclass(frozen=True)
class Asked:
    """A /translate request: the lines to translate and how to put the answer together."""

    request: TranslateRequest
    lines: list[int]  # how many lines (sentences) each text of q has
    as_list: bool  # q was a list: answer a list
    alternatives: int


def _one(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if isinstance(value, list) and name != "q":
        raise RequestError(f"{name}: given {len(value)} times; give it once")
    return value


def translate_request(body: Any, translator: Translator, settings: Settings) -> Asked:
    """A LibreTranslate /translate body, checked: the texts split into lines, the languages those of the model."""
    if not isinstance(body, dict):
        raise RequestError('the request must be a JSON object or a form such as {"q": "Hello", "source": "en", '
                           '"target": "de"}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(FIELDS)}")
    cfg = translator.config.data
    pair = f"this server translates {cfg.src_lang} to {cfg.tgt_lang} (GET /languages)"
    for name, want in (("source", cfg.src_lang), ("target", cfg.tgt_lang)):
        value = _one(body, name)
        if value is None:
            raise RequestError(f"{name}: missing; {pair}")
        if not isinstance(value, str):
            raise RequestError(f"{name}: must be a language code such as {want!r}, got {type(value).__name__}")
        if value != want and not (name == "source" and value == "auto"):
            raise RequestError(f"{name}: {value!r} is not a language of this model; {pair}")
    form = _one(body, "format")
    if form not in (None, "text"):
        raise RequestError(f"format: {form!r} is not supported: this server translates plain text (format "
                           "'text'); send the text without markup")
    key = _one(body, "api_key")
    if key is not None and not isinstance(key, str):
        raise RequestError("api_key: must be a string")
    alternatives = _alternatives(_one(body, "alternatives"), settings)
    q = body.get("q")
    if q is None:
        raise RequestError("q: missing; give the text to translate (a string, or a list of strings)")
    as_list = isinstance(q, list)
    texts = q if as_list else [q]
    if not texts:
        raise RequestError("q: an empty list; give at least one text")
    sources, lines, widths = [], [], []
    for i, text in enumerate(texts):
        where = f"q[{i}]" if as_list else "q"
        if not isinstance(text, str):
            raise RequestError(f"{where}: must be a string, got {type(text).__name__}")
        split = [line.rstrip("\r") for line in text.split("\n")]
        lines.append(len(split))
        for j, line in enumerate(split):
            at = where if len(split) == 1 else f"{where}, line {j + 1}"
            check_text(line, at, settings)
            widths.append(pieces(translator, line, at, "source", settings) + 1)
            sources.append(line)
        if len(sources) > settings.max_sentences:
            raise RequestError(f"q: more than {settings.max_sentences} lines (sentences); a request may have at most "
                               f"{settings.max_sentences} (--max-sentences): split it into several requests")
    beam = nbest = None
    if alternatives:
        nbest = alternatives + 1
        beam = max(translator.config.decode.beam_size, nbest)
    decode = decode_settings(translator, beam, nbest)
    request = TranslateRequest(sources, None, beam, nbest, False, decode, widths, settings.timeout)
    return Asked(request, lines, as_list, alternatives)


def _alternatives(value: Any, settings: Settings) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, str) and value.strip().isdigit():  # a form sends every value as text
        value = int(value)
    top = settings.max_nbest - 1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise RequestError(f"alternatives: must be a whole number from 0 to {top} (--max-nbest {settings.max_nbest}), "
                           f"got {value!r}")
    return value


def answer(asked: Asked, translations: list[Translation]) -> dict[str, Any]:
    """The LibreTranslate answer: each text's lines translated and joined; with alternatives, the k-th
    alternative of a text joins each line's (k+1)-th hypothesis (its best where it has fewer)."""
    texts, alts, start = [], [], 0
    for n in asked.lines:
        part = translations[start:start + n]
        start += n
        texts.append("\n".join(t.text for t in part))
        alts.append(["\n".join(t.hypotheses[min(k, len(t.hypotheses) - 1)].text for t in part)
                     for k in range(1, asked.alternatives + 1)])
    out: dict[str, Any] = {"translatedText": texts if asked.as_list else texts[0]}
    if asked.alternatives:
        out["alternatives"] = alts if asked.as_list else alts[0]
    return out
