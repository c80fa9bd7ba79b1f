"""tformer serve against oracles: every answer is what Translator.translate / score give for the same input,
alone, whatever it was batched with; LibreTranslate's own client works unchanged; every bad input gets a
clear 4xx (or 503/504) and the server goes on serving; SIGTERM answers every accepted request, then exits.

The model is the committed tests/fixtures/checkpoint_v1 (a tiny en -> "de" model with real SentencePiece
pieces and outputs of varied lengths): nothing is trained here. Servers run in-process (uvicorn in a thread,
port 0) or, for the command line and shutdown, as subprocesses.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import itertools
import json
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import tformer
from helpers.serve import CHECKPOINT, LINES, _start, _wait, call, live
from tformer.serve import Server, Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def translator():
    return tformer.load(CHECKPOINT, device="cpu")


@pytest.fixture(scope="module")
def server(translator):
    """Small limits, so that each can be tried."""
    with live(translator, max_sentences=8, max_chars=200, max_tokens=40, max_beam=6, max_nbest=4,
              max_body=16 * 1024, max_queue=64) as s:
        yield s


def expected(translator, sources, beam=None, nbest=None, prefix=None, alignment=False):
    """What /v1/translate must answer, by the library."""
    out = translator.translate(sources, beam=beam, nbest=nbest, prefix=prefix, alignment=alignment)
    return [[(h.text, h.score) for h in t.hypotheses] for t in out]


def served(answer: dict, nbest: bool) -> list[list[tuple[str, float]]]:
    return [[(h["text"], h["score"]) for h in t["hypotheses"]] if nbest else [(t["text"], t["score"])]
            for t in answer["translations"]]


def same(got, want) -> None:
    """Identical texts, scores within 1e-4."""
    assert [[text for text, _ in t] for t in got] == [[text for text, _ in t] for t in want]
    for g, w in zip(got, want):
        assert [s for _, s in g] == pytest.approx([s for _, s in w], abs=1e-4)


# ------------------------------------------------------------------------------------------ answers


@pytest.mark.parametrize("options", [{}, {"beam": 4, "nbest": 3}, {"beam": 5}])
def test_translation_is_the_translators(translator, server, options):
    _, url = server
    for start in range(0, len(LINES), 8):
        lines = LINES[start:start + 8]
        status, out, _ = call(url, "/v1/translate", {"src": lines, **options})
        assert status == 200, out
        nbest = options.get("nbest", 1) > 1
        want = expected(translator, lines, **options)
        same(served(out, nbest), want if nbest else [w[:1] for w in want])
        assert all(("hypotheses" in t) == nbest for t in out["translations"])


def test_prefixes_and_alignment_are_the_translators(translator, server):
    _, url = server
    lines, prefix = LINES[:4] + [""], ["MAN", None, "SMALL MAN", None, None]
    status, out, _ = call(url, "/v1/translate", {"src": lines, "beam": 4, "nbest": 2, "prefix": prefix,
                                                 "alignment": True})
    assert status == 200, out
    want = translator.translate(lines, beam=4, nbest=2, prefix=prefix, alignment=True)
    for got, t, p in zip(out["translations"], want, prefix):
        assert got["text"] == t.text and got["text"].startswith(p or "")
        assert got["source_tokens"] == t.source_tokens and len(got["hypotheses"]) == len(t.hypotheses)
        for g, h in zip(got["hypotheses"], t.hypotheses):
            assert g["text"] == h.text and g["tokens"] == h.tokens and g["score"] == pytest.approx(h.score, abs=1e-4)
            assert g["alignment"] == [list(pair) for pair in h.alignment]
        assert got["alignment"] == got["hypotheses"][0]["alignment"] and got["tokens"] == t.tokens
    assert out["translations"][1]["alignment"]  # a real sentence has one


def test_score_is_the_translators(translator, server):
    _, url = server
    src, tgt = LINES[:5], ["MAN SEES", "DOG CAT RUNS", "", "DOG", "BIG SMALL WOMAN RED"]
    status, out, _ = call(url, "/v1/score", {"src": src, "tgt": tgt})
    assert status == 200, out
    for got, want in zip(out["scores"], translator.score(src, tgt)):
        assert got["tokens"] == want.tokens and got["tokens"][-1] == "</s>"
        assert got["log_prob"] == pytest.approx(want.log_prob, abs=1e-4)
        assert got["token_log_probs"] == pytest.approx(want.token_log_probs, abs=1e-4)


def test_an_answer_does_not_depend_on_what_it_was_batched_with(translator):
    """24 requests at once (mixed settings, prefixes, lengths) on a server that waits 300 ms to fill a batch:
    each answer equals its request translated alone by the library, and requests did share model calls."""
    jobs = []
    for i in range(24):
        lines = [LINES[(i * 5 + j) % 20] for j in range(1 + i % 5)]
        options = [{"beam": 4, "nbest": 2}, {}, {"beam": 4}][i % 3]
        if i % 3 == 2 and i % 2:
            options = {**options, "prefix": [None if j % 2 else LINES[j % 20].upper().split()[0] for j in
                                             range(len(lines))]}
        jobs.append({"src": lines, **options})
    alone = [expected(translator, j["src"], j.get("beam"), j.get("nbest"), j.get("prefix")) for j in jobs]
    with live(translator, max_wait_ms=300, batch_tokens=4096) as (srv, url):
        barrier = threading.Barrier(len(jobs))

        def send(job):
            barrier.wait()
            return call(url, "/v1/translate", job)

        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(send, jobs))
        stats = srv.service.batcher.stats
    for job, want, (status, out, _) in zip(jobs, alone, results):
        assert status == 200, out
        nbest = job.get("nbest", 1) > 1
        same(served(out, nbest), want if nbest else [w[:1] for w in want])
    assert stats.jobs == len(jobs) and stats.batches < len(jobs) // 2  # requests shared model calls
    assert stats.largest_batch > 5  # more sentences than any one request has


# One pair of requests per field a request may set for decoding (tformer.serve.plans.decoding_fields: DecodeConfig's
# per-call fields), the second differing from the first in that field alone, from a base where it matters.
BEAM, SAMPLE = {"beam": 4, "nbest": 2}, {"strategy": "sample", "nbest": 2}
VARIED = {
    "strategy": ({}, {"strategy": "beam"}),
    "beam": (BEAM, {**BEAM, "beam": 3}),
    "nbest": (BEAM, {**BEAM, "nbest": 3}),
    "len_penalty": (BEAM, {**BEAM, "len_penalty": 2.0}),
    "len_penalty_rule": (BEAM, {**BEAM, "len_penalty_rule": "power"}),
    "beam_finish": (BEAM, {**BEAM, "beam_finish": "all"}),
    "min_len": (BEAM, {**BEAM, "min_len": 6}),
    "max_len_a": (BEAM, {**BEAM, "max_len_a": 0.3}),
    "max_len_b": ({**BEAM, "max_len_a": 0.3}, {**BEAM, "max_len_a": 0.3, "max_len_b": 1}),
    "no_repeat_ngram": (BEAM, {**BEAM, "no_repeat_ngram": 1}),
    "repetition_penalty": (BEAM, {**BEAM, "repetition_penalty": 3.0}),
    "unk_penalty": (BEAM, {**BEAM, "unk_penalty": 1000.0}),
    "temperature": (SAMPLE, {**SAMPLE, "temperature": 0.3}),
    "top_k": (SAMPLE, {**SAMPLE, "top_k": 2}),
    "top_p": (SAMPLE, {**SAMPLE, "top_p": 0.3}),
    "seed": (SAMPLE, {**SAMPLE, "seed": 7}),
}
OUTPUTS = {"alignment": (BEAM, {**BEAM, "alignment": True})}  # what the outputs carry


def _hypotheses(translations) -> list:
    """(text, score rounded, alignment) of every hypothesis: from the library's Translations or an answer."""
    def one(h):
        get = h.get if isinstance(h, dict) else lambda k: getattr(h, k)
        align = get("alignment")
        return get("text"), round(get("score"), 3), None if align is None else [list(p) for p in align]

    out = []
    for t in translations:
        hyps = t.hypotheses if not isinstance(t, dict) else t.get("hypotheses", [t])
        out.append([one(h) for h in hyps])
    return out


