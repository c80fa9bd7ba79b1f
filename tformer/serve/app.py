"""The HTTP service: a Starlette app over one Translator, its Batcher (the model worker), and uvicorn serving
it on a socket. The routes are listed in tformer/serve/__init__.py.

    app = create_app(translator, Settings(...))          an ASGI app (Starlette); the worker starts with it
    server = Server(translator, "127.0.0.1", 0, settings) bound at once (server.url); .run() blocks until
                                                          SIGTERM/Ctrl-C or .stop(), finishing accepted work
    serve(translator, host, port, settings)               Server(...).run()

Requests are parsed and checked on the event loop; the model runs only on the Batcher's thread. Each request
waits for its answer at most its time limit (its `timeout` field, at most `Settings.timeout` seconds: then
504), and stops waiting when its client disconnects; either way its work is dropped if the worker has not
started it, and leaves the model call at the next decoding step if it has (the requests it was batched with
go on as they would have). Connections are served by tformer.serve.protocol (deadlines for headers, limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import itertools
import logging
import math
import signal
import socket
import threading
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tformer.api import Translation, Translator
from tformer.errors import ConfigError, TformerError
from tformer.serve import libretranslate
from tformer.serve.batcher import Batcher, Job
from tformer.serve.plans import TranslateRequest, decoding_json, translate_request
from tformer.serve.protocol import connection_class
from tformer.serve.requests import (RequestError, ScoreRequest, Settings, media_type, parse_json, read_body,
                                    score_request)

if TYPE_CHECKING:
    from tformer.explore import Explorer

log = logging.getLogger("tformer")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
PUBLIC = {"/v1/health", "/languages", "/openapi.json"}  # answered without the API key (LibreTranslate: /languages)


def abandoned(jobs: list[Job]) -> Callable[[int], bool]:
    """For one model call over the jobs' sentences, in order: is sentence i's job given up on (Job.abandoned)?"""
    owner = [job for job in jobs for _ in range(job.sentences)]
    return lambda i: owner[i].abandoned


def split_back(outputs: list, sizes: list[int]) -> list[list]:
    """One model call's outputs, in order, back into the requests they came from (`sizes` outputs each)."""
    starts = [0, *itertools.accumulate(sizes)]
    return [outputs[a:b] for a, b in zip(starts, starts[1:])]


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


# ------------------------------------------------------------------------------------------ the routes


