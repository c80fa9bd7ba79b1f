"""The explorer: its answers are what translate and attention_maps compute; bad requests get a message, never
a dead server; many requests at once all get their own answer; and the page works in a real browser. The page
is served by tformer.serve (uvicorn in a thread here, as `tformer explore` runs it)."""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from tformer.config import DecodeConfig
from tformer.data import Vocab
from tformer.explore import Explorer, Limits, server_settings
from tformer.inference import load_model, translate_ids
from tformer.serve import Server
from tformer.training.loop import train
from tformer.viz.attention import KINDS, attention_maps

from helpers.browser import BROWSER_ARGS, CHROMIUM, _browser
from helpers.models import tiny_config

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("TFORMER_TEST_ARTIFACTS", ROOT / "test-artifacts"))


def _train(path, epochs=3, **model):
    cfg = tiny_config(**model)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=epochs))
    train(cfg, path)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("explore") / "copy", epochs=10)


@contextlib.contextmanager
def serving(explorer, max_connections=64):
    """The explorer's server as `tformer explore` runs it, on 127.0.0.1, any free port: yields the Server."""
    server = Server(explorer.translator, "127.0.0.1", 0, server_settings(explorer.limits, max_connections),
                    explorer=explorer)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started)
    try:
        yield server
    finally:
        server.stop()
        thread.join(30)


@pytest.fixture(scope="module")
def server(run):
    explorer = Explorer(run, limits=Limits(max_chars=200, max_tokens=30, max_beam=6, max_nbest=4))
    with serving(explorer) as httpd:
        yield explorer, httpd.url.rstrip("/")


def _decoded(data: bytes):
    """A JSON answer; uvicorn's own 503 (too many connections) is plain text: {"error": text}."""
    try:
        return json.loads(data)
    except ValueError:
        return {"error": data.decode("utf-8", "replace")}


def _post(url, body, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + "/api/translate", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, _decoded(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _decoded(e.read())


def test_answer_is_the_beam_search_and_the_attention_of_each_hypothesis(run, server):
    explorer, url = server
    status, out = _post(url, {"text": "a b c d e", "beam": 4, "nbest": 3})
    assert status == 200
    ckpt, model = load_model(str(run))
    src_tok, tgt_tok = ckpt.tokenizers
    ids = src_tok.encode("a b c d e")
    want = translate_ids(model, [ids], DecodeConfig(strategy="beam", beam_size=4, nbest=3))
    assert [h["text"] for h in out["hypotheses"]] == [tgt_tok.decode(t) for t in want.tokens[0]]
    np.testing.assert_allclose([h["score"] for h in out["hypotheses"]], want.scores[0], atol=1e-4)
    maps = attention_maps(model, [(ids, t) for t in want.tokens[0]])
    for hyp, m in zip(out["hypotheses"], maps):
        for kind in KINDS:
            np.testing.assert_allclose(np.array(hyp["attention"][kind], dtype=float), m.weights[kind], atol=1e-4)
    assert out["source"]["pieces"] == list("abcde")
    assert out["hypotheses"][0]["labels"]["cross"]["keys"] == list("abcde") + ["</s>"]
    assert out["hypotheses"][0]["steps"] is None


def test_forced_target_is_scored_by_its_log_probability(run, server):
    _, url = server
    ckpt, model = load_model(str(run))
    src_tok, tgt_tok = ckpt.tokenizers
    src, tgt = src_tok.encode("a b c"), tgt_tok.encode("c a")
    with torch.inference_mode():  # oracle: the cached step-by-step decoder, token by token, then </s>
        enc = model.encode(torch.tensor([src + [Vocab.eos]]), torch.tensor([len(src) + 1]))
        cache, prev, want = model.init_cache(enc), Vocab.bos, 0.0
        for tok in tgt + [Vocab.eos]:
            logits, cache = model.decode_step(torch.tensor([prev]), cache)
            want += float(torch.log_softmax(logits, -1)[0, tok])
            prev = tok
    status, out = _post(url, {"text": "a b c", "target": "c a", "beam": 1, "nbest": 1})
    assert status == 200 and out["decode"]["forced"]
    assert out["hypotheses"][0]["text"] == "c a" and out["hypotheses"][0]["pieces"] == ["c", "a"]
    assert out["hypotheses"][0]["score"] == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize("body, status, message", [
    ({"text": ""}, 400, "type a sentence"),
    ({"text": "   "}, 400, "type a sentence"),
    ({"text": "a " * 150}, 400, "limit is 200"),
    ({"text": "a " * 40}, 400, "limit is 30"),
    ({"text": "a b", "beam": 7}, 400, "from 1 to 6"),
    ({"text": "a b", "beam": "5"}, 400, "whole number"),
    ({"text": "a b", "beam": 2, "nbest": 3}, 400, "cannot exceed the beam"),
    ({"text": "a b", "colour": 1}, 400, "unknown field(s) colour"),
    ({"text": 5}, 400, "must be a string"),
    (["a b"], 400, "JSON object"),
    ({"text": "a b", "target": ""}, 400, "non-empty"),
])
def test_bad_requests_get_a_message(server, body, status, message):
    _, url = server
    got, out = _post(url, body)
    assert got == status and message in out["error"]


def test_transport_errors_and_the_server_survives(server):
    _, url = server
    assert _post(url, None, raw=b"\xff\xfe not json")[0] == 400
    assert _post(url, None, raw=b"{" * (70 * 1024))[0] == 413
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "/nope", timeout=10)
    assert e.value.code == 404
    req = urllib.request.Request(url + "/api/translate", data=b'{"text": "a b"}', headers={"Content-Type": "text/plain"})
    with pytest.raises(urllib.error.HTTPError) as e:  # what a cross-site form could send
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 415
    req = urllib.request.Request(url + "/api/info", headers={"Host": "attacker.example:8000"})
    with pytest.raises(urllib.error.HTTPError) as e:  # DNS rebinding: a foreign name pointing at 127.0.0.1
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403 and "127.0.0.1 or localhost" in json.loads(e.value.read())["error"]
    req = urllib.request.Request(url.replace("127.0.0.1", "localhost") + "/api/info")
    assert urllib.request.urlopen(req, timeout=10).status == 200
    assert _post(url, {"text": "a b"})[0] == 200  # still serving


def test_concurrent_requests_each_get_their_own_answer(server):
    explorer, url = server
    sentences = ["a b c", "h g f e", "b b a", "c", "d e f g h", "a c e g", "h h", "f e d"]
    alone = {s: explorer.translate({"text": s, "beam": 3, "nbest": 2}) for s in sentences}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda s: _post(url, {"text": s, "beam": 3, "nbest": 2}), sentences * 2))
    for s, (status, out) in zip(sentences * 2, results):
        assert status == 200
        assert out["source"]["text"] == s
        assert out["hypotheses"] == alone[s]["hypotheses"]