def test_requests_differing_in_any_decoding_field_each_decode_as_asked_however_batched(translator):
    """Fields of a request left out between the batching key and the decoding: none possible. Pairs of requests
    differing in one field each (every field a request may set, and alignment; LibreTranslate's text and html,
    whose markup needs attention maps) sent at once to a server that waits to fill batches: each answer is the
    library's for that request alone, and says which decoding it used; equal requests shared model calls."""
    from tformer.config import DecodeConfig, request_fields
    from tformer.documents import translate_documents
    from tformer.serve.plans import decoding_fields

    assert set(VARIED) == set(decoding_fields()), "give every per-call decoding field a pair of requests here"
    src = LINES[:6]
    jobs = [("/v1/translate", {"src": src, **options}) for pair in {**VARIED, **OUTPUTS}.values() for options in pair]
    html = f"<p>{LINES[0]} <b>{LINES[1]}</b></p>"
    libre = [("/translate", {"q": html, "source": "en", "target": "de", "format": f}) for f in ("text", "html")]
    alone = [translator.translate(src, **{k: v for k, v in body.items() if k != "src"}) for _, body in jobs]
    for name, a, b in zip({**VARIED, **OUTPUTS}, alone[::2], alone[1::2]):
        assert _hypotheses(a) != _hypotheses(b), f"{name} changes nothing here: the pair tests nothing"
    alone_libre = [translate_documents(translator, [html], format=f)[0] for f in ("text", "html")]
    assert alone_libre[0] != alone_libre[1]
    with live(translator, max_wait_ms=300, batch_tokens=1 << 16, max_queue=1024) as (srv, url):
        barrier = threading.Barrier(len(jobs) + len(libre))

        def send(job):
            barrier.wait()
            return call(url, *job)

        with concurrent.futures.ThreadPoolExecutor(len(jobs) + len(libre)) as pool:
            results = list(pool.map(send, jobs + libre))
        stats = srv.service.batcher.stats
    for (_, body), want, (status, out, _) in zip(jobs, alone, results):
        assert status == 200, (body, out)
        nbest = (body.get("nbest") or 1) > 1
        assert _hypotheses(out["translations"]) == [h if nbest else h[:1] for h in _hypotheses(want)], body
        options = {k: v for k, v in body.items() if k not in ("src", "alignment")}
        cfg = translator.decode_settings(**options)
        assert out["decoding"] == {k: getattr(cfg, k) for k in request_fields(DecodeConfig)}, body
    assert [out["translatedText"] for _, out, _ in results[len(jobs):]] == alone_libre
    assert stats.batches < len(jobs)  # equal requests (the bases) shared model calls


