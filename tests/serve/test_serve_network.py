"""tformer serve on an untrusted network: a client that trickles its headers or its body is cut off with a 408
after its deadline and the server goes on serving; a request past the connection limit, or one that is not
HTTP, gets a JSON error (503 with Retry-After, 400); a request past its time limit leaves the model call it
was merged into while the requests batched with it get the answers they would have had alone; memory stays
flat under a flood of malformed requests, and every well-formed request sent among them is answered right.

Every client here talks to 127.0.0.1 only, with request loops bounded in count and time. The model is the
committed tests/fixtures/checkpoint_v1 (nothing is trained).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import socket
import threading
import time

import pytest
from helpers.oracles import REL
from helpers.serve import CHECKPOINT, LINES, _start, _wait, call, live

import tformer
from tformer.serve import Settings


@pytest.fixture(scope="module")
def translator():
    return tformer.load(CHECKPOINT, device="cpu")


def _split(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-case headers, body) of one raw HTTP/1.1 answer."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return int(lines[0].split()[1]), headers, body


def _trickle(port: int, data: bytes, every: float, seconds: float) -> tuple[bytes, float]:
    """Send `data` one byte each `every` seconds (and nothing after it), reading all the while, until the
    server closes the connection or `seconds` pass: (everything read, seconds until the close)."""
    tic = time.monotonic()
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.settimeout(every)
        sent = 0
        while time.monotonic() - tic < seconds:
            if sent < len(data):
                with contextlib.suppress(OSError):
                    s.send(data[sent:sent + 1])
                sent += 1
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # reset: the server is gone from this connection
                break
            if not chunk:
                break
            reply += chunk
    return reply, time.monotonic() - tic


def _read_response(s: socket.socket) -> bytes:
    """One whole answer (headers and Content-Length body) from `s`, or what came before the server closed."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(65536)
        if not chunk:
            return reply
        reply += chunk
    _, headers, body = _split(reply)
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return reply.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


HEAD = b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


# ------------------------------------------------------------------------------------------ slow clients


# A deadline of DEADLINE seconds must cut a client off within CUT_OFF: never before it (the clocks below start
# before the server's can), and at most 1.5 s late for scheduler noise on a busy 2-core machine, well under the
# 5 s that a deadline 5 times too long would take (and 0 or 0.2 s, a deadline too short, is under the floor).
DEADLINE = 1.0
CUT_OFF = (DEADLINE, 2.5 * DEADLINE)


def test_a_client_that_trickles_its_headers_gets_408_at_the_header_deadline(translator):
    with live(translator, header_timeout=DEADLINE) as (srv, url):
        reply, seconds = _trickle(srv.port, HEAD + b"X-Slow: " + b"a" * 500, every=0.05, seconds=20)
        status, headers, body = _split(reply)
        assert status == 408 and headers["connection"] == "close" and headers["content-type"] == "application/json"
        assert "did not arrive within 1 s (--header-timeout)" in json.loads(body)["error"]
        # the deadline counts from the connection, whatever the bytes sent
        assert CUT_OFF[0] <= seconds <= CUT_OFF[1], f"cut off after {seconds:.2f} s, not within {CUT_OFF} s"
        reply, seconds = _trickle(srv.port, b"", every=0.05, seconds=20)  # connected, silent: the same
        assert _split(reply)[0] == 408
        assert CUT_OFF[0] <= seconds <= CUT_OFF[1], f"silent: cut off after {seconds:.2f} s, not within {CUT_OFF} s"
        status, out, _ = call(url, "/v1/translate", {"src": [LINES[0]]})  # the server goes on
        assert status == 200 and out["translations"][0]["text"] == translator.translate([LINES[0]])[0].text


def test_the_deadline_restarts_after_each_answer_on_a_keep_alive_connection(translator):
    """Two requests on one connection, the second sent 1.6 s after the first's answer: within the 3 s header
    deadline counted from that answer, though the connection is then older than 3 s."""
    with live(translator, header_timeout=3.0) as (srv, url):
        body = json.dumps({"src": [LINES[0]]}).encode()
        request = HEAD + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            tic = time.monotonic()
            time.sleep(1.6)
            s.sendall(request)
            first = _read_response(s)
            time.sleep(1.6)
            s.sendall(request)
            second = _read_response(s)
            assert time.monotonic() - tic > 3.0
        assert _split(first)[0] == 200 and _split(second)[0] == 200


