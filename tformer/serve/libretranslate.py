"""LibreTranslate's API over the model, so that its clients work unchanged (libretranslatepy, the JavaScript
and browser plug-ins, anything that speaks POST /translate and GET /languages).

    POST /translate   JSON or application/x-www-form-urlencoded: q (a string or a list of strings; in a form,
                      repeat q for a list), source, target, format ("text"), api_key, alternatives (0..)
                      -> {"translatedText": str or list, "alternatives": [...] when asked}
    GET  /languages   -> [{"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", ..., "targets": []}]
    POST /detect      q (a string), api_key -> [{"confidence": 97.3, "language": "en"}, ...], likeliest first

As LibreTranslate does, a text is split into sentences (tformer.documents: sentencex's rules for the source
language; a line break always ends one), translated in one batch and put back between its own whitespace;
format "html" translates the text of each block in context and moves inline tags to the words they held
(word alignments), leaving comments, code, scripts, styles and translate="no" as they were. A server started
with --glossary holds its terms in every translation (constrained beam search).

Several models (tformer serve --model NAME=PATH ...): each request goes to the model trained on its source and
target (tformer.serve.models), /languages lists every pair, and with --pivot a pair no model covers may run
through that language (the answer says `"pivot": "en"`). Source "auto" detects each text's language among the
server's (py3langid's bundled model, offline), answers it as `detectedLanguage` as LibreTranslate does, and
translates it from there; a text detected in a language that does not reach the target is a 400 that names it
(give `source` to translate it anyway). GET /frontend/settings answers what LibreTranslate's web clients read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from tformer.api import Translation
from tformer.documents import FORMATS, HTML_OPTIONS, Prepared, prepare
from tformer.errors import TformerError
from tformer.serve.models import Leg, Models, Route, Routed
from tformer.serve.plans import TranslateRequest, make_plan, with_glossary
from tformer.serve.requests import RequestError, Settings, check_text, parse_form, parse_json

FIELDS = ("q", "source", "target", "format", "api_key", "alternatives")
NAMES = {"ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
         "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French", "hi": "Hindi", "hu": "Hungarian",
         "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch",
         "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "tr": "Turkish",
         "uk": "Ukrainian", "zh": "Chinese"}


@functools.cache
def _detector(codes: tuple[str, ...]) -> Callable[[str], list[tuple[str, float]]]:
    from tformer.data.clean import ranking

    return ranking(codes)


def detect(text: str, models: Models) -> list[tuple[str, float]]:
    """The server's languages (every model's sources and targets), each with the probability that `text` is in
    it, likeliest first."""
    return _detector(models.codes())(text)


def detect_request(body: Any, models: Models) -> list[dict[str, Any]]:
    """A LibreTranslate /detect body ({"q": text}), checked -> its answer: each language with a confidence in
    percent, likeliest first."""
    if not isinstance(body, dict):
        raise RequestError('the request must be a JSON object or a form such as {"q": "Hello"}')
    unknown = sorted(set(body) - {"q", "api_key"})
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; the fields are q, api_key")
    key = _one(body, "api_key")
    if key is not None and not isinstance(key, str):
        raise RequestError("api_key: must be a string")
    q = _one(body, "q")
    if not isinstance(q, str) or not q.strip():
        raise RequestError(f"q: give the text whose language to detect (a non-empty string), got {q!r}")
    return [{"confidence": round(100 * p, 2), "language": code} for code, p in detect(q, models)]


def languages(models: Models) -> list[dict[str, Any]]:
    """GET /languages: every language of the server, each with the targets it reaches (directly, or through the
    pivot language), sources first."""
    return [{"code": c, "name": NAMES.get(c, c), "targets": models.reachable(c)} for c in models.codes()]


def frontend_settings(models: Models, settings: Settings) -> dict[str, Any]:
    """GET /frontend/settings: what LibreTranslate's web client reads to set itself up."""
    source, target = models.pairs()[0]
    return {"charLimit": settings.max_chars * settings.max_sentences, "frontendTimeout": int(settings.timeout * 1000),
            "apiKeys": settings.api_key is not None, "keyRequired": settings.api_key is not None,
            "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": NAMES.get(source, source)},
                         "target": {"code": target, "name": NAMES.get(target, target)}}}


def parse_body(body: bytes, media_type: str) -> Any:
    """A /translate body: JSON, else a urlencoded form (what libretranslatepy sends)."""
    return parse_json(body) if media_type == "application/json" else parse_form(body)


@dataclass(frozen=True)
class Asked:
    """A /translate request: the sentences to translate, on which route, and how to put the answer together."""

    routed: Routed
    texts: list[Prepared]  # each text of q, read: its sentences, and how to put their translations back
    as_list: bool  # q was a list: answer a list
    alternatives: int
    detected: list[tuple[str, float]] | None = None  # source "auto": each text's language and its probability


