"""Translation requests made into plans (tformer.plan), in one place for every route that translates: the
decoding fields a request may set and the per-sentence phrase fields, both generated from the library's own
declarations, and the plan checked against the server's limits.

    decoding_fields()           request name -> DecodeConfig field: the fields whose metadata says per_call
                                (config_checks.option), `beam` and `nbest` by the short names clients use
    decoding_options(body, settings)        the decoding fields a body gives, typed, as Translator.prepare's keywords
    phrase_options(body, sources, settings) the phrase inputs (decode.PHRASE_INPUTS) a body gives, with the
                                            server's --glossary terms added to the input the glossary feeds
    make_plan(translator, settings, sources, where, **options)   Translator.prepare, then the server's limits
    translate_request(body, translator, settings)  -> TranslateRequest (a /v1/translate body)

A DecodeConfig field with per_call metadata, or a new PhraseInput, is a /v1/translate field (and an entry of
/openapi.json, tformer.serve.openapi) with no change here. Bounds are the config's own (its __post_init__
checks them inside prepare); the server adds only its limits (Settings: --max-beam, --max-nbest, --max-tokens).
Every refusal is a RequestError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal

from tformer.api import Translator
from tformer.config import DecodeConfig, request_fields
from tformer.decode.phrases import PHRASE_INPUTS
from tformer.errors import TformerError
from tformer.plan import PHRASE_NAMES, Plan
from tformer.serve.models import Leg, Models, Routed
from tformer.serve.requests import (RequestError, Settings, check_object, check_text, flag, flag_field, json_kind,
                                    sentences, time_limit)

# What clients call a DecodeConfig field, and what the short name means (Translator.translate's keywords).
SHORT_NAMES = {"beam_size": ("beam", "1: greedy search; N >= 2: beam search keeping N hypotheses (strategy beam)")}
# The server's own caps on decoding fields (Settings names): a request may ask for no more.
CAPS = {"beam": "max_beam", "nbest": "max_nbest", "min_len": "max_tokens", "max_len_b": "max_tokens"}
LENGTHS = ("min_len", "max_len_a", "max_len_b")  # set by a request: its outputs' limit is at most --max-tokens
Where = Callable[[str, int], str]  # (what: 'sources', 'prefix' or a phrase input, index) -> its name in a message


def decoding_fields() -> dict[str, dataclasses.Field]:
    """The decoding fields a request may set, by the name it gives them: DecodeConfig's per-call fields."""
    return {SHORT_NAMES.get(name, (name,))[0]: f for name, f in request_fields(DecodeConfig).items()}


def field_help(name: str, f: dataclasses.Field) -> str:
    short = SHORT_NAMES.get(f.name)
    return short[1] if short is not None and short[0] == name else f.metadata["help"]


def cap(name: str, settings: Settings) -> int | None:
    """The server's most for decoding field `name` (None: only the config's bounds)."""
    return getattr(settings, CAPS[name]) if name in CAPS else None


