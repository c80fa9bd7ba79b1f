"""The HTTP service: a Starlette app over the server's models (tformer.serve.models: one Translator or several,
each with its Batcher, the model worker). The routes are listed in tformer/serve/__init__.py.

    app = create_app(translator, Settings(...))          an ASGI app (Starlette); the workers start with it
    app = create_app({"en-de": t1, "multi": t2}, settings)  several models, routed by their languages
    (serving it on a socket: tformer.serve.server)

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
import os
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tformer.api import Translation, Translator
from tformer.errors import TformerError
from tformer.serve import libretranslate
from tformer.serve.batcher import Batcher, Job
from tformer.serve.models import Model, Models, Routed
from tformer.serve.plans import TranslateRequest, decoding_json, translate_request
from tformer.serve.requests import (RequestError, ScoreRequest, Settings, media_type, parse_json, read_body,
                                    score_request)

if TYPE_CHECKING:
    from tformer.explore import Explorer

log = logging.getLogger("tformer")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
PUBLIC = {"/v1/health", "/languages", "/openapi.json", "/frontend/settings"}  # answered without the API key
SWAGGER_FILES = ("swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png")  # swagger-ui-py's static files
SWAGGER_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tformer serve: API</title>
<link rel="stylesheet" href="/docs/swagger-ui.css"><link rel="icon" href="/docs/favicon-32x32.png"></head>
<body><div id="swagger-ui"></div><script src="/docs/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui"});</script></body></html>
"""


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
    """The routes over the server's models (tformer.serve.models): each parses and checks its request here, hands
    the model work to that model's batcher and formats the answer. Scoring and the explorer use the first."""

    def __init__(self, models: Models, settings: Settings, explorer: Explorer | None = None) -> None:
        if explorer is None:
            from tformer.explore import Explorer, Limits

            explorer = Explorer(models.default.translator, Limits.of(settings))
        self.models = models
        self.translator = models.default.translator
        self.settings = settings
        self.explorer = explorer
        self.batcher = models.default.batcher
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
            Route("/frontend/settings", e(self.frontend_settings), methods=["GET"]),
            Route("/docs", e(self.docs), methods=["GET"]),
            Route("/docs/{name}", e(self.docs_file), methods=["GET"]),
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

    async def _answer(self, request: Request, job: Job, timeout: float | None = None,
                      batcher: Batcher | None = None) -> Any:
        """Queue `job` (on `batcher`, default the first model's) and wait for its result, at most `timeout`
        seconds (default: the server's), while the client is there; on giving up, the job is cancelled."""
        timeout = self.settings.timeout if timeout is None else timeout
        batcher = batcher or self.batcher
        future = batcher.submit(job)
        waiter = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({waiter, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is being forced down
            batcher.cancel(job)
            waiter.cancel()
            raise
        finally:
            gone.cancel()
        if waiter in done:
            return waiter.result()
        started = not batcher.cancel(job)
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

        return JSONResponse(openapi(self.models, self.settings, self.explorer.limits))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "uptime_seconds": round(time.time() - self.started, 1),
                             "pending_sentences": sum(m.batcher.pending for m in self.models)})

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
            "models": [{"name": m.name, "checkpoint": str(m.translator.path), "pairs": [f"{a}-{b}" for a, b in m.pairs],
                        "pending_sentences": m.batcher.pending} for m in self.models],
            "pivot": self.settings.pivot,
        })

    def _translate_job(self, req: TranslateRequest, model: Model) -> Job:
        plan = req.plan

        def run(jobs: list[Job]) -> list[list[Translation]]:
            """Plans of one key, decoded in one Translator.run call (on the model's thread); the sentences of a
            request given up on (Job.abandoned) leave it at the next step."""
            return model.translator.run([j.payload for j in jobs], cancelled=abandoned(jobs))

        return Job(run, plan, plan.key, len(plan), max(plan.widths))

    async def _translate(self, request: Request, routed: Routed) -> tuple[list[Translation], TranslateRequest]:
        """A request's translations along its route: each leg on its model's batcher, a later leg translating
        what the leg before it wrote, all within the request's time limit. Returns the last leg's request too."""
        req, deadline = routed.first, time.monotonic() + routed.first.timeout
        out = []
        for k, leg in enumerate(routed.route.legs):
            if k:
                req = routed.next_leg(leg, [t.text for t in out])
            out = await self._answer(request, self._translate_job(req, leg.model),
                                     max(0.001, deadline - time.monotonic()) if k else req.timeout, leg.model.batcher)
        return out, req

    async def translate(self, request: Request) -> Response:
        routed = translate_request(await self._json_body(request), self.models, self.settings)
        out, req = await self._translate(request, routed)
        answer = {"translations": [translation_json(t, req.nbest, req.alignment) for t in out],
                  "decoding": decoding_json(req.plan.decoding.cfg)}
        if len(self.models.models) > 1 or routed.route.pivot:
            answer["models"] = [leg.model.name for leg in routed.route.legs]
        if routed.route.pivot:
            answer["pivot"] = routed.route.pivot
        return JSONResponse(answer)

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
        return JSONResponse(libretranslate.languages(self.models))

    async def frontend_settings(self, request: Request) -> Response:
        return JSONResponse(libretranslate.frontend_settings(self.models, self.settings))

    async def docs(self, request: Request) -> Response:
        """The interactive API page over /openapi.json (Swagger UI, served from its package: no CDN)."""
        return Response(SWAGGER_PAGE, media_type="text/html; charset=utf-8")

    async def docs_file(self, request: Request) -> Response:
        from swagger_ui import __file__ as package

        name = request.path_params["name"]
        if name not in SWAGGER_FILES:
            raise RequestError(f"no such file: /docs/{name}", HTTPStatus.NOT_FOUND)
        return FileResponse(os.path.join(os.path.dirname(package), "static", name))

    async def libre_detect(self, request: Request) -> Response:
        body = libretranslate.parse_body(await read_body(request, self.settings), self._libre_kind(request))
        self._authorize(request, body.get("api_key") if isinstance(body, dict) else None)
        return JSONResponse(libretranslate.detect_request(body, self.models))

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
        asked = libretranslate.translate_request(body, self.models, self.settings)
        out, _ = await self._translate(request, asked.routed)
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


def served(models: Translator | Mapping[str, Translator] | Models, settings: Settings) -> Models:
    """A server's models: one Translator, several by name ({"en-de": t, "multi": m}), or Models."""
    if isinstance(models, Models):
        return models
    return Models(dict(models) if isinstance(models, Mapping) else {"model": models}, settings)


def create_app(models: Translator | Mapping[str, Translator] | Models, settings: Settings = Settings(), *,
               explorer: Explorer | None = None, loopback_only: bool = True) -> Starlette:
    """The service's ASGI app (the routes of tformer.serve) over a Translator, or several by name (each request
    goes to the one for its languages: tformer.serve.models). The model workers start now and finish their
    accepted work when the app shuts down. `explorer`: the page's Explorer (default: one over the first model
    with the settings' limits). `loopback_only`: answer only requests addressed to 127.0.0.1/localhost."""
    service = Service(served(models, settings), settings, explorer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for model in service.models:
            await asyncio.to_thread(model.batcher.close, settings.timeout + 5)  # a stuck model: give up
            s = model.batcher.stats
            log.info("serve: %s stopped after %d requests (%d sentences in %d model calls; %d dropped)", model.name,
                     s.jobs, s.sentences, s.batches, s.dropped)

    app = Starlette(routes=service.routes(), lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed, Exception: _bug})
    app.add_middleware(_Guard, loopback_only=loopback_only)
    app.state.service = service
    return app