class Service:
    """The routes over one Translator: each parses and checks its request here, hands the model work to the
    batcher and formats the answer."""

    def __init__(self, translator: Translator, settings: Settings, explorer: Explorer | None = None) -> None:
        if translator.reads_frames:
            raise ConfigError(f"{translator.path} reads feature frames (model.source=features); the server "
                              "translates text. Use `tformer transcribe` for frame models")
        if explorer is None:
            from tformer.explore import Explorer, Limits

            explorer = Explorer(translator, Limits.of(settings))
        self.translator = translator
        self.settings = settings
        self.explorer = explorer
        self.batcher = Batcher(settings.max_wait_ms / 1000, settings.batch_tokens, settings.max_queue)
        self.started = time.time()
        self.warmed: dict[int, float] = {}  # batch size -> seconds, by Server.warm_up

    def routes(self) -> list[Route]:
        e = self._endpoint
        return [
            Route("/v1/health", e(self.health), methods=["GET"]),
            Route("/v1/info", e(self.info), methods=["GET"]),
            Route("/v1/translate", e(self.translate), methods=["POST"]),
            Route("/v1/score", e(self.score), methods=["POST"]),
            Route("/translate", e(self.libre_translate), methods=["POST"]),
            Route("/languages", e(self.languages), methods=["GET", "POST"]),
            Route("/detect", e(self.libre_detect), methods=["POST"]),
            Route("/", e(self.page), methods=["GET"]),
            Route("/index.html", e(self.page), methods=["GET"]),
            Route("/api/info", e(self.explorer_info), methods=["GET"]),
            Route("/api/translate", e(self.explorer_translate), methods=["POST"]),
            Route("/openapi.json", e(self.openapi), methods=["GET"]),
        ]

    def _endpoint(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """`handler` with the API key checked (where one is set) and refusals turned into JSON errors."""
        async def endpoint(request: Request) -> Response:
            try:
                if request.url.path not in PUBLIC and request.url.path != "/translate":  # /translate: its body
                    self._authorize(request)
                return await handler(request)
            except RequestError as e:
                return error(e.status, str(e))
            except TformerError as e:  # what the API refused in the request: the input's fault
                return error(HTTPStatus.BAD_REQUEST, str(e))
            except (_ClientGone, ClientDisconnect):
                log.info("serve: %s %s: the client went away; its work is dropped", request.method, request.url.path)
                return Response(status_code=499)
        return endpoint

    def _authorize(self, request: Request, given: str | None = None) -> None:
        """401 without a key, 403 with a wrong one; nothing when the server has none."""
        key = self.settings.api_key
        if key is None:
            return
        auth = request.headers.get("authorization", "")
        header = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key")
        given = header or given
        if not given:
            raise RequestError("this server needs an API key: send it as 'Authorization: Bearer KEY' or "
                               "'X-API-Key: KEY' (LibreTranslate clients: the api_key field)", HTTPStatus.UNAUTHORIZED)
        if not hmac.compare_digest(given.encode("utf-8", "replace"), key.encode("utf-8")):
            raise RequestError("the API key is not valid", HTTPStatus.FORBIDDEN)

    async def _json_body(self, request: Request) -> Any:
        if media_type(request) != "application/json":
            raise RequestError("post JSON with Content-Type: application/json", HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
        return parse_json(await read_body(request, self.settings))

    async def _answer(self, request: Request, job: Job, timeout: float | None = None) -> Any:
        """Queue `job` and wait for its result, at most `timeout` seconds (default: the server's), while the
        client is there; on giving up, the job is cancelled (Batcher.cancel)."""
        timeout = self.settings.timeout if timeout is None else timeout
        future = self.batcher.submit(job)
        waiter = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({waiter, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is being forced down
            self.batcher.cancel(job)
            waiter.cancel()
            raise
        finally:
            gone.cancel()
        if waiter in done:
            return waiter.result()
        started = not self.batcher.cancel(job)
        waiter.cancel()
        if gone in done:
            raise _ClientGone()
        limit = "(--timeout)" if timeout == self.settings.timeout else "(the request's timeout)"
        raise RequestError(f"no answer within {timeout:g} s {limit}; the work "
                           f"{'was under way and left the model' if started else 'was dropped from the queue'}"
                           "; retry with fewer or shorter sentences, or later", HTTPStatus.GATEWAY_TIMEOUT)

    # ---------------------------------------------------------------------------------------- /v1

    async def openapi(self, request: Request) -> Response:
        from tformer.serve.openapi import openapi

        return JSONResponse(openapi(self.translator, self.settings, self.explorer.limits))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "uptime_seconds": round(time.time() - self.started, 1),
                             "pending_sentences": self.batcher.pending})

    async def info(self, request: Request) -> Response:
        t = self.translator
        cfg = t.config
        m = cfg.model
        universal = m.kind == "universal"
        compiled = getattr(t.model, "compiled_step", None)
        return JSONResponse({
            "checkpoint": str(t.path), "step": t.checkpoint.trainer.get("step"), "task": cfg.data.task,
            "languages": {"source": cfg.data.src_lang, "target": cfg.data.tgt_lang},
            "model": {"kind": m.kind, "d_model": m.d_model, "heads": m.n_heads, "d_ff": m.d_ff,
                      "encoder_layers": m.max_steps if universal else m.encoder_layers,
                      "decoder_layers": m.max_steps if universal else m.decoder_layers,
                      "attention": m.attention, "positions": m.positions, "norm": m.norm,
                      "parameters": sum(p.numel() for p in t.model.parameters())},
            "vocab": {"source": len(t.source_tokenizer.vocab), "target": len(t.target_tokenizer.vocab)},
            "decode": dataclasses.asdict(cfg.decode), "decoding": decoding_json(cfg.decode), "device": str(t.device),
            "limits": self.settings.limits(), "api_key_required": self.settings.api_key is not None,
            "batching": {"max_wait_ms": self.settings.max_wait_ms, "batch_tokens": self.settings.batch_tokens,
                         "max_queue": self.settings.max_queue, **self.batcher.snapshot()},
            "warm_up_seconds": {str(n): round(s, 3) for n, s in self.warmed.items()},
            "compiled_step": None if compiled is None else compiled.summary(),  # decode.compile
        })

    def _translate_job(self, req: TranslateRequest) -> Job:
        plan = req.plan
        return Job(self._translate_group, plan, plan.key, len(plan), max(plan.widths))

    def _translate_group(self, jobs: list[Job]) -> list[list[Translation]]:
        """The plans of jobs with one key, decoded in one Translator.run call (on the model thread); the
        sentences of a request given up on (Job.abandoned) leave it at the next step."""
        return self.translator.run([j.payload for j in jobs], cancelled=abandoned(jobs))

    async def translate(self, request: Request) -> Response:
        req = translate_request(await self._json_body(request), self.translator, self.settings)
        out = await self._answer(request, self._translate_job(req), req.timeout)
        return JSONResponse({"translations": [translation_json(t, req.nbest, req.alignment) for t in out],
                             "decoding": decoding_json(req.plan.decoding.cfg)})

    def _score_group(self, jobs: list[Job]) -> list[list]:
        reqs: list[ScoreRequest] = [j.payload for j in jobs]
        out = self.translator.score([s for r in reqs for s in r.sources], [t for r in reqs for t in r.targets],
                                    batch_size=self.settings.batch_tokens, batch_type="tokens",
                                    cancelled=abandoned(jobs))
        return split_back(out, [len(r.sources) for r in reqs])

    async def score(self, request: Request) -> Response:
        req = score_request(await self._json_body(request), self.translator, self.settings)
        out = await self._answer(request, Job(self._score_group, req, "score", len(req.sources), max(req.widths)),
                                 req.timeout)
        return JSONResponse({"scores": [{"log_prob": finite(s.log_prob), "tokens": s.tokens,
                                         "token_log_probs": [finite(x) for x in s.token_log_probs]} for s in out]})

    # ---------------------------------------------------------------------------------------- LibreTranslate

    async def languages(self, request: Request) -> Response:
        with contextlib.suppress(RequestError):  # the official client sends a (useless) form body with its GET
            await read_body(request, self.settings)
        return JSONResponse(libretranslate.languages(self.translator.config))

    async def libre_detect(self, request: Request) -> Response:
        body = libretranslate.parse_body(await read_body(request, self.settings), self._libre_kind(request))
        self._authorize(request, body.get("api_key") if isinstance(body, dict) else None)
        return JSONResponse(libretranslate.detect_request(body, self.translator))

    def _libre_kind(self, request: Request) -> str:
        """The media type of a LibreTranslate body: JSON or a form (RequestError otherwise)."""
        kind = media_type(request)
        if kind not in ("application/json", "application/x-www-form-urlencoded", "multipart/form-data", ""):
            raise RequestError("post JSON (Content-Type: application/json) or a form "
                               "(application/x-www-form-urlencoded)", HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
        if kind == "multipart/form-data":
            raise RequestError("Content-Type multipart/form-data is not read here: post a form "
                               "(application/x-www-form-urlencoded) or JSON",
                               HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
        return kind

    async def libre_translate(self, request: Request) -> Response:
        body = libretranslate.parse_body(await read_body(request, self.settings), self._libre_kind(request))
        self._authorize(request, body.get("api_key") if isinstance(body, dict) else None)
        asked = libretranslate.translate_request(body, self.translator, self.settings)
        out = await self._answer(request, self._translate_job(asked.request))
        return JSONResponse(libretranslate.answer(asked, out))

    # ---------------------------------------------------------------------------------------- the explorer

    async def page(self, request: Request) -> Response:
        from tformer.explore import PAGE

        return FileResponse(PAGE, media_type="text/html; charset=utf-8")

    async def explorer_info(self, request: Request) -> Response:
        return JSONResponse(self.explorer.info())

    async def explorer_translate(self, request: Request) -> Response:
        query = self.explorer.check(await self._json_body(request))

        def run(jobs: list[Job]) -> list[dict[str, Any]]:
            job = jobs[0]
            return [self.explorer.answer(job.payload, job.started_at - job.queued_at)]

        width = max(query.plan.widths) if query.plan is not None else len(query.pieces) + 1  # None: a forced target
        return JSONResponse(await self._answer(request, Job(run, query, None, 1, width)))  # alone: attention maps


def translation_json(t: Translation, nbest: bool, alignment: bool) -> dict[str, Any]:
    """One entry of /v1/translate's answer: the best hypothesis, and with nbest the whole list."""
    def hyp(h) -> dict[str, Any]:
        out: dict[str, Any] = {"text": h.text, "score": finite(h.score)}
        if alignment:
            out.update(tokens=h.tokens, alignment=[list(pair) for pair in h.alignment or []])
        return out

    entry = hyp(t.hypotheses[0])
    if alignment:
        entry["source_tokens"] = t.source_tokens
    if nbest:
        entry["hypotheses"] = [hyp(h) for h in t.hypotheses]
    return entry


def finite(x: float) -> float | None:
    """JSON has no infinities: an impossible log-probability is null."""
    return float(x) if math.isfinite(x) else None


def error(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == HTTPStatus.SERVICE_UNAVAILABLE else {}
    if status in (HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.REQUEST_ENTITY_TOO_LARGE):  # the body is not read on
        headers["Connection"] = "close"
    if status == HTTPStatus.UNAUTHORIZED:
        headers["WWW-Authenticate"] = 'Bearer realm="tformer"'
    return JSONResponse({"error": message}, status_code=int(status), headers=headers)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)


# ------------------------------------------------------------------------------------------ the app


class _Guard:
    """ASGI middleware: on a loopback-only server, only requests addressed to a loopback name (no DNS
    rebinding: a foreign name that resolves to 127.0.0.1 is refused); and headers every answer carries."""

    def __init__(self, app: ASGIApp, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.loopback_only:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip()
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]
            if name not in LOOPBACK:
                response = error(HTTPStatus.FORBIDDEN, f"this server answers requests to 127.0.0.1 or localhost, "
                                 f"not {host!r}; start it with --host to serve other names")
                await response(scope, receive, send)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [
                    (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(HTTPStatus.NOT_FOUND, f"no such endpoint: {request.method} {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.url.path} does not take {request.method}")


async def _bug(request: Request, exc: Exception) -> Response:  # logged with its traceback by Starlette/uvicorn
    return error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(exc).__name__}: {exc}")


def create_app(translator: Translator, settings: Settings = Settings(), *, explorer: Explorer | None = None,
               loopback_only: bool = True) -> Starlette:
    """The service's ASGI app (the routes of tformer.serve) over `translator`. Its model worker starts now and
    finishes its accepted work when the app shuts down. `explorer`: the page's Explorer (default: one with
    the settings' limits). `loopback_only`: answer only requests addressed to 127.0.0.1/localhost."""
    service = Service(translator, settings, explorer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.batcher.close, settings.timeout + 5)  # a stuck model: give up
        s = service.batcher.stats
        log.info("serve: stopped after %d requests (%d sentences in %d model calls; %d dropped)", s.jobs,
                 s.sentences, s.batches, s.dropped)

    app = Starlette(routes=service.routes(), lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed, Exception: _bug})
    app.add_middleware(_Guard, loopback_only=loopback_only)
    app.state.service = service
    return app


# ------------------------------------------------------------------------------------------ serving


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host} port {port} (--host, --port): {e.strerror or e}") from None
    sock.listen(2048)  # connections wait in the backlog until uvicorn runs: the URL is usable once printed
    sock.set_inheritable(True)
    return sock


class Server:
    """The service bound to host:port (port 0: any free one), served by uvicorn in the calling thread."""

    def __init__(self, translator: Translator, host: str = "127.0.0.1", port: int = 8000,
                 settings: Settings = Settings(), *, explorer: Explorer | None = None) -> None:
        import uvicorn

        self.socket = _bind(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        self.app = create_app(translator, settings, explorer=explorer, loopback_only=host in LOOPBACK)
        self.service: Service = self.app.state.service
        if host not in LOOPBACK and settings.api_key is None:
            log.warning("serve: listening on %s without an API key: anyone who can reach this address can use the "
                        "model (--api-key or TFORMER_API_KEY)", host)
        config = uvicorn.Config(self.app, http=connection_class(settings), lifespan="on", log_config=None,
                                log_level="warning", access_log=False, server_header=False, timeout_keep_alive=5,
                                timeout_graceful_shutdown=int(settings.timeout) + 5)
        self.uvicorn = uvicorn.Server(config)

    def warm_up(self) -> dict[int, float]:
        """Decode made-up batches of the sizes Settings.warm_up asks for (Translator.warm_up), before `run`; the
        seconds per size, also in /v1/info."""
        self.service.warmed = self.service.translator.warm_up(self.service.settings.warm_up_sizes())
        return self.service.warmed

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{shown}:{self.port}/"

    @property
    def started(self) -> bool:
        return self.uvicorn.started

    def run(self) -> None:
        """Serve until SIGTERM or Ctrl-C (in the main thread) or stop(): then stop accepting connections,
        answer every request already accepted, and return."""
        with _signals_after_shutdown_ignored():
            self.uvicorn.run(sockets=[self.socket])

    def stop(self) -> None:
        """Ask run() to shut down gracefully (from any thread)."""
        self.uvicorn.should_exit = True


@contextlib.contextmanager
def _signals_after_shutdown_ignored():
    """uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the handler it found;
    that handler does nothing here, so run() returns normally."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(translator: Translator, host: str = "127.0.0.1", port: int = 8000, settings: Settings = Settings(),
          *, explorer: Explorer | None = None) -> None:
    """Serve `translator` on host:port until SIGTERM or Ctrl-C (see Server.run)."""
    Server(translator, host, port, settings, explorer=explorer).run()
