"""Explorer response time: one translation with the attention of every hypothesis, over HTTP, on this machine.

    python benchmarks/studies/explorer.py --checkpoint runs/multi30k_en_de --beam 5 --nbest 5 --sentences 40 [--record]

Serves the checkpoint in this process (tformer.serve.Server with the explorer, on 127.0.0.1), posts Multi30k test2016
sentences one at a time, and reports the round trip (what the page waits for) beside the model's own time
and plain decoding of the same sentences with the same settings (Translator.translate, no attention, no HTTP), so
the cost of the attention and of JSON is visible. Then the same requests from 4 clients at once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402

from tformer.explore import Explorer, server_settings  # noqa: E402
from tformer.serve import Server  # noqa: E402


def post(url: str, body: dict) -> tuple[float, dict, int]:
    data = json.dumps(body).encode()
    tic = time.perf_counter()
    req = urllib.request.Request(url + "/api/translate", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read()
    return time.perf_counter() - tic, json.loads(raw), len(raw)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def screenshot(url: str, sentence: str, path: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        page.goto(url + "/")
        page.wait_for_function("document.querySelector('#model-info').textContent.includes('heads')")
        page.fill("#text", sentence)
        page.click("#go")
        page.wait_for_selector("#nbest-list li.hyp")
        page.select_option("#layer", "2")
        page.screenshot(path=path)
        browser.close()
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--nbest", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--screenshot", help="also save a picture of the page (headless Chromium) here")
    args = ap.parse_args()

    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f][: args.sentences]
    explorer = Explorer(args.checkpoint)
    server = Server(explorer.translator, "127.0.0.1", 0, server_settings(explorer.limits), explorer=explorer)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    url = server.url.rstrip("/")
    body = lambda s: {"text": s, "beam": args.beam, "nbest": args.nbest}  # noqa: E731
    post(url, body(sentences[0]))  # warm-up

    translator = explorer.translator
    trips, model, sizes, plain = [], [], [], []
    for s in sentences:  # interleaved, so both see the same machine load
        tic = time.perf_counter()
        translator.translate([s], beam=args.beam, nbest=args.nbest, batch_size=1)
        plain.append(time.perf_counter() - tic)
        t, out, n = post(url, body(s))
        trips.append(t)
        model.append(out["seconds"])
        sizes.append(n)

    tic = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        many = list(pool.map(lambda s: post(url, body(s)), sentences))
    wall = time.perf_counter() - tic
    if args.screenshot:
        screenshot(url, sentences[1], args.screenshot)
    server.stop()

    ms = lambda x: f"{1000 * x:.0f}"  # noqa: E731
    lengths = [len(translator.encode(s)) for s in sentences]
    rows = [
        ("round trip (one client)", trips),
        ("  of which the model: decode + attention of every hypothesis", model),
        ("plain beam decoding, same settings (no attention, no HTTP)", plain),
        (f"round trip, {args.clients} clients at once", [t for t, _, _ in many]),
    ]
    table = ["| what | median ms | p90 ms | max ms |", "|---|---:|---:|---:|"]
    table += [f"| {name} | {ms(statistics.median(xs))} | {ms(pct(xs, 0.9))} | {ms(max(xs))} |" for name, xs in rows]
    notes = (f"{len(sentences)} Multi30k test2016 sentences ({statistics.mean(lengths):.1f} source pieces on average, "
             f"max {max(lengths)}), beam {args.beam}, n-best {args.nbest}, checkpoint {args.checkpoint} "
             f"({translator.config.model.encoder_layers}+{translator.config.model.decoder_layers} layers, "
             f"{translator.config.model.n_heads} heads, d={translator.config.model.d_model}). Response size median "
             f"{statistics.median(sizes) / 1024:.0f} KiB (attention of all {args.nbest} hypotheses, every kind, "
             f"layer and head, 4 decimals). {args.clients} clients at once: {len(sentences)} requests in "
             f"{wall:.2f} s ({len(sentences) / wall:.1f} requests/s; one client: "
             f"{len(sentences) / sum(trips):.1f} requests/s); the model serves one request at a time.")
    notes += (f" Per sentence, round trip / plain decoding: median "
              f"{statistics.median(t / p for t, p in zip(trips, plain)):.2f}x.")
    report("Explorer response time (translation with attention, over HTTP)", table, notes, args.record)


if __name__ == "__main__":
    main()