def test_a_client_that_trickles_its_body_gets_408_at_the_body_deadline(translator):
    with live(translator, body_timeout=DEADLINE) as (srv, url):
        body = json.dumps({"src": [LINES[0]]}).encode()
        start = HEAD + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            tic = time.monotonic()  # before the server has the headers, so before its body deadline starts
            s.sendall(start + body[:5])  # the headers at once, then 5 bytes of the body
            reply, _ = _trickle_rest(s, body[5:], every=0.3, seconds=20)  # 35 bytes more: 10.5 s, were it let
            seconds = time.monotonic() - tic
        status, headers, out = _split(reply)
        assert status == 408 and headers["connection"] == "close"
        assert "the request body did not arrive within 1 s (--body-timeout)" in json.loads(out)["error"]
        assert CUT_OFF[0] <= seconds <= CUT_OFF[1], f"cut off after {seconds:.2f} s, not within {CUT_OFF} s"
        assert srv.service.batcher.stats.jobs == 0  # nothing reached the model
        assert call(url, "/v1/translate", {"src": [LINES[0]]})[0] == 200


def _trickle_rest(s: socket.socket, data: bytes, every: float, seconds: float) -> tuple[bytes, float]:
    tic = time.monotonic()
    reply = b""
    s.settimeout(every)
    for i in range(int(seconds / every)):
        if i < len(data):
            with contextlib.suppress(OSError):
                s.send(data[i:i + 1])
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        reply += chunk
    return reply, time.monotonic() - tic


def test_many_slow_clients_are_all_cut_off_and_the_server_serves_again(translator):
    """30 connections trickling headers against a limit of 8: while they are open, a good request is answered
    503 in JSON with Retry-After; all 30 are cut off at the header deadline; then good requests are served."""
    with live(translator, header_timeout=2.0, max_connections=8) as (srv, url):
        with concurrent.futures.ThreadPoolExecutor(30) as pool:
            slow = [pool.submit(_trickle, srv.port, HEAD + b"X-Slow: " + b"a" * 500, 0.1, 20) for _ in range(30)]
            _wait(lambda: len(srv.uvicorn.server_state.connections) >= 30)
            status, out, headers = call(url, "/v1/health")
            assert status == 503 and headers["Retry-After"] == "1" and headers["Content-Type"] == "application/json"
            assert "more than 8 connections are open (--max-connections)" in out["error"]
            results = [f.result(timeout=60) for f in slow]
        assert all(_split(reply)[0] == 408 for reply, _ in results)
        _wait(lambda: not srv.uvicorn.server_state.connections)
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:3]})
        assert status == 200 and [t["text"] for t in out["translations"]] == \
            [t.text for t in translator.translate(LINES[:3])]


def test_past_the_connection_limit_a_request_gets_503_json_and_the_limit_frees(translator):
    with live(translator, max_connections=3) as (srv, url):
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(3)]
        try:
            _wait(lambda: len(srv.uvicorn.server_state.connections) == 3)
            status, out, headers = call(url, "/v1/translate", {"src": [LINES[0]]})
            assert status == 503 and headers["Retry-After"] == "1" and headers["Connection"] == "close"
            assert out["error"].startswith("busy: more than 3 connections are open (--max-connections)")
        finally:
            for s in idle:
                s.close()
        _wait(lambda: not srv.uvicorn.server_state.connections)
        assert call(url, "/v1/translate", {"src": [LINES[0]]})[0] == 200


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",  # no request line
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000,  # 70 KB of headers that do not end
    HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",  # a broken chunked body
], ids=["request-line", "endless-headers", "chunked"])
def test_what_is_not_http_gets_400_json(translator, data):
    with live(translator) as (srv, url):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(data)
            reply = b""
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    reply += chunk
        status, headers, body = _split(reply)
        assert status == 400 and headers["content-type"] == "application/json"
        assert "not a valid HTTP/1.1 request" in json.loads(body)["error"]
        assert call(url, "/v1/health")[0] == 200


# ------------------------------------------------------------------------------------------ time limits


def test_a_request_past_its_time_limit_leaves_the_model_call_and_its_company_gets_its_answers(translator):
    """Requests A (timeout 4 s) and B (none) are decoded in one beam search. At its 3rd step the search waits
    until A has had its 504; from the next step on it decodes B's hypotheses alone, exactly as many as B
    alone has at those steps, and B's answer is the library's."""
    model = translator.model
    step = model.decode_step
    rows: list[int] = []
    a_answered = threading.Event()

    def spy(prev, cache):
        rows.append(prev.shape[0])
        if len(rows) == 3:
            a_answered.wait(60)
        return step(prev, cache)

    a_lines, b_lines = LINES[:4], LINES[6:10]
    with live(translator, max_wait_ms=50) as (srv, url):
        gate = threading.Event()  # hold the model thread until both requests are queued
        srv.service.batcher.call(gate.wait, sentences=0)
        model.decode_step = spy
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                a = pool.submit(call, url, "/v1/translate", {"src": a_lines, "beam": 4, "timeout": 4})
                _wait(lambda: srv.service.batcher.pending == 4)
                b = pool.submit(call, url, "/v1/translate", {"src": b_lines, "beam": 4})
                _wait(lambda: srv.service.batcher.pending == 8)
                gate.set()
                status, out, _ = a.result(timeout=60)
                assert status == 504 and "no answer within 4 s (the request's timeout)" in out["error"]
                assert "was under way and left the model" in out["error"]
                a_answered.set()
                status, out, _ = b.result(timeout=60)
        finally:
            a_answered.set()
            gate.set()
            del model.decode_step
        assert srv.service.batcher.stats.abandoned == 1 and srv.service.batcher.stats.batches == 2
    want = translator.translate(b_lines, beam=4)
    assert status == 200 and [t["text"] for t in out["translations"]] == [t.text for t in want]
    assert [t["score"] for t in out["translations"]] == pytest.approx([t.score for t in want], rel=REL, abs=REL)
    together, alone = _rows(translator, a_lines + b_lines), _rows(translator, b_lines)
    assert rows[:3] == together[:3] and together[2] > alone[2]  # A was in the call
    assert rows[3:] == alone[3:]  # then only B's hypotheses, step for step