def test_each_text_of_a_request_is_tokenised_once(translator, server, monkeypatch):
    """From the HTTP body to the search, each source, prefix and phrase is tokenised exactly once: the plan's ids
    are what the server's limits and the batch budget measure and what the search reads (counted on the
    tokenizers, whichever path asks them); LibreTranslate's sentences likewise."""
    import collections

    _, url = server
    seen = collections.Counter()
    for tok in {id(t): t for t in (translator.source_tokenizer, translator.target_tokenizer)}.values():
        def encode(text, *args, _encode=tok.encode, **kwargs):
            seen[text] += 1
            return _encode(text, *args, **kwargs)

        monkeypatch.setattr(tok, "encode", encode)
    body = {"src": LINES[:3], "prefix": ["MAN", None, None], "constraints": [None, ["SMALL DOG"], None], "beam": 4}
    status, out, _ = call(url, "/v1/translate", body)
    assert status == 200, out
    assert seen == collections.Counter(LINES[:3] + ["MAN", "SMALL DOG"])
    for form, q in (("text", f"{LINES[3]}\n{LINES[4]}"), ("html", f"<p>{LINES[3]}</p><p>{LINES[4]}</p>")):
        seen.clear()
        status, out, _ = call(url, "/translate", {"q": q, "source": "en", "target": "de", "format": form})
        assert status == 200, out
        assert seen == collections.Counter(LINES[3:5]), form


def test_health_info_and_page(translator, server):
    srv, url = server
    status, health, _ = call(url, "/v1/health")
    assert status == 200 and health["status"] == "ok" and health["pending_sentences"] == 0
    status, info, headers = call(url, "/v1/info")
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert info["languages"] == {"source": "en", "target": "de"}
    assert info["vocab"] == {"source": len(translator.source_tokenizer.vocab),
                             "target": len(translator.target_tokenizer.vocab)}
    assert info["model"]["d_model"] == 16 and info["model"]["encoder_layers"] == 1
    assert info["decode"]["strategy"] == "greedy" and info["decode"]["beam_size"] == 5
    assert info["decoding"] == {k: info["decode"][k] for k in info["decoding"]} and "quantize" not in info["decoding"]
    status, out, _ = call(url, "/v1/translate", {"src": [LINES[0]]})  # no decoding field: the checkpoint's
    assert out["decoding"] == info["decoding"] and out["translations"][0]["text"] == \
        translator.translate([LINES[0]])[0].text
    assert info["limits"]["max_sentences"] == 8 and "api_key" not in info["limits"]
    assert info["batching"]["max_wait_ms"] == 5.0 and info["batching"]["batch_tokens"] == 4096
    with urllib.request.urlopen(url + "/", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/html") and b'id="heatmap"' in r.read()
    status, out, _ = call(url, "/api/translate", {"text": LINES[0], "beam": 2, "nbest": 1})
    assert status == 200 and out["hypotheses"][0]["text"] == translator.translate([LINES[0]], beam=2)[0].text


def test_a_keep_alive_client_gets_every_answer_on_one_connection(translator, server):
    import httpx

    _, url = server
    with httpx.Client(base_url=url, timeout=60) as client:
        for line in LINES[:10]:
            r = client.post("/v1/translate", json={"src": [line], "beam": 3})
            assert r.status_code == 200 and r.json()["translations"][0]["text"] == \
                translator.translate([line], beam=3)[0].text
        assert client.post("/v1/translate", content=b"{", headers={"Content-Type": "application/json"}
                           ).status_code == 400
        assert client.get("/v1/health").json()["status"] == "ok"


# ------------------------------------------------------------------------------------------ LibreTranslate


def test_libretranslate_client_works_unchanged(translator, server):
    from libretranslatepy import LibreTranslateAPI

    _, url = server
    client = LibreTranslateAPI(url)
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]},
                                  {"code": "de", "name": "German", "targets": []}]
    for line in LINES[:3]:
        assert client.translate(line, "en", "de") == translator.translate([line])[0].text
    assert client.translate(LINES[3], "auto", "de") == translator.translate([LINES[3]])[0].text
    with pytest.raises(urllib.error.HTTPError) as e:
        client.translate(LINES[0], "en", "fr")
    assert e.value.code == 400 and "this server translates en -> de" in json.loads(e.value.read())["error"]


