"""The service's OpenAPI 3.1 description, served at GET /openapi.json: every route with its request fields and
their limits taken from the server's own Settings (so the document and the checks in tformer.serve.requests
read the same numbers), its answers, and its errors. Clients can be generated from it, and the tests fuzz the
running server from it (schemathesis): no input gets a 500, every schema-invalid one a 4xx naming the field.

    openapi(translator, settings, explorer_limits) -> dict

What a schema cannot say is in the descriptions: a sentence's SentencePiece length (--max-tokens), one prefix
or target per source, nbest <= beam, the model's language pair. /v1/translate's decoding and phrase fields are
generated (tformer.serve.plans): DecodeConfig's per-call fields with their help and bounds, and one field per
decode.PHRASE_INPUTS entry.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from tformer.serve.models import Models
from tformer.config import DecodeConfig
from tformer.decode.phrases import PHRASE_INPUTS
from tformer.documents.glossary import Glossary
from tformer.serve.plans import cap, decoding_fields, field_help
from tformer.serve.requests import Settings

VERSION = "1.0.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {400: "a field or the body is wrong: the message names it", 401: "an API key is needed",
           403: "the API key is wrong, or the Host is not a loopback name on a loopback-only server",
           408: "the request line and headers, or the body, came too slowly (--header-timeout, --body-timeout)",
           413: "the body is over --max-body", 415: "the Content-Type is not one this route reads",
           503: "busy: the queue (--max-queue) or the connections (--max-connections) are full; see Retry-After",
           504: "no answer within the request's time limit; its work left the model"}
    out = {}
    for code in codes:
        out[str(code)] = {"description": why[code], "content": _json(_ref("Error"))}
        if code == 503:
            out[str(code)]["headers"] = {"Retry-After": {"schema": {"type": "string"},
                                                         "description": "seconds to wait before retrying"}}
    return out


ALWAYS = (400, 401, 403, 408, 503)  # any route: bad Host, key, slow client, busy


def _sentences(settings: Settings, what: str) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "maxItems": settings.max_sentences,
            "items": {"type": "string", "maxLength": settings.max_chars},
            "description": f"{what}: at most {settings.max_sentences} (--max-sentences), each at most "
                           f"{settings.max_chars} characters (--max-chars) and {settings.max_tokens} pieces "
                           "(--max-tokens)"}


def _timeout(settings: Settings) -> dict[str, Any]:
    return {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": settings.timeout,
            "description": f"seconds this request may wait for its answer (default and most: --timeout, "
                           f"{settings.timeout:g})"}


def decoding_schemas(settings: Settings) -> dict[str, Any]:
    """The decoding fields of /v1/translate (tformer.serve.plans.decoding_fields: DecodeConfig's per-call
    fields), each with its type, its help and the config's bounds, capped by the server's limits."""
    hints = typing.get_type_hints(DecodeConfig)
    out = {}
    for name, f in decoding_fields().items():
        tp = hints[f.name]
        if typing.get_origin(tp) is Literal:
            schema: dict[str, Any] = {"type": ["string", "null"], "enum": [*typing.get_args(tp), None]}
        else:
            schema = {"type": ["integer" if tp is int else "number", "null"], **f.metadata["bounds"].schema()}
            top = cap(name, settings)
            if top is not None:
                schema["maximum"] = min(schema.get("maximum", top), top)
        out[name] = {**schema, "description": f"{field_help(name, f)} (null: the checkpoint's, /v1/info decoding)"}
    return out


def phrase_schemas(settings: Settings) -> dict[str, Any]:
    """The per-sentence phrase fields of /v1/translate, one per decode.PHRASE_INPUTS entry."""
    return {p.name: {"type": ["array", "null"], "items": {
        "type": ["array", "null"], "maxItems": p.max_phrases,
        "items": {"type": "string", "minLength": 1, "maxLength": settings.max_chars}},
        "description": f"one list of target phrases (or null) per sentence of src: {p.help}; at most "
                       f"{p.max_phrases} a sentence (decoding: {' or '.join(p.strategies)})"
                       + (f"; the server's --glossary adds its terms found in the sentence ({_terms(mark)})"
                          if mark is not None else "")}
            for p in PHRASE_INPUTS for mark in [_glossary_mark(p.name)]}


def _terms(mark: str) -> str:
    return f"its target terms marked {mark!r}" if mark else "its unmarked target terms"


def _glossary_mark(name: str) -> str | None:
    """The mark (Glossary.MARKS) that makes a glossary's target term feed the phrase input `name`, if any."""
    return next((mark for mark, feeds in Glossary.MARKS.items() if feeds == name), None)


