"""What a request may ask of the server, and reading it: the limits (Settings), request bodies (JSON or a form)
read within a byte limit, the common fields checked one by one, and /v1/score's request. Nothing here runs the
model; every refusal is a RequestError naming the field and the limit. Translation requests become plans in
tformer.serve.plans.

    read_body(request, settings)           -> bytes: 413 from the Content-Length alone, 408 past body_timeout
    parse_json(body) / parse_form(body)    -> the value, or 400 naming what is wrong
    score_request(body, translator, settings)      -> ScoreRequest
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Mapping

from starlette.requests import Request

from tformer.api import Translator
from tformer.documents.glossary import Glossary
from tformer.errors import ConfigError, TformerError
from tformer.languages import LANGUAGE
from tformer.inference import warm_up_sizes

SCORE_FIELDS = ("src", "tgt", "timeout")


class RequestError(TformerError):
    """A request the server refuses: `status` is its HTTP status (4xx, or 503 when busy), the message says
    which field or limit and what to do."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = int(status)


@dataclass(frozen=True)
class Settings:
    """What one server accepts and how it batches. Each limit is refused with a status naming it."""

    max_sentences: int = 64  # sentences in one request
    max_chars: int = 1000  # characters of one sentence, prefix or target
    max_tokens: int = 256  # pieces of one sentence, prefix or target
    max_beam: int = 16
    max_nbest: int = 8
    max_body: int = 1 << 20  # bytes of one request body: more is refused (413) before it is read
    max_queue: int = 512  # sentences waiting for (or in) the model; more: 503 with Retry-After at once
    timeout: float = 60.0  # seconds a request may wait for its answer: then 504, and its work leaves the model
    header_timeout: float = 10.0  # seconds to send a request line and headers (from connecting or the last answer)
    body_timeout: float = 30.0  # seconds to send a request body once its headers are in: then 408
    max_wait_ms: float = 5.0  # how long the model worker waits for more requests to fill a batch
    batch_tokens: int = 4096  # padded source tokens (sentences x longest) in one model call
    max_connections: int = 256  # open connections; the next one is answered 503
    warm_up: int = 64  # before serving, decode made-up batches of 1, 2, 4, .. up to this many sentences; 0: none
    api_key: str | None = field(default=None, repr=False)  # needed on every route but /v1/health, /languages
    glossary: Glossary | None = field(default=None, repr=False)  # terms every translation must keep (--glossary)
    pivot: str | None = None  # a language through which a pair no model covers is translated (--pivot); None: none
    glossaries: Mapping[str, Glossary] = field(default_factory=dict, repr=False)  # target language -> its own
    # glossary (--glossary LANG=FILE), instead of `glossary`, for the translations into that language

    def __post_init__(self) -> None:
        for name in ("max_sentences", "max_chars", "max_tokens", "max_beam", "max_nbest", "max_body", "max_queue",
                     "batch_tokens", "max_connections"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{flag(name)} must be a whole number >= 1, got {value!r}")
        if isinstance(self.warm_up, bool) or not isinstance(self.warm_up, int) or not 0 <= self.warm_up <= 256:
            raise ConfigError(f"{flag('warm_up')} must be a whole number of sentences from 0 to 256, got "
                              f"{self.warm_up!r}")
        for name in ("timeout", "header_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag(name)} must be a number of seconds > 0, got {value!r}")
        if not (isinstance(self.max_wait_ms, (int, float)) and 0 <= self.max_wait_ms <= 10_000):
            raise ConfigError(f"--max-wait-ms must be from 0 to 10000 milliseconds, got {self.max_wait_ms!r}")
        if self.max_queue < self.max_sentences:
            raise ConfigError(f"--max-queue ({self.max_queue}) must be at least --max-sentences "
                              f"({self.max_sentences}): a full request must fit in the queue")
        if self.pivot is not None and not (isinstance(self.pivot, str) and LANGUAGE.match(self.pivot)):
            raise ConfigError(f"--pivot must be a language code such as 'en', got {self.pivot!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("the API key (--api-key, TFORMER_API_KEY) must be a non-empty string")

    def warm_up_sizes(self) -> list[int]:
        """The batch sizes warmed before serving: 1, 2, 4, .. up to `warm_up` (and it)."""
        return warm_up_sizes(self.warm_up)

    def glossary_for(self, target: str | None) -> Glossary | None:
        """The glossary of translations into `target`: its own, else the one for every language."""
        return self.glossaries.get(target, self.glossary) if target is not None else self.glossary

    def limits(self) -> dict[str, Any]:
        """The limits and batching settings a client may read (/v1/info); never the API key."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("api_key", "glossary", "glossaries")}
        return {**out, "glossary_terms": len(self.glossary) if self.glossary is not None else 0,
                **({"glossary_terms_by_target": {k: len(g) for k, g in self.glossaries.items()}}
                   if self.glossaries else {})}


def flag(name: str) -> str:
    """The command-line flag of a Settings field: max_beam -> --max-beam."""
    return "--" + name.replace("_", "-")


# ------------------------------------------------------------------------------------------ bodies


async def read_body(request: Request, settings: Settings) -> bytes:
    """The request body, at most `settings.max_body` bytes: a larger Content-Length is refused (413) before any
    of it is read, a body without one stops being read once over the limit, and one that takes more than
    `settings.body_timeout` seconds to arrive is refused (408; the answer closes the connection)."""
    limit = settings.max_body
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise RequestError(f"Content-Length must be a number of bytes, got {declared!r}")
        if int(declared) > limit:
            raise RequestError(f"the request body has {int(declared)} bytes; a request may have at most {limit} "
                               "bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(f"the request body is longer than {limit} bytes; a request may have at most "
                                   f"{limit} bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), settings.body_timeout)
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {settings.body_timeout:g} s "
                           f"(--body-timeout); {sum(map(len, chunks))} bytes came", HTTPStatus.REQUEST_TIMEOUT
                           ) from None
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not UTF-8 JSON or text: byte {e.start} is "
                           f"{body[e.start:e.start + 1]!r}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes) -> Any:
    """A JSON body (UTF-8; no NaN or Infinity), or a 400 saying where it breaks."""
    text = _text(body)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request body is not UTF-8 JSON: {e.msg} at line {e.lineno}, column {e.colno}"
                           ) from None
    except ValueError as e:
        raise RequestError(f"the request body is not UTF-8 JSON: {e}") from None
    except RecursionError:
        raise RequestError("the request body is not UTF-8 JSON this server reads: nested too deeply") from None


def parse_form(body: bytes) -> dict[str, str | list[str]]:
    """An application/x-www-form-urlencoded body: each field's value, or the list of values of a field given
    more than once."""
    try:
        pairs = urllib.parse.parse_qsl(_text(body), keep_blank_values=True, errors="strict", max_num_fields=1000)
    except UnicodeDecodeError:
        raise RequestError("the form is not UTF-8: a %-escaped value is not a UTF-8 byte sequence") from None
    except ValueError as e:
        raise RequestError(f"the form cannot be read: {e}") from None
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + [value]
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------ fields


def check_object(body: Any, fields: tuple[str, ...], example: str) -> dict[str, Any]:
    """`body` as a JSON object with only known fields."""
    if not isinstance(body, dict):
        raise RequestError(f"the request must be a JSON object such as {example}, got {json_kind(body)}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(fields)}")
    return body


def time_limit(body: dict[str, Any], settings: Settings) -> float:
    """The request's own `timeout` in seconds (a number > 0, at most the server's --timeout), or the server's."""
    value = body.get("timeout")
    if value is None:
        return settings.timeout
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= settings.timeout:
        raise RequestError(f"timeout: must be a number of seconds > 0 and at most {settings.timeout:g} (--timeout), "
                           f"got {value!r}")
    return float(value)


def flag_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise RequestError(f"{name}: must be true or false, got {value!r}")
    return value


def sentences(value: Any, name: str, settings: Settings) -> list[str]:
    """A non-empty list of at most max_sentences strings of at most max_chars characters."""
    if value is None:
        raise RequestError(f"{name}: missing; give a list of sentences, {name}: [\"...\"]")
    if not isinstance(value, list):
        hint = f"; wrap one sentence in a list, {name}: [\"...\"]" if isinstance(value, str) else ""
        raise RequestError(f"{name}: must be a list of strings, got {json_kind(value)}{hint}")
    if not value:
        raise RequestError(f"{name}: an empty list; give at least one sentence")
    if len(value) > settings.max_sentences:
        raise RequestError(f"{name}: {len(value)} sentences; a request may have at most {settings.max_sentences} "
                           "(--max-sentences): split it into several requests")
    for i, s in enumerate(value):
        check_text(s, f"{name}[{i}]", settings)
    return value


def check_text(value: Any, where: str, settings: Settings) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{where}: must be a string, got {json_kind(value)}")
    if len(value) > settings.max_chars:
        raise RequestError(f"{where}: {len(value)} characters; the limit is {settings.max_chars} (--max-chars)")
    return value


def pieces(translator: Translator, text: str, where: str, side: str, settings: Settings) -> int:
    """The number of pieces `text` becomes, within max_tokens."""
    n = len(translator.encode(text, side))
    if n > settings.max_tokens:
        raise RequestError(f"{where}: {n} {side} pieces; the limit is {settings.max_tokens} (--max-tokens): split "
                           "it into shorter sentences")
    return n


def json_kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class ScoreRequest:
    sources: list[str]
    targets: list[str]
    widths: list[int]  # the longer side + 1 per pair
    timeout: float  # seconds it may wait for its answer


def score_request(body: Any, translator: Translator, settings: Settings) -> ScoreRequest:
    """A /v1/score body, checked: one target per source, neither side empty nor over the limits."""
    body = check_object(body, SCORE_FIELDS, '{"src": ["A dog ."], "tgt": ["Ein Hund ."]}')
    sources = sentences(body.get("src"), "src", settings)
    targets = sentences(body.get("tgt"), "tgt", settings)
    if len(sources) != len(targets):
        raise RequestError(f"tgt: {len(targets)} targets for {len(sources)} sources; give one target per source")
    widths = []
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        n = pieces(translator, src, f"src[{i}]", "source", settings)
        if n == 0:
            raise RequestError(f"src[{i}]: empty; there is nothing to score a translation against")
        widths.append(max(n, pieces(translator, tgt, f"tgt[{i}]", "target", settings)) + 1)
    return ScoreRequest(sources, targets, widths, time_limit(body, settings))
