"""`tformer serve` on an untrusted network, measured on loopback: slow clients (slowloris) and a flood of
malformed requests, with well-formed clients among them.

    python benchmarks/serve_abuse.py [--checkpoint tests/fixtures/checkpoint_v1/checkpoint] [--slow 200 600]
                                     [--seconds 30] [--flood 20000] [--before DIR] [--record]

Each scenario starts its own `tformer serve` process (defaults: --max-connections 256, --header-timeout 10) and
reads its memory from /proc.

- slowloris: N connections each send a request line and then one header byte a second, never finishing,
  for --seconds; meanwhile 4 well-formed clients send a translation request every 0.2 s each, and on a 503
  wait a second (the Retry-After tformer sends) and send it again (as a polite client does). Reported: how
  long the server held the slow connections (p50 / max, seconds, until it closed them; held to the end
  counts as --seconds), how many it still held at the end, the good requests answered right / refused 503
  at least once / failed (no right answer within 30 s, or a wrong one), how long they waited for it, and
  the server's memory.
- flood: --flood malformed requests of 13 kinds (bad JSON, wrong types, bad UTF-8, unknown fields, a body
  announced over --max-body, a wrong Content-Type, unknown routes and methods, headers that never end, not
  HTTP at all) from 16 clients, one connection each, with a well-formed request after every 50th: every bad
  one must get its 4xx with a JSON body, every good one the right answer. Memory is read at each quarter.

--before DIR also runs every scenario against the server of another checkout of tformer (e.g. a git worktree
of an older commit: `git worktree add ../tformer-before REV`), right after this one's: the two side by side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402
from explorer_load import MemoryWatch, pct, rss_mib  # noqa: E402
from serve_load import start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "checkpoint_v1"
HEAD = b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def start(repo: Path, checkpoint: str, *flags: str) -> tuple[subprocess.Popen, int]:
    proc, url = start_server(checkpoint, *flags, repo=repo)
    return proc, int(url.rsplit(":", 1)[1])


def read_response(s: socket.socket) -> bytes:
    """One whole answer (headers and Content-Length body), or what came before the connection closed."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(65536)
        if not chunk:
            return reply
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length:\s*(\d+)", head)
    while length and len(body) < int(length.group(1)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def exchange(port: int, data: bytes, timeout: float = 30) -> tuple[int, dict | None]:
    """(status, JSON body or None when the body is not JSON) of one request on its own connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = read_response(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def post(body: bytes, content_type: bytes = b"application/json", path: bytes = b"/v1/translate") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def good_request(line: str) -> bytes:
    return post(json.dumps({"src": [line]}).encode())


BAD = [
    (post(b'{"src":'), 400), (post(b'{"src": [1]}'), 400), (post(b'{"src": ["\xff"]}'), 400),
    (post(b"[[[[]]]]]"), 400), (post(b'{"src": ["a"], "beam": 99, "x": 1}'), 400),
    (post(b'{"src": ["a"], "tgt": []}', path=b"/v1/score"), 400),
    (post(b"q=a&source=en&target=xx", b"application/x-www-form-urlencoded", b"/translate"), 400),
    (HEAD + b"Content-Length: 9999999\r\n\r\n", 413), (post(b"hi", b"text/plain"), 415),
    (b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404),
    (b"BREW /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"b" * 70_000, 400), (b"GARBAGE\r\n\r\n", 400),
]


# ------------------------------------------------------------------------------------------ slowloris


def slow_client(port: int, seconds: float, opened: threading.Barrier) -> float:
    """A connection trickling one header byte a second; returns how long the server kept it open."""
    tic = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    with contextlib.suppress(threading.BrokenBarrierError):
        opened.wait(30)
    with s:
        with contextlib.suppress(OSError):
            s.sendall(HEAD + b"X-Slow: ")
        s.settimeout(1.0)
        while time.monotonic() - tic < seconds:
            try:
                if not s.recv(65536):
                    return time.monotonic() - tic
            except TimeoutError:
                with contextlib.suppress(OSError):
                    s.send(b"a")
            except OSError:
                return time.monotonic() - tic
    return seconds


def good_client(port: int, line: str, want: str, until: float) -> tuple[dict[str, int], list[float]]:
    """Requests until `until`, each retried after 1 s while refused with a 503 (JSON or not), for up to 30 s:
    the counts, and each answered request's wait from its first try."""
    counts = {"answered": 0, "refused 503": 0, "failed": 0}
    waits = []
    while time.monotonic() < until:
        first = time.monotonic()
        refused = False
        while True:
            try:
                status, out = exchange(port, good_request(line))
            except OSError:
                status, out = 0, None
            if status == 503 and time.monotonic() < first + 30:  # busy: wait as told and try again
                refused = True
                time.sleep(1.0)
                continue
            ok = status == 200 and out is not None and out["translations"][0]["text"] == want
            counts["answered" if ok else "failed"] += 1
            counts["refused 503"] += refused
            if ok:
                waits.append(time.monotonic() - first)
            break
        time.sleep(0.2)
    return counts, waits


def slowloris(repo: Path, checkpoint: str, n: int, seconds: float, line: str, want: str) -> list[str]:
    proc, port = start(repo, checkpoint)
    try:
        before = rss_mib(proc.pid)
        watch = MemoryWatch(proc.pid)
        opened = threading.Barrier(n + 1)
        with concurrent.futures.ThreadPoolExecutor(n + 4) as pool:
            slow = [pool.submit(slow_client, port, seconds, opened) for _ in range(n)]
            with contextlib.suppress(threading.BrokenBarrierError):
                opened.wait(60)
            until = time.monotonic() + seconds
            good = [pool.submit(good_client, port, line, want, until) for _ in range(4)]
            held = [f.result() for f in slow]
            counts = {k: sum(f.result()[0][k] for f in good) for k in ("answered", "refused 503", "failed")}
            waits = [w for f in good for w in f.result()[1]]
        peak = watch.stop()
        after = rss_mib(proc.pid)
    finally:
        proc.kill()
        proc.wait(30)
    to_end = sum(h >= seconds - 0.5 for h in held)
    return [f"| {name(repo)} | {n} | {pct(held, 0.5):.1f} / {max(held):.1f} | {to_end} | {counts['answered']} | "
            f"{counts['refused 503']} | {counts['failed']} | {pct(waits, 0.5):.2f} / {max(waits, default=0):.2f} | "
            f"{before:.0f} / {peak:.0f} / {after:.0f} |"]


# ------------------------------------------------------------------------------------------ flood


def flood(repo: Path, checkpoint: str, total: int, line: str, want: str) -> tuple[list[str], dict]:
    proc, port = start(repo, checkpoint)
    lock = threading.Lock()
    tally = {"bad": 0, "bad wrong": 0, "good": 0, "good failed": 0}
    marks = [rss_mib(proc.pid)]
    clients = 16
    per = total // clients

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(per):
            data, status = BAD[rng.randrange(len(BAD))]
            try:
                got, out = exchange(port, data)
            except OSError:
                got, out = 0, None
            wrong = got != status or out is None or "error" not in out
            good = None
            if i % 50 == 49:
                try:
                    code, answer = exchange(port, good_request(line))
                    good = code == 200 and answer is not None and answer["translations"][0]["text"] == want
                except OSError:
                    good = False
            with lock:
                tally["bad"] += 1
                tally["bad wrong"] += wrong
                if good is not None:
                    tally["good"] += 1
                    tally["good failed"] += not good
                if tally["bad"] % (total // 4) == 0:
                    marks.append(rss_mib(proc.pid))

    try:
        tic = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            for f in [pool.submit(client, seed) for seed in range(clients)]:
                f.result()
        seconds = time.perf_counter() - tic
    finally:
        proc.kill()
        proc.wait(30)
    row = (f"| {name(repo)} | {tally['bad']:,} | {tally['bad'] / seconds:,.0f} | {tally['bad wrong']} | "
           f"{tally['good']} | {tally['good failed']} | " + " / ".join(f"{m:.0f}" for m in marks) + " |")
    return [row], tally


def name(repo: Path) -> str:
    """The checkout's commit: what the table's rows are told apart by."""
    return subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%h"], capture_output=True,
                          text=True).stdout.strip() or str(repo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=str(FIXTURE / "checkpoint"))
    ap.add_argument("--slow", type=int, nargs="+", default=[200, 600], help="slow connections per run")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each slowloris run lasts")
    ap.add_argument("--flood", type=int, default=20_000, help="malformed requests in the flood")
    ap.add_argument("--before", type=Path, help="another checkout of tformer whose server to run beside this one's")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = ap.parse_args()
    line = (FIXTURE / "input.en").read_text(encoding="utf-8").splitlines()[0]
    import tformer

    want = tformer.load(args.checkpoint, device="cpu").translate([line])[0].text
    repos = [ROOT] + ([args.before.resolve()] if args.before else [])
    table = ["| server | slow connections | held p50 / max (s) | held to the end | good answered | good refused 503 "
             "first | good failed | good wait p50 / max (s) | server RSS before / peak / after (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in [n for n in args.slow if n > 0]:  # --slow 0: the flood alone
        for repo in repos:
            table += slowloris(repo, args.checkpoint, n, args.seconds, line, want)
            print(table[-1], flush=True)
    table += ["", "| server | malformed requests | per second | answered other than their 4xx in JSON | good requests "
              "among them | good failed | server RSS at 0 / 25 / 50 / 75 / 100% (MiB) |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for repo in repos:
        table += flood(repo, args.checkpoint, args.flood, line, want)[0]
        print(table[-1], flush=True)
    version = " vs ".join(name(r) for r in repos)
    notes = (f"Server: `tformer serve` of {version}, defaults (--max-connections 256, "
             f"--header-timeout 10, --body-timeout 30), checkpoint {args.checkpoint}. Slowloris: each run lasts "
             f"{args.seconds:g} s; a slow connection sends a request line, then one header byte a second; 4 "
             "well-formed clients send a request every 0.2 s and, refused with a 503, wait 1 s (the "
             "Retry-After tformer sends) and send it again, failing after 30 s; 'good wait' is from a request's "
             "first try to its answer. 'held to the end': slow connections the server "
             "never closed. Flood: 16 clients, one connection per request, 13 kinds of malformed request, a "
             "well-formed one after every 50th.")
    report(f"tformer serve under slow clients and a flood of malformed requests ({version.split()[0]})", table,
           notes, args.record)


if __name__ == "__main__":
    main()
