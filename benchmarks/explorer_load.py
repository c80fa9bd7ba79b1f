"""The explorer's server under concurrent load on loopback: every request gets the right answer, a clear
4xx, or 503 "busy"; memory stays bounded; the server recovers.

    python benchmarks/explorer_load.py [--checkpoint runs/multi30k_en_de] [--requests 300] [--record]

Starts `tformer explore` as its own process (its memory is read from /proc), takes reference answers one
request at a time, then sends bursts from N concurrent clients (one connection per request): 80% real
Multi30k validation sentences, 20% bad requests (empty text, over --max-chars, not JSON, a 100,000-character
body); then bursts whose clients honour Retry-After. Checks every 200 against the reference (translation and score), every 4xx for its message, every 503
for "busy" (the queue) or uvicorn's plain "Service Unavailable" (past --max-connections); counts connection
failures; reports latency percentiles, server memory (before, peak, after) and, after each burst, the time until
the server answers normally again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class MemoryWatch:
    """Samples a process's resident memory every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.02)

    def stop(self) -> float:
        self._stop.set()
        self.thread.join()
        return self.peak


def post(url: str, data: bytes, timeout: float = 120) -> tuple[int | None, dict, float]:
    req = urllib.request.Request(url + "/api/translate", data=data, headers={"Content-Type": "application/json"})
    tic = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - tic
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body), time.perf_counter() - tic
        except ValueError:  # uvicorn's own 503 past --max-connections is plain text
            return e.code, {"error": body.decode("utf-8", "replace")}, time.perf_counter() - tic
    except OSError as e:  # a dropped or refused connection: a failure
        return None, {"error": repr(e)}, time.perf_counter() - tic


