"""`tformer explore`: a local web page to translate sentences and look inside the model.

    Explorer(translator or checkpoint)   a tformer.api.Translator and the limits; .translate(request) -> dict
    make_server(explorer, host, port)    a ThreadingHTTPServer serving the page and the JSON API
    serve(explorer, host, port)          run it until Ctrl-C

HTTP API (JSON in, JSON out; errors are {"error": message} with status 400, 403, 404, 413, 415, 503 or 500):

    GET  /                 the page (tformer/web/explorer.html: one file, no network resources)
    GET  /api/info         model shape (kinds, layers, heads), decoding defaults, input limits, examples
    POST /api/translate    {"text": str, "beam": int, "nbest": int, "target": str (optional: force a translation)}
                           -> {"source": {...}, "hypotheses": [{"text", "score", "pieces", "labels",
                               "attention": {kind: [layer][head][query][key]}, "steps"}], "seconds": ...}

Requests are served by threads (several at once); the model runs in one worker thread that takes them in
turn: PyTorch already uses every core for one request, so on a CPU this is also the fastest order.
Load is bounded twice: at most `Limits.max_queue` translations wait for the model (more get 503 with
Retry-After at once, so memory and latency stay bounded), and at most `max_connections` connections are
open (more get 503 before their request is read); a client has `_Handler.timeout` seconds to send one.

The server binds 127.0.0.1 unless told otherwise: it has no authentication, so expose it to a network only
behind something that does. Bound to loopback it answers only requests addressed to a loopback name (no DNS
rebinding), and it takes only application/json posts (a cross-site form cannot post to it without the
browser asking first, and it never says yes).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from tformer.api import Translator, load
from tformer.errors import ConfigError, TformerError
from tformer.inspection import KINDS

log = logging.getLogger("tformer")
PAGE = Path(__file__).resolve().parent / "web" / "explorer.html"
MAX_BODY = 64 * 1024  # bytes of one request
FIELDS = {"text", "beam", "nbest", "target"}


class RequestError(TformerError):
    """A request the explorer refuses; the message is shown on the page."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Limits:
    max_chars: int = 1000  # characters of input text
    max_tokens: int = 200  # source pieces after tokenisation
    max_beam: int = 16
    max_nbest: int = 8
    max_queue: int = 8  # translations waiting for (or in) the model; more are answered 503 at once


