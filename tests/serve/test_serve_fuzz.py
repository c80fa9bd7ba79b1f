"""The HTTP surface fuzzed from the service's own description (GET /openapi.json) with schemathesis: inputs that
fit the schema and inputs that break it, on every route, against a live server on 127.0.0.1. For every input:
no 500; the status is one the document lists, with the content type it lists; an answer fits its schema;
schema-breaking input is refused with a 4xx; and every 4xx's message names the field (or the part of the
request) that is wrong. Limits are small so that the generated inputs reach them. Derandomized (the
`ci` profile's habit): the same cases every run; HYPOTHESIS_PROFILE=long draws more.

The description itself is not its own judge: a hand-written table of the documented API (ROUTES: paths,
methods, required and optional fields, answers' keys, statuses) is checked against both the description and
the live server, so a route or a field lost from both at once still fails.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing

import pytest
import schemathesis
from helpers.profiles import SCALE
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.config._checks import NegativeDataRejectionConfig
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)
from helpers.serve import CHECKPOINT, call, live

import tformer
from tformer.config import DecodeConfig
from tformer.decode import PHRASE_INPUTS
from tformer.explore import Limits
from tformer.serve import Settings
from tformer.serve.models import Models
from tformer.serve.openapi import openapi

LIMITS = dict(max_sentences=4, max_chars=60, max_tokens=256, max_beam=4, max_nbest=3, max_body=4096, timeout=20)
# what a 4xx message may name when no single field is wrong: the body, its type, the HTTP method or route
WHOLE = ("the request body", "the request must be", "Content-Type", "content-type", "post JSON", "no such endpoint",
         "does not take", "unknown field", "the form")


TRANSLATOR = tformer.load(CHECKPOINT, device="cpu")
SETTINGS = Settings(**LIMITS)
schema = schemathesis.openapi.from_dict(openapi(Models({"model": TRANSLATOR}, SETTINGS), SETTINGS,
                                                Limits.of(SETTINGS)))
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], deterministic=True)
schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])  # coverage: each bound, one at a time
# a schema-breaking input is refused by a 4xx: 413 for a body over --max-body counts as refused too
schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
    expected_statuses=[400, 401, 403, 404, 405, 408, 413, 415])


@pytest.fixture(scope="module")
def url():
    with live(TRANSLATOR, **LIMITS) as (_, url):
        yield url


# ------------------------------------------------------------------------------------------ the oracle
# The API as its documentation states it (tformer/serve/__init__.py, tformer/serve/libretranslate.py,
# tformer/explore.py, docs/howto/serve.md), written out by hand: every route and method, each POST's required
# and optional body fields, the keys of each answer, and the statuses a route may answer. Both the description
# the fuzzing reads (openapi()) and the live server are held to it, so a route or a field lost from both at once
# is still caught.

POST_CODES = {200, 400, 401, 403, 408, 413, 415, 503, 504}  # 413 over --max-body, 415 Content-Type, 504 timeout
GET_CODES = {200, 400, 401, 403, 408, 503}
PUBLIC_CODES = GET_CODES - {401}  # "no API key needed": /v1/health, /languages, /openapi.json

# path -> (method, required body fields, optional body fields, an example body (all the required fields),
#          keys every answer has, statuses)
ROUTES = {
    "/v1/translate": ("post", {"src"}, {"source", "target", "beam", "nbest", "prefix", "alignment", "constraints",
                                        "avoid", "repetition_penalty",
                                        "timeout", "strategy", "len_penalty", "len_penalty_rule", "min_len",
                                        "max_len_a", "max_len_b", "no_repeat_ngram", "temperature", "top_k",
                                        "top_p", "seed", "beam_finish", "unk_penalty"},
                      {"src": ["a b c"]}, {"translations", "decoding"}, POST_CODES),
    "/v1/score": ("post", {"src", "tgt"}, {"timeout"}, {"src": ["a b c"], "tgt": ["a b c"]}, {"scores"}, POST_CODES),
    "/v1/health": ("get", set(), set(), None, {"status", "pending_sentences", "uptime_seconds"}, PUBLIC_CODES),
    "/v1/info": ("get", set(), set(), None, {"languages", "model", "vocab", "decode", "decoding", "limits"}, GET_CODES),
    "/translate": ("post", {"q", "source", "target"}, {"format", "api_key", "alternatives"},
                   {"q": "a b c", "source": "en", "target": "de"}, {"translatedText"}, POST_CODES),
    "/languages": ("get", set(), set(), None, None, PUBLIC_CODES),
    "/detect": ("post", {"q"}, {"api_key"}, {"q": "a b c"}, None, POST_CODES - {504}),  # no model: no timeout
    "/": ("get", set(), set(), None, None, GET_CODES),
    "/api/info": ("get", set(), set(), None, set(), GET_CODES),
    "/api/translate": ("post", {"text"}, {"beam", "nbest", "target"}, {"text": "a b c"}, {"source", "hypotheses"},
                       POST_CODES),
    "/openapi.json": ("get", set(), set(), None, {"openapi", "paths", "components"}, PUBLIC_CODES),
    "/frontend/settings": ("get", set(), set(), None, {"charLimit", "language", "keyRequired"}, PUBLIC_CODES),
    "/docs": ("get", set(), set(), None, None, GET_CODES),
}
LANGUAGES = [{"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", "name": "German", "targets": []}]


def _request_schemas(document: dict, path: str, method: str) -> dict[str, dict]:
    """media type -> the (resolved) schema of the body a route reads, in an OpenAPI document."""
    content = document["paths"][path][method].get("requestBody", {}).get("content", {})
    schemas = document["components"]["schemas"]
    return {media: schemas[m["schema"]["$ref"].rsplit("/", 1)[-1]] for media, m in content.items()}


def _matches_the_oracle(document: dict) -> None:
    assert document["openapi"].startswith("3.1")
    assert {p: set(ops) for p, ops in document["paths"].items()} == {p: {r[0]} for p, r in ROUTES.items()}
    for path, (method, required, optional, _, _, codes) in ROUTES.items():
        op = document["paths"][path][method]
        assert set(op["responses"]) == {str(c) for c in codes}, path
        assert all("application/json" in op["responses"][str(c)]["content"] for c in codes - {200}), path
        bodies = _request_schemas(document, path, method)
        forms = {"application/x-www-form-urlencoded"} if path in ("/translate", "/detect") else set()
        want = {"application/json"} | forms
        assert set(bodies) == (want if method == "post" else set()), path
        for media, body in bodies.items():
            assert set(body["required"]) == required, (path, media)
            assert set(body["properties"]) == required | optional, (path, media)
            assert body["additionalProperties"] is False, (path, media)
    sizes = document["components"]["schemas"]["TranslateRequest"]["properties"]["src"]
    assert sizes["maxItems"] == LIMITS["max_sentences"] and sizes["items"]["maxLength"] == LIMITS["max_chars"]


def test_the_description_the_fuzzing_reads_is_the_documented_api():
    _matches_the_oracle(schema.raw_schema)


def test_the_decoding_fields_are_the_configs_per_call_fields_with_their_bounds():
    """/v1/translate's decoding fields are DecodeConfig's fields whose metadata says a call may set them (beam:
    beam_size's short name), each with the config's bounds (capped by the server's --max-beam, --max-nbest,
    --max-tokens) or its choices; its phrase fields are decode.PHRASE_INPUTS, with their most phrases."""
    props = schema.raw_schema["components"]["schemas"]["TranslateRequest"]["properties"]
    per_call = {"beam" if f.name == "beam_size" else f.name: f for f in dataclasses.fields(DecodeConfig)
                if f.metadata.get("per_call")}
    assert set(props) == ({"src", "source", "target", "prefix", "alignment", "timeout"} | set(per_call)
                          | {p.name for p in PHRASE_INPUTS})
    assert {"strategy", "beam", "nbest", "len_penalty", "repetition_penalty", "top_p", "seed"} <= set(per_call)
    assert not {"quantize", "precision", "shortlist", "batch_size", "batch_tokens"} & set(props)
    caps = {"beam": LIMITS["max_beam"], "nbest": LIMITS["max_nbest"], "min_len": LIMITS["max_tokens"],
            "max_len_b": LIMITS["max_tokens"]}
    hints = typing.get_type_hints(DecodeConfig)
    for name, f in per_call.items():
        got, bounds = props[name], f.metadata["bounds"]
        if typing.get_origin(hints[f.name]) is typing.Literal:
            assert got["enum"] == [*typing.get_args(hints[f.name]), None], name
            continue
        low = "exclusiveMinimum" if bounds.open_low else "minimum"
        assert got.get(low) == bounds.low, name
        high = min(x for x in (bounds.high, caps.get(name)) if x is not None) if bounds.high or name in caps else None
        assert got.get("maximum") == high, name
        assert got["type"] == ["integer" if hints[f.name] is int else "number", "null"], name
    assert props["top_p"] == {**props["top_p"], "exclusiveMinimum": 0, "maximum": 1}  # one spelled out
    for p in PHRASE_INPUTS:
        assert props[p.name]["items"]["maxItems"] == p.max_phrases and p.help in props[p.name]["description"]


def test_the_server_serves_the_documented_api(url):
    status, served, headers = call(url, "/openapi.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    _matches_the_oracle(served)
    for path, (method, required, _, example, keys, _) in ROUTES.items():
        status, out, headers = call(url, path, example)
        assert status == 200, (path, status, out)
        if keys is not None:
            assert isinstance(out, dict) and keys <= set(out), (path, out)
        for missing in sorted(required):  # each required field, left out: a 400 naming it
            body = {k: v for k, v in example.items() if k != missing}
            status, out, _ = call(url, path, body)
            assert status == 400 and missing in out["error"], (path, missing, status, out)
        if method == "post":
            status, out, _ = call(url, path, {**example, "zzz": 1})
            assert status == 400 and "zzz" in out["error"], (path, status, out)
            status, out, _ = call(url, path, method="GET")
            assert status == 405 and "error" in out, (path, status, out)
            assert call(url, path, raw=b"x" * (LIMITS["max_body"] + 1))[0] == 413, path
            if path != "/translate":  # LibreTranslate's takes a form as well
                assert call(url, path, raw=b"hi", content_type="text/plain")[0] == 415, path
        else:
            status, out, _ = call(url, path, method="DELETE")
            assert status == 405 and "error" in out, (path, status, out)
    assert call(url, "/languages")[1] == LANGUAGES
    assert call(url, "/v1/health")[1]["status"] == "ok"
    status, _, headers = call(url, "/", method="GET")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    status, out, _ = call(url, "/translate", raw=b"q=a+b+c&source=en&target=de",
                          content_type="application/x-www-form-urlencoded")
    assert status == 200 and isinstance(out["translatedText"], str)
    status, out, _ = call(url, "/v1/nope")
    assert status == 404 and "error" in out


def _fields(case) -> set[str]:
    body = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    fields = set()
    for media in body.values():
        ref = media["schema"].get("$ref", "")
        props = case.operation.schema.raw_schema["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
        fields |= set(props.get("properties", {}))
    return fields


def no_500(ctx, response, case) -> None:
    """No internal error: the 5xx answers are 503 (busy) and 504 (past the request's time limit), documented."""
    assert response.status_code in (503, 504) or response.status_code < 500, response.content


def names_the_field(ctx, response, case) -> None:
    """A 4xx answer is {"error": message}, and the message names a field of the route's body, or the whole."""
    if not 400 <= response.status_code < 500:
        return
    message = json.loads(response.content)["error"]
    named = [f for f in _fields(case) if re.search(rf"(^|[^\w]){re.escape(f)}($|[^\w])", message)]
    assert named or any(w in message for w in WHOLE), f"{response.status_code} names no field: {message!r}"


def _consistent(case) -> None:
    """Bring a generated body in line with what the schema cannot say (one prefix and one constraint list per
    source, nbest <= beam), where that leaves the case as valid or invalid as it was: else most cases would stop
    at those rules. A prefix or constraints list is padded with nulls (valid items) to the length of src; a
    valid case is also cut to it and gets an nbest its beam allows."""
    body = case.body
    if not isinstance(body, dict):
        return
    src = body.get("src")
    for name in ("prefix", "constraints"):
        given = body.get(name)
        if isinstance(src, list) and isinstance(given, list) and len(given) < len(src):
            given.extend([None] * (len(src) - len(given)))
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    for name in ("prefix", "constraints"):
        if isinstance(src, list) and isinstance(body.get(name), list):
            del body[name][len(src):]
    beam, nbest = body.get("beam"), body.get("nbest")
    most = beam if isinstance(beam, int) else 1  # no beam: the checkpoint's greedy search
    if isinstance(nbest, int) and nbest > most:
        body["nbest"] = most


@schema.parametrize()
@settings(max_examples=200 * SCALE, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_route_answers_every_input_as_its_description_says(case, url):
    _consistent(case)
    case.call_and_validate(base_url=url, checks=[no_500, status_code_conformance, content_type_conformance,
                                   response_schema_conformance, negative_data_rejection],
                           additional_checks=[names_the_field], timeout=60)