def _rows(translator, lines: list[str]) -> list[int]:
    """Hypotheses the beam search decodes at each step for `lines` in one call."""
    model, step, seen = translator.model, translator.model.decode_step, []

    def spy(prev, cache):
        seen.append(prev.shape[0])
        return step(prev, cache)

    model.decode_step = spy
    try:
        translator.translate(lines, beam=4, batch_size=4096, batch_type="tokens")
    finally:
        del model.decode_step
    return seen


def test_a_time_limit_is_a_number_within_the_servers(translator):
    with live(translator, timeout=5) as (srv, url):
        for bad in (0, -1, 6, "1", True):
            status, out, _ = call(url, "/v1/translate", {"src": [LINES[0]], "timeout": bad})
            assert status == 400 and out["error"].startswith("timeout: must be a number of seconds > 0 and at most 5")
        assert call(url, "/v1/score", {"src": [LINES[0]], "tgt": ["DOG"], "timeout": 2.5})[0] == 200


def test_deadlines_are_positive_numbers_of_seconds():
    for name, flag in (("header_timeout", "--header-timeout"), ("body_timeout", "--body-timeout"),
                       ("timeout", "--timeout")):
        for bad in (0, -1.5, float("nan"), float("inf"), "10", True):
            with pytest.raises(tformer.ConfigError, match=f"{flag} must be a number of seconds > 0, got"):
                Settings(**{name: bad})


# ------------------------------------------------------------------------------------------ a flood


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def _post(body: bytes, content_type: bytes = b"application/json", path: bytes = b"/v1/translate") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


BAD_REQUESTS = [  # (raw bytes, the status it must get)
    (_post(b'{"src":'), 400),  # JSON cut short
    (_post(b'{"src": [1]}'), 400),  # a number for a sentence
    (_post(b'{"src": ["\xff"]}'), 400),  # not UTF-8
    (_post(b"[[[[]]]]]"), 400),
    (_post(b'{"src": ["a"], "beam": 99, "x": 1}'), 400),
    (_post(b'{"src": ["a"], "tgt": []}', path=b"/v1/score"), 400),
    (_post(b"q=a&source=en&target=xx", b"application/x-www-form-urlencoded", b"/translate"), 400),
    (HEAD + b"Content-Length: 9999999\r\n\r\n", 413),  # announced over --max-body, none sent
    (_post(b"hi", b"text/plain"), 415),
    (b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404),
    (b"BREW /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"b" * 70_000, 400),  # headers that do not end
    (b"GARBAGE\r\n\r\n", 400),
]


def _bad(port: int, data: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        return _split(_read_response(s))[0]


def test_memory_stays_flat_under_a_flood_of_malformed_requests(translator):
    """A `tformer serve` process takes 2 rounds of 1,600 malformed requests (13 kinds) from 8 clients, with a
    well-formed request after every 30th: every bad one gets its 4xx, every good one its right answer, and the
    process grows by less than 8 MiB over the second round (a leak of 5 KiB per request would show 8 MiB)."""
    proc, url = _start("--max-connections", "64")
    port = int(url.rsplit(":", 1)[1])
    want = translator.translate(LINES[:2])[1].text

    def client(n: int, seed: int) -> list[tuple[int, int]]:
        rng = random.Random(seed)
        got = []
        for i in range(n):
            data, status = BAD_REQUESTS[rng.randrange(len(BAD_REQUESTS))]
            got.append((_bad(port, data), status))
            if i % 30 == 29:
                code, out, _ = call(url, "/v1/translate", {"src": [LINES[1]]})
                got.append((code if out.get("translations", [{}])[0].get("text") == want else -code, 200))
        return got

    try:
        rounds = []
        for _ in range(2):
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(client, 200, seed) for seed in range(8)]
                results = [r for f in futures for r in f.result()]
            assert [got for got, wanted in results if got != wanted] == []
            rounds.append(_rss_kib(proc.pid))
        assert rounds[1] - rounds[0] < 8 * 1024, rounds
    finally:
        proc.kill()
        proc.wait(30)
