"""The HTTP/1.1 connection under the service: uvicorn's h11 protocol with what an untrusted network needs and
uvicorn does not give.

    config = uvicorn.Config(app, http=connection_class(settings), ...)

- **Header deadline** (`Settings.header_timeout`): a connection that has no request in the app must finish its
  next request line and headers within that many seconds, counted from when it opened or from its last answer.
  Past it the client gets 408 with a JSON body and the connection is closed: a client trickling bytes
  (slowloris) holds a connection for seconds, not for ever. An idle keep-alive connection is closed sooner and
  silently by uvicorn (`timeout_keep_alive`). The body has its own deadline, kept by the app while it reads
  (`requests.read_body`, `Settings.body_timeout`), so that the answer can name it.
- **Connection limit** (`Settings.max_connections`): a request that arrives while more connections are open is
  answered 503 with `Retry-After` and a JSON body like every other error (uvicorn's own limit answers in plain
  text), and its connection is closed.
- **Malformed HTTP**: a request h11 cannot parse (a bad request line, headers over h11's 16 KiB, a broken chunked
  body) is answered 400 with a JSON body (uvicorn's in plain text), and the connection is closed.

Every error body is `{"error": message}`, as the app's are.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tformer.serve.requests import Settings


def error_bytes(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 error answer that closes its connection: `{"error": message}` with status `status`."""
    body = json.dumps({"error": message}).encode("utf-8")
    head = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close",
            "cache-control": "no-store", "x-content-type-options": "nosniff", **(headers or {})}
    lines = [f"HTTP/1.1 {int(status)} {HTTPStatus(status).phrase}"] + [f"{k}: {v}" for k, v in head.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def busy_message(settings: Settings) -> str:
    return (f"busy: more than {settings.max_connections} connections are open (--max-connections); retry in a "
            "moment")


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the header deadline, the connection limit and JSON errors (module docstring).
    `connection_class(settings)` makes the subclass uvicorn instantiates per connection."""

    settings: Settings = Settings()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # the limit is checked here, answered in JSON
        self._deadline: asyncio.TimerHandle | None = None
        app = self.app

        async def limited(scope, receive, send) -> None:  # an ASGI app: the service, or 503 when over the limit
            if scope["type"] == "http" and (len(self.connections) > self.settings.max_connections or
                                            len(self.tasks) > self.settings.max_connections):
                body = json.dumps({"error": busy_message(self.settings)}).encode("utf-8")
                await send({"type": "http.response.start", "status": HTTPStatus.SERVICE_UNAVAILABLE,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                        (b"connection", b"close"), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        self.app = limited

    # ---------------------------------------------------------------------------------------- the deadline

    def _arm(self) -> None:
        """(Re)start the header deadline: from now, the next request's headers must arrive in time."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.settings.header_timeout, self._late)

    def _running(self) -> bool:
        """A request is in the app (its own deadlines apply: the body's, the answer's)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._running():
            return  # the answer re-arms the deadline
        if self.conn.their_state is h11.IDLE:  # no request, or a part of its request line and headers
            self.transport.write(error_bytes(
                HTTPStatus.REQUEST_TIMEOUT, f"the request line and headers did not arrive within "
                f"{self.settings.header_timeout:g} s (--header-timeout); send the whole request at once"))
        self.transport.close()  # else: still sending a body nobody reads, after its answer

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        self._arm()  # before the next request can start (a pipelined one starts inside the call below)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    # ---------------------------------------------------------------------------------------- malformed HTTP

    def send_400_response(self, msg: str) -> None:
        if self._running():
            if self.cycle.response_started:  # garbage pipelined behind a request being answered: finish, close
                self.cycle.keep_alive = False
                return
            self.cycle.disconnected = True  # a broken body (or garbage behind a request): the app stops reading
            self.cycle.message_event.set()
        self.transport.write(error_bytes(
            HTTPStatus.BAD_REQUEST, "not a valid HTTP/1.1 request (its request line, headers (at most 16 KiB) or "
            "chunked body); check the client"))
        self.transport.close()


def connection_class(settings: Settings) -> type[GuardedH11]:
    """The protocol class uvicorn makes one of per connection (uvicorn.Config(http=...)) for these settings."""
    return type("Connection", (GuardedH11,), {"settings": settings})