class Explorer:
    """A Translator (tformer.api) made ready to answer explorer requests; given a path, it loads one."""

    def __init__(self, translator: Translator | str | Path, limits: Limits = Limits(), overrides: list[str] = (),
                 which: str = "best") -> None:
        if not isinstance(translator, Translator):
            translator = load(translator, which=which, overrides=list(overrides), device="cpu")
        if translator.reads_frames:
            raise ConfigError(f"{translator.path} reads feature frames (model.source=features); the explorer "
                              "translates typed text. Use `tformer transcribe` for frame models")
        self.translator = translator
        self.limits = limits
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tformer-model")
        self._pending = 0  # translations accepted and not yet answered
        self._lock = threading.Lock()
        self.name = str(translator.path)
        self.examples = self._examples()
        d = translator.config.decode
        self.defaults = {"beam": min(d.beam_size, limits.max_beam),
                         "nbest": min(max(d.nbest, 3), d.beam_size, limits.max_nbest)}

    def _examples(self) -> list[str]:
        """A few validation sources to try (when the data is at hand), else none."""
        try:
            return [s for s in self.translator.load_split("valid").texts["valid"][0] if len(s) <= 120][:5]
        except Exception as e:  # the page works without examples; say why there are none
            log.info("explorer: no example sentences (%s)", e)
            return []

    def info(self) -> dict[str, Any]:
        cfg = self.translator.config
        m = cfg.model
        universal = m.kind == "universal"
        layers = ({"encoder": m.max_steps, "decoder": m.max_steps, "cross": m.max_steps} if universal else
                  {"encoder": m.encoder_layers, "decoder": m.decoder_layers, "cross": m.decoder_layers})
        return {"checkpoint": self.name, "step": self.translator.checkpoint.trainer.get("step"),
                "task": cfg.data.task, "languages": [cfg.data.src_lang, cfg.data.tgt_lang],
                "model": {"kind": m.kind, "layers": layers, "heads": m.n_heads, "d_model": m.d_model,
                          "layer_name": "step" if universal else "layer", "attention": m.attention,
                          "positions": m.positions, "norm": m.norm},
                "defaults": self.defaults,
                "limits": dataclasses.asdict(self.limits), "examples": self.examples}

    def _parse(self, request: Any) -> tuple[str, int, int, str | None]:
        if not isinstance(request, dict):
            raise RequestError("the request must be a JSON object such as {\"text\": \"...\", \"beam\": 5}")
        unknown = set(request) - FIELDS
        if unknown:
            raise RequestError(f"unknown field(s) {', '.join(sorted(unknown))}; the fields are "
                               f"{', '.join(sorted(FIELDS))}")
        text = request.get("text")
        if not isinstance(text, str):
            raise RequestError("'text' must be a string: the sentence to translate")
        text = text.strip()
        if not text:
            raise RequestError("type a sentence to translate")
        if len(text) > self.limits.max_chars:
            raise RequestError(f"the sentence has {len(text)} characters; the limit is {self.limits.max_chars} "
                               "(start the explorer with a larger --max-chars to change it)")
        beam, nbest = request.get("beam", self.defaults["beam"]), request.get("nbest", self.defaults["nbest"])
        for name, value, top in (("beam", beam, self.limits.max_beam), ("nbest", nbest, self.limits.max_nbest)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise RequestError(f"'{name}' must be a whole number from 1 to {top}, got {value!r}")
        if nbest > beam:
            raise RequestError(f"nbest ({nbest}) cannot exceed the beam size ({beam}): a beam of {beam} keeps "
                               f"{beam} hypotheses")
        target = request.get("target")
        if target is not None and (not isinstance(target, str) or not target.strip()):
            raise RequestError("'target' must be a non-empty string (a translation to force), or left out")
        if target is not None and len(target) > self.limits.max_chars:
            raise RequestError(f"the forced target has {len(target)} characters; the limit is "
                               f"{self.limits.max_chars}")
        return text, beam, nbest, target

    def _run(self, text: str, beam: int, nbest: int, target: str | None) -> list[dict[str, Any]]:
        """The hypotheses with their attention: the model's n-best list, or the forced target scored."""
        if target is not None:
            forced = self.translator.score([text], [target], return_attention=True)[0]
            hyps = [(target, forced.log_prob, forced.tokens[:-1], forced.attention)]
        else:
            out = self.translator.translate([text], beam=beam, nbest=nbest, return_attention=True)[0]
            hyps = [(h.text, h.score, h.tokens, h.attention) for h in out.hypotheses]
        return [{"text": hyp_text, "score": round(score, 4), "pieces": pieces,
                 "labels": {k: dict(zip(("queries", "keys"), maps.labels(k))) for k in KINDS},
                 "attention": {k: _rounded(maps.weights[k]) for k in KINDS},
                 "steps": None if maps.steps is None else {"source": maps.steps[0], "target": maps.steps[1]}}
                for hyp_text, score, pieces, maps in hyps]

    def translate(self, request: Any) -> dict[str, Any]:
        """Answer one /api/translate request (see the module docstring)."""
        text, beam, nbest, target = self._parse(request)
        pieces = self.translator.pieces(self.translator.encode(text), "source")
        if len(pieces) > self.limits.max_tokens:
            raise RequestError(f"the sentence is {len(pieces)} pieces long; the limit is {self.limits.max_tokens} "
                               "(--max-tokens)")
        tic = time.perf_counter()
        started = []

        def run():
            started.append(time.perf_counter())
            return self._run(text, beam, nbest, target)

        with self._lock:
            if self._pending >= self.limits.max_queue:
                raise RequestError(f"busy: {self._pending} translations are waiting for the model (the limit is "
                                   f"{self.limits.max_queue}, --max-queue); retry in a moment",
                                   HTTPStatus.SERVICE_UNAVAILABLE)
            self._pending += 1
        try:
            hypotheses = self.worker.submit(run).result()
        finally:
            with self._lock:
                self._pending -= 1
        waited = started[0] - tic
        return {"source": {"text": text, "pieces": pieces}, "hypotheses": hypotheses,
                "decode": {"beam": beam, "nbest": nbest, "forced": target is not None},
                "seconds": round(time.perf_counter() - tic - waited, 4), "queued_seconds": round(waited, 4)}


def _rounded(w: np.ndarray) -> list:
    """(layers, H, Lq, Lk) floats -> nested lists, 4 decimals, NaN (halted positions) as null."""
    values = np.round(w.astype(np.float64), 4)
    if not np.isnan(values).any():
        return values.tolist()
    return np.where(np.isnan(values), None, values).tolist()


# ------------------------------------------------------------------------------------------ HTTP


LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class _Handler(BaseHTTPRequestHandler):
    explorer: Explorer  # set on the subclass make_server builds
    loopback_only = True  # answer only requests addressed to a loopback name (set by make_server)
    server_version = "tformer-explore"
    timeout = 20  # seconds a client may take to send its request (then the connection is closed)

    def _host_ok(self) -> bool:
        if not self.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name in LOOPBACK:
            return True
        self._json(HTTPStatus.FORBIDDEN, {"error": f"this explorer answers requests to 127.0.0.1 or localhost, not "
                                                   f"{host!r}; start it with --host to serve other names"})
        return False

    def log_message(self, fmt: str, *args) -> None:  # through logging, not stderr
        log.debug("explore %s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802
        if not self._host_ok():
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, PAGE.read_bytes(), "text/html; charset=utf-8")
        elif path == "/api/info":
            self._json(HTTPStatus.OK, self.explorer.info())
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})

    def do_POST(self) -> None:  # noqa: N802
        if not self._host_ok():
            return
        path = self.path.split("?", 1)[0]
        if path != "/api/translate":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})
            return
        if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
            self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "post JSON with Content-Type: application/json"})
            self.close_connection = True
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       {"error": f"the request must have a Content-Length of at most {MAX_BODY} bytes"})
            self.close_connection = True
            return
        try:
            try:
                request = json.loads(self.rfile.read(length).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise RequestError(f"the request is not UTF-8 JSON ({e})") from None
            self._json(HTTPStatus.OK, self.explorer.translate(request))
        except RequestError as e:
            self._json(e.status, {"error": str(e)})
        except TformerError as e:  # what the API refused in the request: the input's fault
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except Exception as e:  # never take the server down; say what happened
            log.exception("explore: request failed")
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(e).__name__}: {e}"})


