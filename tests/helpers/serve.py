"""Servers for tests: the committed tiny model (tests/fixtures/checkpoint_v1) and its input lines, an in-process
server on a free port, a `tformer serve` subprocess, and one HTTP call answered as (status, JSON, headers)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import FIXTURES
from tformer.serve import Server, Settings

V1 = FIXTURES / "checkpoint_v1"
CHECKPOINT = V1 / "checkpoint"
LINES = (V1 / "input.en").read_text(encoding="utf-8").splitlines()  # 20 sentences, "a", "", one more


def _wait(predicate, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@contextlib.contextmanager
def live(translator, **settings):
    """An in-process server on 127.0.0.1, any free port: yields (server, base URL)."""
    server = Server(translator, "127.0.0.1", 0, Settings(**settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started)
    try:
        yield server, server.url.rstrip("/")
    finally:
        server.stop()
        thread.join(30)
        assert not thread.is_alive()


def _decoded(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return {"error": data.decode("utf-8", "replace")}


def call(url: str, path: str, body=None, *, raw: bytes | None = None, content_type: str = "application/json",
         headers: dict | None = None, method: str | None = None, timeout: float = 60):
    """(status, decoded JSON answer, headers)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    head = {"Content-Type": content_type} if data is not None else {}
    req = urllib.request.Request(url + path, data=data, method=method, headers={**head, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, _decoded(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, _decoded(e.read()), e.headers


def _start(*options: str, env: dict | None = None, checkpoint: Path = CHECKPOINT, cwd: Path | None = None
           ) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "serve", "--checkpoint", str(checkpoint), "--port", "0",
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, cwd=cwd)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        proc.kill()
        pytest.fail(line + proc.stderr.read())
    return proc, f"http://127.0.0.1:{match.group(1)}"