def test_info_and_page(server):
    explorer, url = server
    with urllib.request.urlopen(url + "/api/info", timeout=10) as r:
        info = json.loads(r.read())
    assert info["model"]["heads"] == 4 and info["model"]["layers"] == {"encoder": 2, "decoder": 2, "cross": 2}
    assert info["limits"]["max_beam"] == 6 and len(info["examples"]) == 5
    with urllib.request.urlopen(url + "/", timeout=10) as r:
        page = r.read().decode()
    assert r.headers["Content-Type"].startswith("text/html") and 'id="heatmap"' in page
    assert not re.search(r"(src|href)=\"https?://", page)  # nothing from the network


@pytest.fixture(scope="module")
def ut_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("explore") / "ut", kind="universal", max_steps=3)


def test_universal_transformer_answers_with_steps(ut_run):
    out = Explorer(ut_run).translate({"text": "a b c", "beam": 2, "nbest": 2})
    for hyp in out["hypotheses"]:
        assert len(hyp["steps"]["source"]) == 4 and len(hyp["steps"]["target"]) == len(hyp["pieces"]) + 1
        assert all(1 <= s <= 3 for s in hyp["steps"]["source"] + hyp["steps"]["target"])
        assert len(hyp["attention"]["encoder"]) == max(hyp["steps"]["source"])