def test_libretranslate_json_lists_lines_and_alternatives(translator, server):
    _, url = server
    status, out, _ = call(url, "/translate", {"q": LINES[:3], "source": "en", "target": "de", "format": "text"})
    assert status == 200 and out == {"translatedText": [t.text for t in translator.translate(LINES[:3])]}
    status, out, _ = call(url, "/translate", {"q": f"{LINES[0]}\n\n{LINES[1]}", "source": "en", "target": "de"})
    want = translator.translate([LINES[0], "", LINES[1]])
    assert status == 200 and out["translatedText"] == "\n".join(t.text for t in want)
    status, out, _ = call(url, "/translate", {"q": LINES[4], "source": "en", "target": "de", "alternatives": 2})
    want = translator.translate([LINES[4]], beam=5, nbest=3)[0]
    assert status == 200 and out == {"translatedText": want.text, "alternatives": [h.text for h in want.hypotheses[1:]]}
    form = urllib.parse.urlencode([("q", LINES[0]), ("q", LINES[1]), ("source", "en"), ("target", "de")]).encode()
    status, out, _ = call(url, "/translate", raw=form, content_type="application/x-www-form-urlencoded")
    assert status == 200 and out["translatedText"] == [t.text for t in translator.translate(LINES[:2])]


def test_libretranslate_detects_the_source_language(translator, server, shared_data):
    """/detect and source "auto": the server's languages ranked for a text; judged against Multi30k's own
    languages (test2016's English and German lines), and "auto" translating exactly as source "en" does."""
    _, url = server
    with gzip.open(shared_data / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8") as f:
        german = [line.strip() for line in itertools.islice(f, 100)]
    with gzip.open(shared_data / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        english = [line.strip() for line in itertools.islice(f, 100)]
    right = 0
    for want, lines in (("en", english), ("de", german)):
        for line in lines:
            status, out, _ = call(url, "/detect", {"q": line})
            assert status == 200 and [c["language"] for c in out] in (["en", "de"], ["de", "en"])
            assert out[0]["confidence"] >= out[1]["confidence"] and sum(c["confidence"] for c in out) == \
                pytest.approx(100, abs=0.05)
            right += out[0]["language"] == want
    assert right >= 196  # >= 98% of 200
    status, out, _ = call(url, "/translate", {"q": LINES[0], "source": "auto", "target": "de"})  # the model's words
    assert status == 200 and out["translatedText"] == translator.translate([LINES[0]])[0].text
    assert out["detectedLanguage"]["language"] == "en" and 50 < out["detectedLanguage"]["confidence"] <= 100
    status, out, _ = call(url, "/translate", {"q": LINES[:2], "source": "auto", "target": "de"})
    assert status == 200 and [d["language"] for d in out["detectedLanguage"]] == ["en", "en"], out
    assert out["translatedText"] == [t.text for t in translator.translate(LINES[:2])]
    status, out, _ = call(url, "/translate", {"q": LINES[:2], "source": "en", "target": "de"})
    assert status == 200 and "detectedLanguage" not in out
    status, out, _ = call(url, "/translate", {"q": [LINES[0], german[0]], "source": "auto", "target": "de"})
    assert status == 400 and "q[1]: detected as German ('de'" in out["error"] and "give source 'en'" in out["error"]
    for body, message in (({}, "q: give the text"), ({"q": ["a", "b"]}, "q: give the text whose language"),
                          ({"q": "a", "colour": 1}, "unknown field(s) colour")):
        status, out, _ = call(url, "/detect", body)
        assert status == 400 and message in out["error"], out


@pytest.mark.parametrize("body, message", [
    ({"q": "a", "source": "fr", "target": "de"}, "source: 'fr' is not a language here"),
    ({"q": "a", "source": "en"}, "target: missing"),
    ({"q": "a", "source": "en", "target": "de", "format": "xml"}, "format: 'xml' is not a format; give 'text'"),
    ({"q": "<p>a</p", "source": "en", "target": "de", "format": 5}, "format: 5 is not a format"),
    ({"q": 5, "source": "en", "target": "de"}, "q: must be a string"),
    ({"q": [], "source": "en", "target": "de"}, "q: an empty list"),
    ({"source": "en", "target": "de"}, "q: missing"),
    ({"q": "a", "source": "en", "target": "de", "alternatives": 9}, "alternatives: must be a whole number from 0 to 3"),
    ({"q": "a", "source": "en", "target": "de", "colour": 1}, "unknown field(s) colour"),
    ({"q": "\n".join(["a"] * 9), "source": "en", "target": "de"}, "--max-sentences"),
])
def test_libretranslate_bad_requests(server, body, message):
    _, url = server
    status, out, _ = call(url, "/translate", body)
    assert status == 400 and message in out["error"], out


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("path, body, status, message", [
    ("/v1/translate", {"src": "a b"}, 400, "src: must be a list of strings, got a string; wrap one sentence"),
    ("/v1/translate", {"src": ["a", "b", "c", 3]}, 400, "src[3]: must be a string, got a number"),
    ("/v1/translate", {"src": []}, 400, "src: an empty list"),
    ("/v1/translate", {}, 400, "src: missing"),
    ("/v1/translate", ["a"], 400, "must be a JSON object"),
    ("/v1/translate", {"src": ["a"], "colour": 1}, 400, "unknown field(s) colour"),
    ("/v1/translate", {"src": ["a"] * 9}, 400, "9 sentences; a request may have at most 8 (--max-sentences)"),
    ("/v1/translate", {"src": ["a" * 201]}, 400, "src[0]: 201 characters; the limit is 200 (--max-chars)"),
    ("/v1/translate", {"src": ["dog " * 45]}, 400, "the limit is 40 (--max-tokens)"),
    ("/v1/translate", {"src": ["a"], "prefix": ["MAN " * 45]}, 400, "prefix[0]:"),
    ("/v1/translate", {"src": ["a"], "prefix": ["a", "b"]}, 400, "prefix: must be a list with one string"),
    ("/v1/translate", {"src": ["a"], "prefix": [3]}, 400, "prefix[0]: must be a string"),
    ("/v1/translate", {"src": ["a"], "beam": 7}, 400, "beam: must be a whole number from 1 to 6 (--max-beam)"),
    ("/v1/translate", {"src": ["a"], "beam": "5"}, 400, "beam: must be a whole number"),
    ("/v1/translate", {"src": ["a"], "beam": True}, 400, "beam: must be a whole number"),
    ("/v1/translate", {"src": ["a"], "beam": 2, "nbest": 3}, 400, "nbest: 3 hypotheses cannot come from a beam of 2"),
    ("/v1/translate", {"src": ["a"], "nbest": 2}, 400, "nbest: greedy search has one hypothesis"),  # greedy default
    ("/v1/translate", {"src": ["a"], "alignment": "yes"}, 400, "alignment: must be true or false"),
    # the config's own bounds (DecodeConfig's field metadata), named by the request's field
    ("/v1/translate", {"src": ["a"], "top_p": 0}, 400, "top_p: must be in (0, 1], got 0"),
    ("/v1/translate", {"src": ["a"], "repetition_penalty": 1e-4}, 400, "repetition_penalty: must be > 0, from 0.001"),
    ("/v1/translate", {"src": ["a"], "seed": 10 ** 30}, 400, "seed: must be from 0 to 4294967295"),
    ("/v1/translate", {"src": ["a"], "strategy": "fast"}, 400, "strategy: must be one of 'greedy', 'beam', 'sample'"),
    ("/v1/translate", {"src": ["a"], "temperature": "hot"}, 400, "temperature: must be a number"),
    ("/v1/translate", {"src": ["a"], "min_len": 1.5}, 400, "min_len: must be a whole number"),
    ("/v1/translate", {"src": ["a"], "quantize": "int8"}, 400, "unknown field(s) quantize"),  # chosen at load
    ("/v1/translate", {"src": ["a"], "constraints": [["MAN"]]}, 400, "constraints are enforced by beam search"),
    # the server's limits on what the plan asks of the model
    ("/v1/translate", {"src": ["a"], "min_len": 41}, 400,
     "min_len: must be a whole number from 0 to 40 (--max-tokens)"),
    ("/v1/translate", {"src": ["a b"], "max_len_a": 30.0}, 400, "max_len_a: outputs of up to 160 pieces for src[0]"),
    ("/v1/score", {"src": ["a"], "tgt": ["A", "B"]}, 400, "2 targets for 1 sources"),
    ("/v1/score", {"src": [""], "tgt": ["A"]}, 400, "src[0]: empty"),
    ("/v1/score", {"src": ["a"]}, 400, "tgt: missing"),
    ("/v1/score", {"src": ["a"], "tgt": ["A"], "beam": 2}, 400, "unknown field(s) beam"),
])
def test_bad_requests_get_a_4xx_naming_the_field(server, path, body, status, message):
    _, url = server
    got, out, _ = call(url, path, body)
    assert got == status and message in out["error"], out


def test_transport_errors_and_the_server_goes_on(translator, server):
    _, url = server
    status, out, _ = call(url, "/v1/translate", raw=b'{"src": ["a"')
    assert status == 400 and "not UTF-8 JSON" in out["error"] and "line 1" in out["error"]
    status, out, _ = call(url, "/v1/translate", raw=b'{"src": ["\xff\xfe"]}')
    assert status == 400 and "not UTF-8" in out["error"] and "byte 10" in out["error"]
    status, out, _ = call(url, "/v1/translate", raw=b'{"src": ["a"], "beam": NaN}')
    assert status == 400 and "NaN is not a JSON number" in out["error"]
    status, out, _ = call(url, "/v1/translate", raw=b"[" * 5000 + b"]" * 5000)
    assert status == 400 and "nested too deeply" in out["error"]
    status, out, _ = call(url, "/v1/translate", raw=b'{"src": ["a"]}', content_type="text/plain")
    assert status == 415 and "application/json" in out["error"]
    status, out, _ = call(url, "/v1/translate", raw=b"src=a", content_type="application/x-www-form-urlencoded")
    assert status == 415  # what a cross-site form could send
    status, out, _ = call(url, "/nope")
    assert status == 404 and "no such endpoint: GET /nope" in out["error"]
    status, out, _ = call(url, "/v1/translate")
    assert status == 405 and out["error"]
    status, out, _ = call(url, "/v1/info", headers={"Host": "attacker.example:8000"})  # DNS rebinding
    assert status == 403 and "127.0.0.1 or localhost" in out["error"]
    assert call(url.replace("127.0.0.1", "localhost"), "/v1/health")[0] == 200
    status, out, _ = call(url, "/v1/translate", {"src": [LINES[0]]})
    assert status == 200 and out["translations"][0]["text"] == translator.translate([LINES[0]])[0].text


def _raw_http(port: int, data: bytes, wait: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply and b"}" in reply:
                    break
    return reply


def test_an_oversized_body_is_refused_before_it_is_read(server):
    srv, url = server
    head = (b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n")
    reply = _raw_http(srv.port, head)  # 50 MB announced, none sent: the answer comes from the header alone
    assert reply.startswith(b"HTTP/1.1 413") and b"at most 16384 bytes" in reply
    chunk = b'{"src": ["' + b"a" * 20_000 + b'"]}'
    chunked = (b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n")
    reply = _raw_http(srv.port, chunked)  # no Content-Length: read until over the limit
    assert reply.startswith(b"HTTP/1.1 413") and b"longer than 16384 bytes" in reply
    assert call(url, "/v1/translate", {"src": ["a"]})[0] == 200


# ------------------------------------------------------------------------------------------ load, time, clients


@contextlib.contextmanager
def _gate(srv):
    """Keep the model worker busy until the yielded event is set (at the latest when the block ends)."""
    gate = threading.Event()
    srv.service.batcher.call(gate.wait, sentences=0)
    try:
        _wait(lambda: srv.service.batcher.snapshot()["queued_jobs"] == 0)  # the worker is inside it
        yield gate
    finally:
        gate.set()


def test_a_full_queue_answers_503_with_retry_after_and_recovers(translator):
    with live(translator, max_sentences=4, max_queue=4) as (srv, url), _gate(srv) as gate:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(call, url, "/v1/translate", {"src": LINES[:4]})
            _wait(lambda: srv.service.batcher.pending == 4)
            status, out, headers = call(url, "/v1/translate", {"src": [LINES[5]]})
            assert status == 503 and "busy: 4 sentences are waiting" in out["error"] and headers["Retry-After"] == "1"
            gate.set()
            status, out, _ = waiting.result(timeout=60)
        assert status == 200 and [t["text"] for t in out["translations"]] == \
            [t.text for t in translator.translate(LINES[:4])]
        assert call(url, "/v1/translate", {"src": [LINES[5]]})[0] == 200


def test_a_request_past_its_timeout_gets_504_and_its_queued_work_is_dropped(translator):
    with live(translator, timeout=0.5) as (srv, url), _gate(srv) as gate:
        tic = time.monotonic()
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:3]})
        assert status == 504 and "no answer within 0.5 s (--timeout)" in out["error"]
        assert "dropped from the queue" in out["error"] and time.monotonic() - tic < 5
        stats = srv.service.batcher.stats
        assert srv.service.batcher.pending == 0 and stats.dropped == 1
        gate.set()
        assert call(url, "/v1/translate", {"src": [LINES[0]]})[0] == 200
        assert stats.jobs == 2 and stats.sentences == 1  # the gate and the last request: the dropped one never ran


def test_a_client_that_disconnects_has_its_work_dropped(translator):
    with live(translator) as (srv, url), _gate(srv) as gate:
        body = json.dumps({"src": LINES[:5], "beam": 4}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait(lambda: srv.service.batcher.pending == 5)
        s.close()
        _wait(lambda: srv.service.batcher.pending == 0)
        assert srv.service.batcher.stats.dropped == 1
        gate.set()
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:2]})
        assert status == 200 and [t["text"] for t in out["translations"]] == \
            [t.text for t in translator.translate(LINES[:2])]
        assert srv.service.batcher.stats.sentences == 2  # the gate's 0, this request's 2: not the dropped 5