def _schemas(models: Models, settings: Settings, explorer: Any) -> dict[str, Any]:
    score = {"type": ["number", "null"], "description": "a log-probability (null: impossible, -inf)"}
    hypothesis = {"type": "object", "required": ["text", "score"], "properties": {
        "text": {"type": "string"}, "score": score, "tokens": {"type": "array", "items": {"type": "string"}},
        "alignment": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                                                 "maxItems": 2}}}}
    sources = list(dict.fromkeys(s for s, _ in models.pairs()))
    targets = list(dict.fromkeys(t for s in models.codes() for t in models.reachable(s)))
    language = {"type": ["string", "null"], "enum": [*models.codes(), None],
                "description": "a language of this server (GET /languages); a server of one one-pair model needs "
                               "neither source nor target"}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "TranslateRequest": {
            "type": "object", "required": ["src"], "additionalProperties": False, "properties": {
                "src": _sentences(settings, "the sentences to translate"),
                "prefix": {"type": ["array", "null"], "items": {"type": ["string", "null"],
                                                                "maxLength": settings.max_chars},
                           "description": "one target prefix (or null) per sentence of src"},
                "source": language, "target": language,
                "alignment": {"type": "boolean"},
                **phrase_schemas(settings), **decoding_schemas(settings),
                "timeout": _timeout(settings)}},
        "Hypothesis": hypothesis,
        "TranslateAnswer": {"type": "object", "required": ["translations"], "properties": {
            "translations": {"type": "array", "items": {
                "type": "object", "required": ["text", "score"], "properties": {
                    **hypothesis["properties"], "source_tokens": {"type": "array", "items": {"type": "string"}},
                    "hypotheses": {"type": "array", "items": _ref("Hypothesis")}}}},
            "decoding": {"type": "object", "description": "the decoding used: DecodeConfig's per-call fields "
                                                          "(the checkpoint's where the request left them out)"}}},
        "ScoreRequest": {
            "type": "object", "required": ["src", "tgt"], "additionalProperties": False, "properties": {
                "src": _sentences(settings, "the sources (not empty)"),
                "tgt": _sentences(settings, "one target per source (may be empty)"),
                "timeout": _timeout(settings)}},
        "ScoreAnswer": {"type": "object", "required": ["scores"], "properties": {"scores": {"type": "array", "items": {
            "type": "object", "required": ["log_prob", "tokens", "token_log_probs"], "properties": {
                "log_prob": score, "tokens": {"type": "array", "items": {"type": "string"}},
                "token_log_probs": {"type": "array", "items": score}}}}}},
        "LibreRequest": {
            "type": "object", "required": ["q", "source", "target"], "additionalProperties": False, "properties": {
                "q": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}],
                      "description": "a text or a list of texts, split into sentences (a line break ends one); "
                                     f"at most {settings.max_sentences} sentences in all"},
                "source": {"type": "string", "enum": [*sources, "auto"]},
                "target": {"type": "string", "enum": targets},
                "format": {"type": ["string", "null"], "enum": ["text", "html", "", None],
                           "description": "html: the markup is kept, inline tags follow their words"},
                "api_key": {"type": ["string", "null"]},
                "alternatives": {"type": ["integer", "null"], "minimum": 0, "maximum": settings.max_nbest - 1}}},
        "LibreForm": {  # a form's values are text
            "type": "object", "required": ["q", "source", "target"], "additionalProperties": False, "properties": {
                "q": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}],
                      "description": "a text; repeated, a list of texts"},
                "source": {"type": "string", "enum": [*sources, "auto"]},
                "target": {"type": "string", "enum": targets},
                "format": {"type": "string", "enum": ["text", "html", ""]},
                "api_key": {"type": "string"},
                "alternatives": {"type": "string", "enum": [""] + [str(i) for i in range(settings.max_nbest)]}}},
        "LibreAnswer": {"type": "object", "required": ["translatedText"], "properties": {
            "translatedText": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "alternatives": {"type": "array"},
            "detectedLanguage": {"oneOf": [_ref("Detection"), {"type": "array", "items": _ref("Detection")}],
                                 "description": "source auto: each text's language"},
            "pivot": {"type": "string", "description": "the language a pair no model covers went through"}}},
        "Detection": {"type": "object", "required": ["confidence", "language"], "properties": {
            "confidence": {"type": "number", "minimum": 0, "maximum": 100}, "language": {"type": "string"}}},
        "DetectRequest": {"type": "object", "required": ["q"], "additionalProperties": False, "properties": {
            "q": {"type": "string", "minLength": 1, "description": "a text whose language to detect"},
            "api_key": {"type": ["string", "null"]}}},
        "DetectForm": {"type": "object", "required": ["q"], "additionalProperties": False, "properties": {
            "q": {"type": "string", "minLength": 1}, "api_key": {"type": "string"}}},
        "Detections": {"type": "array", "items": _ref("Detection"),
                       "description": "the server's languages, likeliest first"},
        "Languages": {"type": "array", "items": {"type": "object", "required": ["code", "name", "targets"],
                                                 "properties": {"code": {"type": "string"}, "name": {"type": "string"},
                                                                "targets": {"type": "array",
                                                                            "items": {"type": "string"}}}}},
        "ExplorerRequest": {
            "type": "object", "required": ["text"], "additionalProperties": False, "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": explorer.max_chars,
                         "description": "one sentence (not blank)"},
                "beam": {"type": "integer", "minimum": 1, "maximum": explorer.max_beam},
                "nbest": {"type": "integer", "minimum": 1, "maximum": explorer.max_nbest},
                "target": {"type": ["string", "null"], "minLength": 1, "maxLength": explorer.max_chars,
                           "description": "a translation to force (not blank), or null"}}},
        "Object": {"type": "object"},
    }


