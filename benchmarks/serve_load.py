"""`tformer serve` under concurrent load on loopback: throughput and latency with cross-request batching, against
the same server answering the same requests one by one.

    python benchmarks/serve_load.py [--checkpoint runs/multi30k_en_de] [--clients 1 4 16 64] [--requests 200]
                                    [--beam 4] [--max-wait-ms 5] [--batch-tokens 4096] [--record]
    python benchmarks/serve_load.py --long 10 [--long-clients 16]      memory over N minutes of steady load

Starts `tformer serve` as its own process (its memory is read from /proc) twice: once with --max-wait-ms 0,
sent the requests one at a time by one client (the baseline: the same server code, each model call one
request's sentences, nothing to batch with), then with the batching settings, sent the same requests by N
concurrent clients for each N. Each request is 1-8 Multi30k test2016 sentences (seeded). Every answer is
checked against the baseline's (texts equal, scores within 1e-4): a mismatch or a non-200 counts as failed.
The baseline's server is also started once with `--warm-up 0`, for the first request's latency without the
warm-up (notes). Reports sentences/s, request latency p50/p99, failures, the server's RSS (start, peak), the model
calls (from /v1/info) and the throughput ratio to the baseline.
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
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402
from explorer_load import MemoryWatch, pct, rss_mib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def start_server(checkpoint: str, *flags: str, repo: Path = ROOT) -> tuple[subprocess.Popen, str]:
    """`tformer serve` of the checkout `repo` on a free port: (process, base URL)."""
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "serve", "--checkpoint", checkpoint, "--port", "0",
                             *flags], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(repo)})
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        proc.kill()
        sys.exit(f"tformer serve did not start: {line!r}")
    if "--warm-up" not in flags or flags[flags.index("--warm-up") + 1] != "0":
        proc.stdout.readline()  # "warmed up with batches of ...": from here on it answers at once
    return proc, f"http://127.0.0.1:{match.group(1)}"


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=120)


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return json.loads(r.read())


def post(url: str, body: dict, timeout: float = 300) -> tuple[int | None, dict, float]:
    req = urllib.request.Request(url + "/v1/translate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    tic = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - tic
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode("utf-8", "replace")}, time.perf_counter() - tic
    except OSError as e:  # a dropped or refused connection
        return None, {"error": repr(e)}, time.perf_counter() - tic


def answers(out: dict) -> list[tuple[str, float]]:
    return [(t["text"], t["score"]) for t in out["translations"]]


def matches(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> bool:
    return [t for t, _ in got] == [t for t, _ in want] and all(abs(a - b) <= 1e-4 for (_, a), (_, b) in zip(got, want))


def run_clients(url: str, bodies: list[dict], clients: int, pid: int) -> dict:
    """Send every body, `clients` at a time; per request (status, answer, seconds), wall time, peak RSS."""
    watch = MemoryWatch(pid)
    before = get(url, "/v1/info")["batching"]
    tic = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda b: post(url, b), bodies))
    wall = time.perf_counter() - tic
    peak = watch.stop()
    after = get(url, "/v1/info")["batching"]
    return {"results": results, "wall": wall, "peak": peak, "calls": after["batches"] - before["batches"],
            "sentences": after["sentences"] - before["sentences"]}


def requests(sentences: list[str], n: int, beam: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"src": rng.sample(sentences, rng.randint(1, 8)), "beam": beam} for _ in range(n)]


def long_run(args: argparse.Namespace, sentences: list[str]) -> None:
    """Steady load for args.long minutes: RSS and throughput each minute."""
    proc, url = start_server(args.checkpoint, "--max-wait-ms", str(args.max_wait_ms), "--batch-tokens",
                             str(args.batch_tokens))
    rows, failures = [], 0
    try:
        rss_start = rss_mib(proc.pid)
        stop = time.monotonic() + 60 * args.long
        minute = 0
        while time.monotonic() < stop:
            minute += 1
            bodies = requests(sentences, args.long_clients * 8, args.beam, args.seed + minute)
            end, done, sent, lat = min(time.monotonic() + 60, stop), 0, 0, []
            watch = MemoryWatch(proc.pid)
            tic = time.perf_counter()
            while time.monotonic() < end:
                out = run_clients(url, bodies, args.long_clients, proc.pid)
                ok = [r for r in out["results"] if r[0] == 200]
                failures += len(out["results"]) - len(ok)
                done += len(out["results"])
                sent += sum(len(r[1]["translations"]) for r in ok)
                lat += [r[2] for r in out["results"]]
            wall = time.perf_counter() - tic
            rows.append((minute, done, sent / wall, pct(lat, 0.5), pct(lat, 0.99), watch.stop(), rss_mib(proc.pid)))
            print(f"minute {minute}: {done} requests, {sent / wall:.1f} sentences/s, RSS {rows[-1][-1]:.0f} MiB",
                  flush=True)
    finally:
        stop_server(proc)
    table = ["| minute | requests | sentences/s | p50 (s) | p99 (s) | RSS peak (MiB) | RSS at the end (MiB) |",
             "|---|---|---|---|---|---|---|"]
    table += [f"| {m} | {n} | {s:.1f} | {p50:.2f} | {p99:.2f} | {peak:.0f} | {end:.0f} |"
              for m, n, s, p50, p99, peak, end in rows]
    notes = (f"`tformer serve --max-wait-ms {args.max_wait_ms} --batch-tokens {args.batch_tokens}`, checkpoint "
             f"{args.checkpoint}, beam {args.beam}, {args.long_clients} clients sending 1-8 Multi30k test2016 "
             f"sentences per request for {args.long} minutes without pause. RSS {rss_start:.0f} MiB after start-up. "
             f"Failed requests: {failures}.")
    report("tformer serve: memory under steady load", table, notes, args.record)
    sys.exit(1 if failures else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=str(ROOT / "runs" / "multi30k_en_de"))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long", type=float, metavar="MINUTES", help="instead: steady load for this many minutes")
    ap.add_argument("--long-clients", type=int, default=16)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    if not Path(args.checkpoint).exists():
        sys.exit(f"{args.checkpoint} does not exist: train one (tformer train --config multi30k_en_de "
                 "--run-dir runs/multi30k_en_de) or pass --checkpoint")
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    if args.long:
        long_run(args, sentences)
        return
    bodies = requests(sentences, args.requests, args.beam, args.seed)
    n_sentences = sum(len(b["src"]) for b in bodies)

    first = {}  # the first request's latency, to a server warmed up (the default) and to one not
    for warm in ("0", "64"):
        proc, url = start_server(args.checkpoint, "--max-wait-ms", "0", "--batch-tokens", str(args.batch_tokens),
                                 "--warm-up", warm)
        try:  # the baseline: one client, one request at a time; its answers are the reference
            first[warm] = post(url, bodies[0])[2]
            if warm != "0":
                base = run_clients(url, bodies, 1, proc.pid)
        finally:
            stop_server(proc)
    reference = [answers(out) if status == 200 else None for status, out, _ in base["results"]]
    base_rate = n_sentences / base["wall"]

    rows = []
    proc, url = start_server(args.checkpoint, "--max-wait-ms", str(args.max_wait_ms), "--batch-tokens",
                             str(args.batch_tokens))
    try:
        rss_start = rss_mib(proc.pid)
        post(url, bodies[0])  # warm-up
        for clients in args.clients:
            out = run_clients(url, bodies, clients, proc.pid)
            failed = sum(status != 200 or want is None or not matches(answers(got), want)
                         for (status, got, _), want in zip(out["results"], reference))
            rows.append((str(clients), out, failed))
        rss_end = rss_mib(proc.pid)
    finally:
        stop_server(proc)

    table = ["| clients | requests | sentences | failed | sentences/s | latency p50 / p99 (s) | vs one by one | "
             "model calls | sentences per call | server RSS peak (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lat = [s for _, _, s in base["results"]]
    table.append(f"| 1, one by one (--max-wait-ms 0) | {len(bodies)} | {n_sentences} | "
                 f"{sum(r is None for r in reference)} | {base_rate:.1f} | {pct(lat, .5):.3f} / {pct(lat, .99):.3f} | "
                 f"1.00x | {base['calls']} | {base['sentences'] / max(base['calls'], 1):.1f} | {base['peak']:.0f} |")
    for clients, out, failed in rows:
        lat = [s for _, _, s in out["results"]]
        rate = n_sentences / out["wall"]
        table.append(f"| {clients} | {len(bodies)} | {n_sentences} | {failed} | {rate:.1f} | {pct(lat, .5):.3f} / "
                     f"{pct(lat, .99):.3f} | {rate / base_rate:.2f}x | {out['calls']} | "
                     f"{out['sentences'] / max(out['calls'], 1):.1f} | {out['peak']:.0f} |")
    failures = sum(f for _, _, f in rows) + sum(r is None for r in reference)
    notes = (f"Checkpoint {args.checkpoint}, beam {args.beam}; {len(bodies)} requests of 1-8 Multi30k test2016 "
             f"sentences ({n_sentences} sentences, seed {args.seed}), one connection per request. Batching: "
             f"`--max-wait-ms {args.max_wait_ms} --batch-tokens {args.batch_tokens}`. 'one by one': the same "
             "server code with --max-wait-ms 0, one client sending the requests in turn (each model call is one "
             "request's sentences); its answers are the reference every other answer is checked against (texts "
             f"equal, scores within 1e-4). The first request ({len(bodies[0]['src'])} sentences) to a server just "
             f"started took {first['64']:.3f} s warmed up (`--warm-up 64`, the default) and {first['0']:.3f} s not "
             f"(`--warm-up 0`). Server RSS {rss_start:.0f} MiB after start-up, {rss_end:.0f} MiB at the "
             f"end. Failed (non-200 or different answers): {failures}.")
    report("tformer serve: cross-request batching under concurrent load (loopback)", table, notes, args.record)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