def test_api_key(translator, monkeypatch):
    from libretranslatepy import LibreTranslateAPI

    with live(translator, api_key="s3cret") as (_, url):
        status, out, headers = call(url, "/v1/translate", {"src": ["a"]})
        assert status == 401 and "needs an API key" in out["error"] and headers["WWW-Authenticate"].startswith("Bearer")
        status, out, _ = call(url, "/v1/translate", {"src": ["a"]}, headers={"Authorization": "Bearer wrong"})
        assert status == 403 and "not valid" in out["error"]
        assert call(url, "/v1/translate", {"src": ["a"]}, headers={"Authorization": "Bearer s3cret"})[0] == 200
        assert call(url, "/v1/translate", {"src": ["a"]}, headers={"X-API-Key": "s3cret"})[0] == 200
        assert call(url, "/v1/info")[0] == 401 and call(url, "/api/info")[0] == 401
        assert call(url, "/v1/health")[0] == 200  # for load balancers; and /languages, as LibreTranslate does
        assert LibreTranslateAPI(url).languages()[0]["code"] == "en"
        assert LibreTranslateAPI(url, api_key="s3cret").translate(LINES[0], "en", "de") == \
            translator.translate([LINES[0]])[0].text
        for key, code in ((None, 401), ("wrong", 403)):
            with pytest.raises(urllib.error.HTTPError) as e:
                LibreTranslateAPI(url, api_key=key).translate(LINES[0], "en", "de")
            assert e.value.code == code