def decoding_options(body: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The decoding fields `body` gives (null: the checkpoint's), each of its field's type and within the
    server's caps; the config checks its own bounds when the plan is made."""
    hints = typing.get_type_hints(DecodeConfig)
    out = {}
    for name, f in decoding_fields().items():
        value = body.get(name)
        if value is None:
            continue
        tp = hints[f.name]
        if typing.get_origin(tp) is Literal:
            choices = typing.get_args(tp)
            if value not in choices:
                raise RequestError(f"{name}: must be one of {', '.join(map(repr, choices))}, got {value!r}")
        elif tp is int or tp is float:
            number = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
            if isinstance(value, bool) or not number or (tp is int and not isinstance(value, int)):
                raise RequestError(f"{name}: must be {'a whole number' if tp is int else 'a number'}, got "
                                   f"{json_kind(value)} {value!r}")
            top, low = cap(name, settings), f.metadata["bounds"].low
            if top is not None and (value > top or (low is not None and value < low)):
                raise RequestError(f"{name}: must be a whole number from {low} to {top} ({flag(CAPS[name])}), "
                                   f"got {value!r}")
        out[name] = value
    return out


def phrase_options(body: dict[str, Any], sources: list[str], settings: Settings, target: str | None = None
                   ) -> dict[str, list | None]:
    """The phrase inputs `body` gives (decode.PHRASE_INPUTS: one list of target phrases, or null, per source),
    their texts within --max-chars, and the server's glossary terms found in each source added to the inputs
    they feed (Glossary.phrases). An input no sentence uses is left out."""
    out: dict[str, list | None] = {}
    for phrase in PHRASE_INPUTS:
        value = body.get(phrase.name)
        if value is None:
            continue
        per_source(value, phrase.name, len(sources), "one list of target phrases (or null)")
        for i, phrases in enumerate(value):
            if phrases is not None and not isinstance(phrases, list):
                raise RequestError(f"{phrase.name}[{i}]: must be a list of target phrases or null, got "
                                   f"{json_kind(phrases)}")
            for j, text in enumerate(phrases or ()):
                check_text(text, f"{phrase.name}[{i}][{j}]", settings)
        out[phrase.name] = value
    return with_glossary(out, sources, settings, target)


def with_glossary(phrases: dict[str, list | None], sources: list[str], settings: Settings,
                  target: str | None = None) -> dict[str, list | None]:
    """`phrases` with the glossary's terms (the one for translations into `target`: Settings.glossary_for) found
    in each source added to the inputs they feed (the phrases given first)."""
    glossary = settings.glossary_for(target)
    if glossary is None:
        return phrases
    found = [glossary.phrases(s) for s in sources]
    out = dict(phrases)
    for name in glossary.inputs:
        given = phrases.get(name) or [None] * len(sources)
        merged = [list(g or ()) + [t for t in f.get(name, ()) if t not in (g or ())] for g, f in zip(given, found)]
        if any(merged):
            out[name] = merged
    return out


def per_source(value: Any, name: str, n: int, entry: str) -> None:
    """A field that holds one `entry` per sentence of src (n), as a list."""
    if not isinstance(value, list) or len(value) != n:
        raise RequestError(f"{name}: must be a list with {entry} per sentence of src ({n}), got {json_kind(value)}"
                           + (f" of {len(value)}" if isinstance(value, list) else ""))


# ------------------------------------------------------------------------------------------ the plan


def make_plan(translator: Translator, settings: Settings, sources: list[str], where: Where,
              given: dict[str, Any] | None = None, **options: Any) -> Plan:
    """`translator.prepare(sources, **options)` in the server's batches (--batch-tokens padded tokens), checked
    against the server's limits; `given`: the decoding fields the request set. A refusal of either is a
    RequestError naming the field as the request does (`where`)."""
    try:
        plan = translator.prepare(sources, batch_size=settings.batch_tokens, batch_type="tokens", **options)
    except TformerError as e:
        raise refusal(e, where, settings, sources) from None
    check_plan(plan, settings, given or {}, where)
    return plan


def refusal(e: TformerError, where: Where, settings: Settings, sources: list[str]) -> RequestError:
    """The library's refusal with the field named as the request names it: a DecodeConfig field by its request
    name, a list entry ('sources[2]', 'constraints[0][1]') by `where`."""
    text = str(e)
    m = re.match(r"config key 'decode\.(\w+)': ", text)
    if m:
        return RequestError(f"{SHORT_NAMES.get(m[1], (m[1],))[0]}: {text[m.end():]}")
    m = re.match(r"(\w+)\[(\d+)\]", text)
    if m:
        text = where(m[1], int(m[2])) + text[m.end():]
    for glossary in (settings.glossary, *settings.glossaries.values()):
        if (glossary is not None and any(name in text for name in glossary.inputs)
                and any(map(glossary.phrases, sources))):
            text += " (the server's --glossary adds its terms found in the sentences)"
            break
    return RequestError(text)


def check_plan(plan: Plan, settings: Settings, given: dict[str, Any], where: Where) -> None:
    """The server's limits on a plan: pieces of each source, prefix and phrase (--max-tokens) and, where the
    request sets a length field, each output's limit (--max-tokens). (A beam and n-best a request sets are
    capped by decoding_options; the checkpoint's own are the operator's choice.)"""
    top = settings.max_tokens
    texts = [("sources", "source", plan.sources)]
    if plan.prefixes is not None:
        texts.append(("prefix", "target", plan.prefixes))
    for what, side, per in texts:
        for i, ids in enumerate(per):
            if ids is not None and len(ids) > top:
                raise RequestError(f"{where(what, i)}: {len(ids)} {side} pieces; the limit is {top} (--max-tokens): "
                                   "split it into shorter sentences")
    for name, per in plan.phrases.items():
        for i, phrases in enumerate(per):
            for j, ids in enumerate(phrases or ()):
                if len(ids) > top:
                    raise RequestError(f"{where(name, i)}[{j}]: {len(ids)} target pieces; the limit is {top} "
                                       "(--max-tokens)")
    cfg = plan.decoding.cfg
    lengths = [name for name in LENGTHS if name in given]
    if lengths:
        for i, width in enumerate(plan.widths):
            limit = max(cfg.min_len, cfg.max_len_a * width + cfg.max_len_b)  # a float: maybe past any int
            if limit >= top + 1:
                raise RequestError(f"{', '.join(lengths)}: outputs of up to {limit:.0f} pieces for "
                                   f"{where('sources', i)} (max_len_a * {width} + max_len_b, min_len); this server "
                                   f"writes at most {top} (--max-tokens)")


def decoding_json(cfg: DecodeConfig) -> dict[str, Any]:
    """Which decoding an answer used: the per-call DecodeConfig fields, by their config names."""
    return {name: getattr(cfg, name) for name in request_fields(DecodeConfig)}


# ------------------------------------------------------------------------------------------ /v1/translate


@dataclass(frozen=True)
class TranslateRequest:
    """A /v1/translate request: its plan (which the batcher groups by plan.key and the model thread runs) and
    how long it may wait."""

    plan: Plan
    timeout: float  # seconds it may wait for its answer

    @property
    def nbest(self) -> bool:
        return self.plan.decoding.cfg.nbest > 1

    @property
    def alignment(self) -> bool:
        return self.plan.decoding.extras.alignment


def translate_fields() -> tuple[str, ...]:
    return ("src", "source", "target", "prefix", *(p.name for p in PHRASE_INPUTS), "alignment", *decoding_fields(),
            "timeout")


def v1_where(what: str, i: int) -> str:
    return f"{'src' if what == 'sources' else what}[{i}]"


def translate_request(body: Any, models: Models, settings: Settings) -> Routed:
    """A /v1/translate body, checked (see tformer.serve), as the plan of its route's first leg (Models.route:
    `source` and `target`, which a server of one one-pair model does not need)."""
    body = check_object(body, translate_fields(), '{"src": ["A dog runs ."], "beam": 5}')
    route = models.route(body.get("source"), body.get("target"))
    sources = sentences(body.get("src"), "src", settings)
    prefixes = body.get("prefix")
    if prefixes is not None:
        per_source(prefixes, "prefix", len(sources), "one string (or null)")
        for i, p in enumerate(prefixes):
            if p is not None:
                check_text(p, f"prefix[{i}]", settings)
    alignment = flag_field(body, "alignment")
    given = decoding_options(body, settings)
    phrases = phrase_options(body, sources, settings, route.legs[0].target) if not route.pivot else {}  # the
    # glossary: direct routes only
    if route.pivot and (prefixes is not None or alignment or any(body.get(p.name) for p in PHRASE_INPUTS)):
        raise RequestError(f"prefix, alignment and {', '.join(PHRASE_NAMES)} ask one model for its translation; no "
                           f"model here translates {route.legs[0].source} -> {route.legs[-1].target} directly (this "
                           f"route goes through {route.pivot})")
    timeout = time_limit(body, settings)
    first = {k: v for k, v in given.items() if k != "nbest"} if route.pivot else given  # a pivot: its best only
    leg = route.legs[0]
    plan = make_plan(leg.model.translator, settings, sources, v1_where, first, prefix=prefixes, alignment=alignment,
                     **phrases, **first, **leg.options)

    def next_leg(leg: Leg, texts: list[str]) -> TranslateRequest:
        return TranslateRequest(make_plan(leg.model.translator, settings, texts, v1_where, given, **given,
                                          **leg.options), timeout)

    return Routed(route, TranslateRequest(plan, timeout), next_leg)