def _post(summary: str, request: str, answer: str, *codes: int, form: str | None = None) -> dict[str, Any]:
    content = _json(_ref(request))
    if form:
        content["application/x-www-form-urlencoded"] = {"schema": _ref(form)}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": content},
                     "responses": {"200": {"description": "the answer", "content": _json(_ref(answer))},
                                   **_errors(*sorted(set(ALWAYS + (413, 415) + codes)))}}}


def _get(summary: str, answer: dict[str, Any], public: bool = False) -> dict[str, Any]:
    codes = (400, 403, 408, 503) if public else ALWAYS
    out = {"summary": summary, "responses": {"200": {"description": "the answer", "content": answer},
                                             **_errors(*codes)}}
    if public:
        out["security"] = []  # answered without the API key
    return {"get": out}


def openapi(models: Models, settings: Settings, explorer: Any) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server over `models` (tformer.serve.models) with `settings`; `explorer`: the
    explorer's Limits (tformer.explore)."""
    paths = {
        "/v1/translate": _post("translate sentences", "TranslateRequest", "TranslateAnswer", 504),
        "/v1/score": _post("score target sentences given their sources (forced decoding)", "ScoreRequest",
                           "ScoreAnswer", 504),
        "/v1/health": _get("liveness and the queue (no API key needed)", _json(_ref("Object")), public=True),
        "/v1/info": _get("the model, its decoding defaults, the limits, the batching", _json(_ref("Object"))),
        "/translate": _post("LibreTranslate's translate", "LibreRequest", "LibreAnswer", 504, form="LibreForm"),
        "/languages": _get("LibreTranslate's language list (no API key needed)", _json(_ref("Languages")),
                           public=True),
        "/detect": _post("LibreTranslate's language detection, among this server's languages", "DetectRequest",
                         "Detections", form="DetectForm"),
        "/": _get("the explorer page", {"text/html": {"schema": {"type": "string"}}}),
        "/api/info": _get("the explorer's model description", _json(_ref("Object"))),
        "/api/translate": _post("the explorer's translation with attention maps", "ExplorerRequest", "Object", 504),
        "/openapi.json": _get("this document (no API key needed)", _json(_ref("Object")), public=True),
        "/frontend/settings": _get("what LibreTranslate's web client reads (no API key needed)", _json(_ref("Object")),
                                   public=True),
        "/docs": _get("this document as an interactive page (Swagger UI, served offline)",
                      {"text/html": {"schema": {"type": "string"}}}),
    }
    security = [{"bearer": []}, {"apiKey": []}] if settings.api_key is not None else []
    return {
        "openapi": "3.1.0",
        "info": {"title": "tformer serve", "version": VERSION,
                 "description": f"Translation {models.listed()} with "
                                f"{', '.join(str(m.translator.path) for m in models)}: tformer's "
                                "own JSON API, LibreTranslate's API and the explorer. Errors are "
                                '{"error": message}, the message naming the field or limit and what to do.'},
        "paths": paths,
        "components": {"schemas": _schemas(models, settings, explorer),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}},
        "security": security,
    }