def test_binding_beyond_loopback_without_a_key_warns(translator, caplog):
    with caplog.at_level(logging.WARNING, logger="tformer"):
        srv = Server(translator, "127.0.0.2", 0, Settings())  # loopback, but not a name the Host check knows
    srv.socket.close()
    srv.service.batcher.close()
    assert "without an API key" in caplog.text
    with pytest.raises(tformer.ConfigError, match="--max-queue"):
        Settings(max_queue=4, max_sentences=8)
    with pytest.raises(tformer.ConfigError, match="--max-wait-ms"):
        Settings(max_wait_ms=-1)


# ------------------------------------------------------------------------------------------ the command


def test_sigterm_answers_every_accepted_request_then_exits(translator):
    """The server holds 6 requests (waiting 3 s to fill a batch) when SIGTERM comes: it stops accepting
    connections at once, answers all 6 correctly, and exits 0."""
    proc, url = _start("--max-wait-ms", "3000")
    try:
        jobs = [LINES[3 * i:3 * i + 3] for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = [pool.submit(call, url, "/v1/translate", {"src": lines, "beam": 3}) for lines in jobs]
            _wait(lambda: call(url, "/v1/health")[1]["pending_sentences"] == 18)
            proc.send_signal(signal.SIGTERM)

            def refused() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5).close()
                    return False
                except OSError:
                    return True

            _wait(refused)  # no new connections, as soon as the shutdown begins (however loaded the machine)
            for lines, f in zip(jobs, futures):
                status, out, _ = f.result(timeout=60)
                assert status == 200 and [t["text"] for t in out["translations"]] == \
                    [t.text for t in translator.translate(lines, beam=3)]
        assert proc.wait(timeout=30) == 0
        assert "tformer serve: stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_command_checks_its_options_takes_the_key_from_the_environment_and_stops_on_ctrl_c(translator):
    bad = subprocess.run([sys.executable, "-m", "tformer", "serve", "--checkpoint", str(CHECKPOINT), "--max-queue",
                          "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-queue must be a whole number >= 1" in bad.stderr
    proc, url = _start("--max-sentences", "2", env={"TFORMER_API_KEY": "k"})
    try:
        assert call(url, "/v1/translate", {"src": LINES[:2]})[0] == 401
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:3]}, headers={"X-API-Key": "k"})
        assert status == 400 and "(--max-sentences)" in out["error"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_served_from_another_folder_with_the_corpus_out_of_reach_the_data_cache_is_left_as_it_was(
        translator, tmp_path, monkeypatch):
    """Issue 62. A run whose data.dir is relative (as recipes write it), its validation split encoded into the
    cache from the folder it was trained in (the explorer's examples, read as the server reads them); then
    `tformer serve` started from another folder with that cache, where data.dir names nothing. It starts,
    translates as the library does, shows no example sentences, and every file of the cache entry is still
    there, byte for byte: a cache entry whose corpus is not found is not damaged, and not the server's to remove."""
    run, home, elsewhere, cache = tmp_path / "run", tmp_path / "train", tmp_path / "deploy", tmp_path / "cache"
    shutil.copytree(CHECKPOINT, run)
    config = run / "config.yaml"
    text = config.read_text(encoding="utf-8")
    assert "  dir: /tmp/fx/data\n" in text
    config.write_text(text.replace("  dir: /tmp/fx/data\n", "  dir: corpus\n"), encoding="utf-8")
    (home / "corpus").mkdir(parents=True)
    elsewhere.mkdir()
    (home / "corpus" / "valid.en").write_text("".join(f"{s}\n" for s in LINES[:8]), encoding="utf-8")
    (home / "corpus" / "valid.de").write_text("".join(f"{s.upper()}\n" for s in LINES[:8]), encoding="utf-8")
    with monkeypatch.context() as m:
        m.chdir(home)
        m.setenv("TFORMER_CACHE", str(cache))
        assert tformer.load(run, device="cpu").load_split("valid").texts["valid"][0] == LINES[:8]
    entries = cache / "prepared"  # the data cache's entries (the cache also holds matmul's saved choices)
    before = {p.relative_to(cache): p.read_bytes() for p in sorted(entries.rglob("*")) if p.is_file()}
    assert any(p.parts[-2:] == ("valid", "00000.tok.npy") for p in before)  # the entry holds a valid/ shard

    proc, url = _start(checkpoint=run, cwd=elsewhere, env={"TFORMER_CACHE": str(cache), "PYTHONPATH": str(ROOT)})
    try:
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:3]})
        assert status == 200 and [t["text"] for t in out["translations"]] == \
            [t.text for t in translator.translate(LINES[:3])]
        status, info, _ = call(url, "/api/info")
        assert status == 200 and info["examples"] == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    after = {p.relative_to(cache): p.read_bytes() for p in sorted(entries.rglob("*")) if p.is_file()}
    assert sorted(after) == sorted(before)
    assert all(after[p] == before[p] for p in before)


