"""Serving the app on a socket: `Server` binds host:port at once and runs uvicorn in the calling thread until
SIGTERM, Ctrl-C or `stop()`, finishing the work it accepted; `serve` is Server(...).run().

    server = Server(translator, "127.0.0.1", 0, settings)   bound at once (server.url); a dict of translators by
    server.warm_up(); server.run()                          name, or Models, serves several (tformer.serve.models)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from typing import TYPE_CHECKING, Mapping

from tformer.api import Translator
from tformer.errors import ConfigError
from tformer.serve.app import LOOPBACK, Service, create_app
from tformer.serve.models import Models
from tformer.serve.protocol import connection_class
from tformer.serve.requests import Settings

if TYPE_CHECKING:
    from tformer.explore import Explorer

log = logging.getLogger("tformer")


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

    def __init__(self, translator: Translator | Mapping[str, Translator] | Models, host: str = "127.0.0.1",
                 port: int = 8000, settings: Settings = Settings(), *, explorer: Explorer | None = None) -> None:
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
        sizes = self.service.settings.warm_up_sizes()
        for model in self.service.models:  # each model's own shapes; /v1/info reports the first's
            warmed = model.translator.warm_up(sizes)
            self.service.warmed = self.service.warmed or warmed
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


def serve(translator: Translator | Mapping[str, Translator] | Models, host: str = "127.0.0.1", port: int = 8000,
          settings: Settings = Settings(), *, explorer: Explorer | None = None) -> None:
    """Serve a Translator (or several by name) on host:port until SIGTERM or Ctrl-C (see Server.run)."""
    Server(translator, host, port, settings, explorer=explorer).run()
