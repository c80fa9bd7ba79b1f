"""The HTTP surface fuzzed from the service's own description (GET /openapi.json) with schemathesis: inputs that
fit the schema and inputs that break it, on every route, against a live server on 127.0.0.1. For every input:
no 500; the status is one the document lists, with the content type it lists; an answer fits its schema;
schema-breaking input is refused with a 4xx; and every 4xx's message names the field (or the part of the
request) that is wrong. Limits are small so that the generated inputs reach them. Derandomized (the
`ci` profile's habit): the same cases every run; HYPOTHESIS_PROFILE=long draws more.
"""

from __future__ import annotations

import json
import re

import pytest
import schemathesis
from conftest import SCALE
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.config._checks import NegativeDataRejectionConfig
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)
from test_serve import CHECKPOINT, call, live

import tformer
from tformer.explore import Limits
from tformer.serve import Settings
from tformer.serve.openapi import openapi

LIMITS = dict(max_sentences=4, max_chars=60, max_tokens=256, max_beam=4, max_nbest=3, max_body=4096, timeout=20)
# what a 4xx message may name when no single field is wrong: the body, its type, the HTTP method or route
WHOLE = ("the request body", "the request must be", "Content-Type", "content-type", "post JSON", "no such endpoint",
         "does not take", "unknown field", "the form")


TRANSLATOR = tformer.load(CHECKPOINT, device="cpu")
SETTINGS = Settings(**LIMITS)
schema = schemathesis.openapi.from_dict(openapi(TRANSLATOR, SETTINGS, Limits.of(SETTINGS)))
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], deterministic=True)
schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])  # coverage: each bound, one at a time
# a schema-breaking input is refused by a 4xx: 413 for a body over --max-body counts as refused too
schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
    expected_statuses=[400, 401, 403, 404, 405, 408, 413, 415])


@pytest.fixture(scope="module")
def url():
    with live(TRANSLATOR, **LIMITS) as (_, url):
        yield url


def test_the_server_serves_the_description_the_fuzzing_reads(url):
    status, served, headers = call(url, "/openapi.json")
    assert status == 200 and served == schema.raw_schema and headers["Content-Type"] == "application/json"
    assert served["components"]["schemas"]["TranslateRequest"]["properties"]["src"]["maxItems"] == 4


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
    """Bring a generated body in line with what the schema cannot say (one prefix per source, nbest <= beam),
    where that leaves the case as valid or invalid as it was: else most cases would stop at those rules. A
    prefix list is padded with nulls (valid items) to the length of src; a valid case is also cut to it and
    gets an nbest its beam allows."""
    body = case.body
    if not isinstance(body, dict):
        return
    src, prefix = body.get("src"), body.get("prefix")
    if isinstance(src, list) and isinstance(prefix, list) and len(prefix) < len(src):
        prefix.extend([None] * (len(src) - len(prefix)))
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    if isinstance(src, list) and isinstance(prefix, list):
        del prefix[len(src):]
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