def test_the_server_warms_each_batch_size_up_to_its_setting_before_answering(translator, monkeypatch):
    """Settings.warm_up = N: batches of 1, 2, 4, .. and N made-up sentences are decoded before serving (each at
    the checkpoint's beam: N x beam rows reach the decoder), their seconds in /v1/info; 0 warms nothing; a bad
    value names --warm-up. Oracle: the row counts the decoder's step is called with."""
    assert Settings(warm_up=20).warm_up_sizes() == [1, 2, 4, 8, 16, 20]
    assert Settings(warm_up=16).warm_up_sizes() == [1, 2, 4, 8, 16] and Settings(warm_up=0).warm_up_sizes() == []
    for bad in (-1, 257, 2.5, True):
        with pytest.raises(tformer.ConfigError, match="--warm-up"):
            Settings(warm_up=bad)
    rows = []
    step = translator.model.decode_step
    monkeypatch.setattr(translator.model, "decode_step", lambda tokens, *a, **k: rows.append(tokens.shape[0])
                        or step(tokens, *a, **k))
    beam = translator.config.decode.beam_size if translator.config.decode.strategy == "beam" else 1
    with live(translator, warm_up=6) as (srv, url):
        assert rows == []  # not before it is asked
        warmed = srv.warm_up()
        assert list(warmed) == [1, 2, 4, 6] and all(s > 0 for s in warmed.values())
        assert {n * beam for n in warmed} <= set(rows) and max(rows) == 6 * beam
        assert call(url, "/v1/info")[1]["warm_up_seconds"].keys() == {"1", "2", "4", "6"}
        assert call(url, "/v1/info")[1]["compiled_step"] is None  # decode.compile off
    rows.clear()
    with live(translator, warm_up=0) as (srv, url):
        assert srv.warm_up() == {} and rows == []