def test_command_serves_on_loopback_and_checks_its_options(run):
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "explore", "--checkpoint", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        status, out = _post(f"http://127.0.0.1:{match.group(1)}", {"text": "a b"})
        assert status == 200 and out["hypotheses"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    bad = subprocess.run([sys.executable, "-m", "tformer", "explore", "--checkpoint", str(run), "--max-beam", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-beam must be >= 1" in bad.stderr


# ------------------------------------------------------------------------------------------ a real browser


def _open(p, url, errors=None, **page_options):
    """Chromium on the explorer at `url`, once its model information has arrived: (browser, page). Page
    errors from the first load on are appended to `errors`."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
    page = browser.new_page(**page_options)
    if errors is not None:
        page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/")
    page.wait_for_function("document.querySelector('#model-info').textContent.includes('heads')")
    return browser, page


def test_page_in_a_real_browser_translates_and_switches_heads(server):
    sync_playwright = _browser()
    explorer, url = server
    errors = []
    with sync_playwright() as p:
        browser, page = _open(p, url, errors, viewport={"width": 1400, "height": 900})
        try:
            page.fill("#text", "a b c d e f")
            page.fill("#beam", "4")
            page.fill("#nbest", "3")
            page.click("#go")
            page.wait_for_selector("#nbest-list li.hyp")
            assert page.locator("#nbest-list li.hyp").count() == 3
            want = explorer.translate({"text": "a b c d e f", "beam": 4, "nbest": 3})["hypotheses"]
            assert page.locator("#nbest-list li.hyp .text").all_inner_texts() == [h["text"] for h in want]
            assert page.locator("#nbest-list li.hyp .score").all_inner_texts() == [f"{h['score']:.3f}" for h in want]
            before = page.eval_on_selector("#heatmap", "c => c.toDataURL()")
            edges_before = page.eval_on_selector_all("#graph line", "ls => ls.map(l => l.getAttribute('stroke-opacity'))")
            # the head whose map (cross attention, layer 0: the page's default) differs most from head 0's, by
            # the API's numbers, so that the picture must change
            heads = np.array(want[0]["attention"]["cross"][0])  # (H, queries, keys)
            other = int(np.abs(heads - heads[0]).sum(axis=(1, 2)).argmax())
            assert np.abs(heads[other] - heads[0]).max() > 0.05
            page.select_option("#head", str(other))
            # the page redraws on its own schedule: wait (up to 10 s, on a loaded machine) for both to change
            try:
                page.wait_for_function("before => document.querySelector('#heatmap').toDataURL() !== before",
                                       arg=before, timeout=10_000)
                page.wait_for_function("before => JSON.stringify([...document.querySelectorAll('#graph line')]"
                                       ".map(l => l.getAttribute('stroke-opacity'))) !== before",
                                       arg=json.dumps(edges_before), timeout=10_000)
            except Exception:  # playwright TimeoutError
                pass  # the assertions below say which of the two did not change
            after = page.eval_on_selector("#heatmap", "c => c.toDataURL()")
            edges_after = page.eval_on_selector_all("#graph line", "ls => ls.map(l => l.getAttribute('stroke-opacity'))")
            assert before != after, "switching the head did not change the heatmap"
            assert edges_before != edges_after, "switching the head did not change the token graph"
            page.select_option("#kind", "encoder")
            assert page.locator("#layer option").count() == 2
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "explorer.png"), full_page=True)
            page.fill("#text", "a " * 40)  # over the 30-piece limit: the page shows the server's message
            page.click("#go")
            page.wait_for_selector("#error", state="visible")
            assert "limit is 30" in page.inner_text("#error")
            page.fill("#text", "b c")
            page.click("#go")
            page.wait_for_selector("#error", state="hidden")
        finally:
            browser.close()
    assert not errors, errors
    assert (ARTIFACTS / "explorer.png").stat().st_size > 10_000


def test_page_shows_universal_transformer_steps(ut_run):
    sync_playwright = _browser()
    explorer = Explorer(ut_run)
    with serving(explorer) as httpd:
        want = explorer.translate({"text": "b c a", "beam": 2, "nbest": 1})["hypotheses"][0]
        with sync_playwright() as p:
            browser, page = _open(p, httpd.url.rstrip("/"))
            try:
                page.fill("#text", "b c a")
                page.fill("#beam", "2")
                page.fill("#nbest", "1")
                page.click("#go")
                page.wait_for_selector("#steps-section", state="visible")
                shown = page.locator("#steps-source > div b").all_inner_texts()
                assert [int(x) for x in shown] == want["steps"]["source"]
                shown = page.locator("#steps-target > div b").all_inner_texts()
                assert [int(x) for x in shown] == want["steps"]["target"]
                assert page.inner_text("#layer-label") == "step"
            finally:
                browser.close()


# ------------------------------------------------------------------------------------------ load


@pytest.fixture()
def bounded(run):
    """A server that lets 2 translations wait for the model and 4 connections be open: (explorer, url, Server)."""
    explorer = Explorer(run, limits=Limits(max_chars=200, max_tokens=30, max_beam=6, max_nbest=4, max_queue=2))
    with serving(explorer, max_connections=4) as httpd:
        yield explorer, httpd.url.rstrip("/"), httpd


def _post_headers(url, body):
    req = urllib.request.Request(url + "/api/translate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, _decoded(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, _decoded(e.read()), e.headers


def _wait(predicate, seconds=10.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_enormous_text_is_refused_before_it_is_read(server):
    """A 100,000-character sentence: 413 from the Content-Length alone; the server goes on."""
    _, url = server
    status, out = _post(url, {"text": "a b " * 25_000})
    assert status == 413 and "at most 65536 bytes" in out["error"]
    assert _post(url, {"text": "a b"})[0] == 200


def test_full_queue_answers_503_at_once_and_recovers(bounded):
    explorer, url, httpd = bounded
    batcher = httpd.service.batcher
    want = explorer.translate({"text": "a b c", "beam": 2, "nbest": 1})["hypotheses"]
    gate = threading.Event()
    batcher.call(gate.wait, sentences=0)  # the model is busy until the gate opens
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(_post, url, {"text": "a b c", "beam": 2, "nbest": 1}) for _ in range(2)]
        try:
            _wait(lambda: batcher.pending == 2)
            status, out, headers = _post_headers(url, {"text": "a b c", "beam": 2, "nbest": 1})
        finally:
            gate.set()
        assert status == 503 and "busy: 2 sentences are waiting" in out["error"] and headers["Retry-After"] == "1"
        for f in waiting:  # the queued ones are answered, correctly
            status, out = f.result(timeout=60)
            assert status == 200 and out["hypotheses"] == want
    assert batcher.pending == 0
    status, out = _post(url, {"text": "a b c", "beam": 2, "nbest": 1})  # recovered
    assert status == 200 and out["hypotheses"] == want


def test_too_many_connections_get_503(bounded):
    """The connection limit (tformer.serve.protocol): 503 in JSON with Retry-After, before the app sees it."""
    import socket

    _, url, httpd = bounded
    idle = [socket.create_connection(("127.0.0.1", httpd.port), timeout=10) for _ in range(4)]  # hold every slot
    _wait(lambda: len(httpd.uvicorn.server_state.connections) == 4)
    try:
        with socket.create_connection(("127.0.0.1", httpd.port), timeout=10) as extra:
            extra.sendall(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reply = b""
            while chunk := extra.recv(4096):  # the answer closes the connection
                reply += chunk
        head, _, body = reply.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 503") and "retry-after: 1" in head.lower()
        assert json.loads(body)["error"].startswith("busy: more than 4 connections are open (--max-connections)")
    finally:
        for s in idle:
            s.close()

    def served() -> bool:
        try:
            with urllib.request.urlopen(url + "/api/info", timeout=10) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            return e.code != 503 and False
    _wait(served)  # the slots come back as the idle connections close


def test_a_burst_of_mixed_requests_gets_only_answers_or_clear_refusals(bounded):
    """48 clients at once, good and bad requests mixed, against room for 4 connections and 2 waiting
    translations: each try gets the right translation, a 4xx naming the problem, or a 503 'busy' in JSON; no
    connection is dropped; and a client that retries after a 503, as its Retry-After says, gets its answer
    (within 60 s, whatever the machine's load)."""
    explorer, url, httpd = bounded
    sentences = ["a b c", "h g f e", "b b a", "d e f g h"]
    alone = {s: explorer.translate({"text": s, "beam": 2, "nbest": 1})["hypotheses"] for s in sentences}
    bad = [({"text": ""}, 400, "type a sentence"), ({"text": "a", "beam": 99}, 400, "from 1 to 6"),
           ({"text": "a " * 200}, 400, "limit is 200")]
    jobs = [({"text": s, "beam": 2, "nbest": 1}, 200, s) for s in sentences] * 9 + bad * 4

    def one(job):
        """(refusals on the way, the final status): a 503 is retried after a short random wait."""
        (body, expected, key), refused = job, 0
        rng = random.Random(json.dumps(body) + str(id(job)))
        end = time.monotonic() + 60
        while True:
            try:
                status, out = _post(url, body)
            except OSError as e:  # a dropped connection: a failure of this test
                return refused, None, repr(e)
            if status != 503:
                break
            assert out["error"].startswith("busy"), out  # the queue's, or the connection limit's
            refused += 1
            if time.monotonic() > end:
                return refused, 503, "still busy after 60 s"
            time.sleep(rng.uniform(0.05, 0.3))
        if expected == 200:
            assert status == 200 and out["hypotheses"] == alone[key]
        else:
            assert status == expected and key in out["error"]
        return refused, status, None

    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        results = list(pool.map(one, jobs))
    assert [r for r in results if r[2] is not None] == []
    assert sorted(status for _, status, _ in results) == sorted(expected for _, expected, _ in jobs)
    assert httpd.service.batcher.pending == 0
    for s in sentences:  # recovered
        status, out = _post(url, {"text": s, "beam": 2, "nbest": 1})
        assert status == 200 and out["hypotheses"] == alone[s]