def post_retrying(url: str, data: bytes, rng: random.Random) -> tuple[int | None, dict, float]:
    """Like a polite client: after a 503, wait Retry-After (1 s) plus jitter and send again."""
    tic = time.perf_counter()
    for _ in range(60):
        status, out, _ = post(url, data)
        if status != 503:
            break
        time.sleep(1.0 + rng.random())
    return status, out, time.perf_counter() - tic


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=str(ROOT / "runs" / "multi30k_en_de"))
    ap.add_argument("--requests", type=int, default=300, help="requests per burst")
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 64], help="concurrent clients, one burst each")
    ap.add_argument("--retry-clients", type=int, nargs="*", default=[64], help="bursts whose clients honour "
                    "Retry-After (wait 1-2 s after a 503 and send again, up to 60 times)")
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--max-connections", type=int, default=32)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if not Path(args.checkpoint).exists():
        sys.exit(f"{args.checkpoint} does not exist: train one (tformer train --config multi30k_en_de "
                 "--run-dir runs/multi30k_en_de) or pass --checkpoint")
    with gzip.open(SHARED_DATA / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as f:
        sentences = [s.strip() for s, _ in zip(f, range(40))]

    server = subprocess.Popen([sys.executable, "-m", "tformer", "explore", "--checkpoint", args.checkpoint, "--port",
                               "0", "--max-queue", str(args.max_queue), "--max-connections", str(args.max_connections)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = server.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))
        url = f"http://127.0.0.1:{port}"
        rss_start = rss_mib(server.pid)
        reference = {}
        for s in sentences:  # one at a time: the answers every later one must equal
            status, out, _ = post(url, json.dumps({"text": s, "beam": args.beam, "nbest": 1}).encode())
            assert status == 200, out
            reference[s] = [(h["text"], h["score"]) for h in out["hypotheses"]]
        rss_warm = rss_mib(server.pid)
        rng = random.Random(args.seed)
        bad = [(json.dumps({"text": ""}).encode(), 400, "type a sentence"),
               (json.dumps({"text": "x" * 1001}).encode(), 400, "limit is 1000"),
               (b"{not json", 400, "not UTF-8 JSON"),
               (json.dumps({"text": "a b " * 25_000}).encode(), 413, "at most 65536 bytes")]
        rows, failures = [], 0
        for clients, retry in [(c, False) for c in args.clients] + [(c, True) for c in args.retry_clients]:
            jobs = []
            for _ in range(args.requests):
                if rng.random() < 0.8:
                    s = rng.choice(sentences)
                    jobs.append((json.dumps({"text": s, "beam": args.beam, "nbest": 1}).encode(), 200, s))
                else:
                    jobs.append(rng.choice(bad))
            watch = MemoryWatch(server.pid)
            tic = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                send = (lambda j: (j, post_retrying(url, j[0], random.Random(j[0])))) if retry else \
                    (lambda j: (j, post(url, j[0])))
                results = list(pool.map(send, jobs))
            wall = time.perf_counter() - tic
            peak = watch.stop()
            counts: dict[str, int] = {}
            lat: dict[str, list[float]] = {"200": [], "4xx": [], "503": []}
            wrong = 0
            for (_, expected, key), (status, out, seconds) in results:
                if status == 200 and expected == 200 and [(h["text"], h["score"]) for h in out["hypotheses"]] == reference[key]:
                    kind = "200"
                elif status == 503 and (out.get("error", "").startswith("busy") or
                                        out.get("error") == "Service Unavailable"):  # the queue's, or uvicorn's
                    kind = "503"
                elif status == expected and 400 <= status < 500 and key in out.get("error", ""):
                    kind = "4xx"
                else:
                    kind = "wrong"
                    wrong += 1
                counts[kind] = counts.get(kind, 0) + 1
                lat.setdefault(kind, []).append(seconds)
            tic = time.perf_counter()  # recovery: the first normal answer after the burst, then 10 checked ones
            while post(url, json.dumps({"text": sentences[0], "beam": args.beam, "nbest": 1}).encode())[0] != 200:
                time.sleep(0.05)
            recover = time.perf_counter() - tic
            after_ok = all(post(url, json.dumps({"text": s, "beam": args.beam, "nbest": 1}).encode())[1]
                           .get("hypotheses") is not None for s in sentences[:10])
            time.sleep(1.0)
            failures += wrong + (not after_ok)
            rows.append((f"{clients}{' (retry)' if retry else ''}", counts, lat, wall, peak, rss_mib(server.pid),
                         recover, after_ok))
    finally:
        server.terminate()
        server.wait(timeout=30)

    table = ["| clients | requests | 200 correct | 4xx (expected) | 503 busy | wrong / dropped | 200 latency p50 / p90 / p99 / max (s) | 503 latency p50 / max (s) | served/s | server RSS peak (MiB) | after (MiB) | recovered in (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for clients, counts, lat, wall, peak, after, recover, ok in rows:
        ok_lat = lat["200"]
        table.append(
            f"| {clients} | {sum(counts.values())} | {counts.get('200', 0)} | {counts.get('4xx', 0)} | {counts.get('503', 0)} | "
            f"{counts.get('wrong', 0)} | {pct(ok_lat, .5):.2f} / {pct(ok_lat, .9):.2f} / {pct(ok_lat, .99):.2f} / "
            f"{max(ok_lat, default=float('nan')):.2f} | {pct(lat['503'], .5):.3f} / {max(lat['503'], default=float('nan')):.3f} | "
            f"{counts.get('200', 0) / wall:.1f} | {peak:.0f} | {after:.0f} | {recover:.2f}{'' if ok else ' (NOT OK)'} |")
    notes = (f"Checkpoint {args.checkpoint}, beam {args.beam}, --max-queue {args.max_queue}, --max-connections "
             f"{args.max_connections}; 40 Multi30k validation sentences, 20% bad requests. Server RSS: {rss_start:.0f} MiB "
             f"after start-up, {rss_warm:.0f} MiB after the reference answers. 'wrong / dropped' counts answers that "
             f"differ from the reference, unexpected statuses and connection failures (total: {failures}). '(retry)': "
             "clients that wait Retry-After after a 503 and send again; their latency includes the waits.")
    report("Explorer under concurrent load (loopback)", table, notes, args.record)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