_BUSY = json.dumps({"error": "busy: too many open connections; retry in a moment"}).encode()
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
                 b"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + str(len(_BUSY)).encode() +
                 b"\r\n\r\n" + _BUSY)


def _refuse(sock, deadline: float = 0.5) -> None:
    """Answer 503 on a connection over the limit. The request is read first (headers and Content-Length
    bytes, at most MAX_BODY + 16 KiB, at most `deadline` seconds: this runs in the accepting thread), so
    closing does not reset the connection before the client has read the answer."""
    end = time.monotonic() + deadline
    data = b""
    try:
        while time.monotonic() < end and len(data) < MAX_BODY + (16 << 10):
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if len(body) >= min(int(m.group(1)) if m else 0, MAX_BODY):
                    break
            sock.settimeout(max(end - time.monotonic(), 0.01))
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        sock.sendall(BUSY_RESPONSE)
    except OSError:
        pass


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once: the next one gets 503 and is closed
    before its request is read (a flood of clients cannot exhaust threads or memory)."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog: a burst waits in the kernel instead of being refused

    def __init__(self, address, handler, max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def make_server(explorer: Explorer, host: str = "127.0.0.1", port: int = 8000,
                max_connections: int = 64) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"explorer": explorer, "loopback_only": host in LOOPBACK})
    return _Server((host, port), handler, max_connections)


def serve(explorer: Explorer, host: str = "127.0.0.1", port: int = 8000, max_connections: int = 64) -> None:
    server = make_server(explorer, host, port, max_connections)
    shown = host if ":" not in host else f"[{host}]"
    print(f"tformer explore: serving {explorer.name} at http://{shown}:{server.server_port}/  (Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