def _one(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if isinstance(value, list) and name != "q":
        raise RequestError(f"{name}: given {len(value)} times; give it once")
    return value


def translate_request(body: Any, models: Models, settings: Settings) -> Asked:
    """A LibreTranslate /translate body, checked: the texts read (split into sentences; html: its markup
    parsed), the route of its languages (Models.route; "auto": detected), the server's glossary terms found."""
    if not isinstance(body, dict):
        raise RequestError('the request must be a JSON object or a form such as {"q": "Hello", "source": "en", '
                           '"target": "de"}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(FIELDS)}")
    source, target = _one(body, "source"), _one(body, "target")
    for name, value in (("source", source), ("target", target)):
        if value is None:
            raise RequestError(f"{name}: missing; this server translates {models.listed()} (GET /languages)")
    route = None if source == "auto" else models.route(source, target)
    form = _one(body, "format")
    if form not in (None, "", *FORMATS):
        raise RequestError(f"format: {form!r} is not a format; give 'text' (the default) or 'html'")
    form = form or "text"
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
    sources, prepared, wheres, detected = [], [], [], []
    for i, text in enumerate(texts):
        where = f"q[{i}]" if as_list else "q"
        if not isinstance(text, str):
            raise RequestError(f"{where}: must be a string, got {type(text).__name__}")
        try:
            read = prepare(text, form, source if route is not None else models.pairs()[0][0])
        except TformerError as e:
            raise RequestError(f"{where}: {e}") from None
        if route is None or detected:  # source "auto"
            language, p = detect(" ".join(read.sentences), models)[0]
            detected.append((language, p))
            route = _detected_route(models, where, language, p, target, detected, route)
        prepared.append(read)
        for j, sentence in enumerate(read.sentences):
            at = where if len(read.sentences) == 1 else f"{where}, sentence {j + 1}"
            sources.append(check_text(sentence, at, settings))
            wheres.append(at)
        if len(sources) > settings.max_sentences:
            raise RequestError(f"q: more than {settings.max_sentences} sentences; a request may have at most "
                               f"{settings.max_sentences} (--max-sentences): split it into several requests")
    if form == "html" and (route.pivot or route.legs[0].model.translator.ensemble):
        raise RequestError("format: 'html' needs word alignments from one model; this route "
                           f"{'goes through ' + route.pivot if route.pivot else 'decodes an ensemble'}")
    if not sources:  # nothing but whitespace and markup: nothing for the model
        sources, wheres = [""], ["q"]
    options = dict(HTML_OPTIONS) if form == "html" else {}  # what markup needs: the words' attention
    if alternatives:  # n-best lists from the checkpoint's search, or from a beam wide enough where it has none
        nbest = alternatives + 1
        d = route.legs[-1].model.translator.config.decode
        beam = None if d.strategy == "sample" or (d.strategy == "beam" and d.beam_size >= nbest) else \
            max(nbest, min(d.beam_size, settings.max_beam))
        options.update(nbest=nbest, beam=beam)

    def where_(what: str, i: int) -> str:
        return wheres[i] if what == "sources" else f"{wheres[i]}: {what}"

    def leg_request(leg: Leg, texts: list[str]) -> TranslateRequest:
        last = leg is route.legs[-1]
        chosen = options if last else {}  # a pivot's first leg: its best translation only
        phrases = with_glossary({}, texts, settings, leg.target) if not route.pivot else {}  # direct routes only
        plan = make_plan(leg.model.translator, settings, texts, where_, **phrases, **chosen, **leg.options)
        return TranslateRequest(plan, settings.timeout)

    return Asked(Routed(route, leg_request(route.legs[0], sources), leg_request), prepared, as_list, alternatives,
                 detected or None)


def _detected_route(models: Models, where: str, language: str, p: float, target: Any,
                    detected: list[tuple[str, float]], route: Route | None) -> Route:
    """The route of a text detected as `language`: one that reaches the target, and the request's texts must
    share it."""
    try:
        this = models.route(language, target)
    except RequestError:
        reach = [s for s in models.codes() if target in models.reachable(s)]
        hint = f"give source {' or '.join(map(repr, reach))} to translate it as such" if reach else "give source"
        raise RequestError(f"{where}: detected as {NAMES.get(language, language)} ({language!r}, {100 * p:.0f}% "
                           f"likely), which this server does not translate into {target!r}; {hint}") from None
    first = detected[0][0]
    if language != first:
        raise RequestError(f"{where}: detected as {NAMES.get(language, language)} ({language!r}), but q[0] as "
                           f"{NAMES.get(first, first)} ({first!r}); send each language in its own request, or "
                           "give source")
    return route or this


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
    """The LibreTranslate answer: each text put back together from its sentences' translations; with
    alternatives, the k-th alternative of a text takes each sentence's (k+1)-th hypothesis (its last where it
    has fewer)."""
    texts, alts, start = [], [], 0
    for read in asked.texts:
        part = translations[start:start + len(read.sentences)]
        start += len(read.sentences)
        texts.append(read.assemble(part))
        alts.append([read.assemble(part, k) for k in range(1, asked.alternatives + 1)])
    out: dict[str, Any] = {"translatedText": texts if asked.as_list else texts[0]}
    if asked.routed.route.pivot:
        out["pivot"] = asked.routed.route.pivot
    if asked.alternatives:
        out["alternatives"] = alts if asked.as_list else alts[0]
    if asked.detected:
        found = [{"confidence": round(100 * p, 2), "language": code} for code, p in asked.detected]
        out["detectedLanguage"] = found if asked.as_list else found[0]
    return out
