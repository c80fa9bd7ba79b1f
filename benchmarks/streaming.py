"""Memory of translating large inputs through the Python API: `Translator.translate_iterable` over a generator
(nothing held but the chunk in flight) and `translate_file` (every line checked first, then streamed into the
output), against `translate` on the whole list, at growing input sizes. Each measurement runs in a fresh
process; peak RSS is the kernel's high-water mark (ru_maxrss) of that process, the baseline its RSS once the
model is loaded.

    python benchmarks/streaming.py --lines 100000 1000000 [--checkpoint DIR] [--record]

The model is the committed tiny checkpoint (tests/fixtures/checkpoint_v1, d_model 16) so that a million
sentences decode in minutes on two cores: memory is what is measured, and decoding memory per batch does not
depend on the input's length. The sentences are the fixture's 22 test lines, repeated (and, for the file
forms, written to a temporary file first). Order is checked: the i-th output must equal the translation of
the i-th input line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import report  # noqa: E402

FIXTURE = HERE.parent / "tests" / "fixtures" / "checkpoint_v1"


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(form: str, n: int, checkpoint: str, chunk_size: int) -> dict:
    """One measurement, in this process (called in a fresh child)."""
    import tformer

    translator = tformer.load(checkpoint, device="cpu", batch_size=256)
    lines = [ln for ln in (FIXTURE / "input.en").read_text(encoding="utf-8").splitlines() if ln.strip()]
    want = [t.text for t in translator.translate(lines)]
    base = _rss_mib()
    tic = time.perf_counter()
    wrong = 0
    if form == "iterable":
        source = (lines[i % len(lines)] for i in range(n))  # generated on the fly: never a list
        for i, t in enumerate(translator.translate_iterable(source, chunk_size=chunk_size)):
            wrong += t.text != want[i % len(lines)]
    elif form == "list":
        for i, t in enumerate(translator.translate([lines[i % len(lines)] for i in range(n)])):
            wrong += t.text != want[i % len(lines)]
    else:  # file
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "in.txt", Path(tmp) / "out.txt"
            with open(src, "w", encoding="utf-8") as f:
                for i in range(n):
                    f.write(lines[i % len(lines)] + "\n")
            tic = time.perf_counter()
            translator.translate_file(src, out, chunk_size=chunk_size)
            with open(out, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    wrong += line.rstrip("\n") != want[i % len(lines)]
    seconds = time.perf_counter() - tic
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"form": form, "lines": n, "seconds": seconds, "baseline_mib": base, "peak_mib": peak, "wrong": wrong}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--forms", nargs="+", default=["iterable", "file", "list"], choices=("iterable", "file", "list"))
    ap.add_argument("--list-max", type=int, default=100_000, help="largest input for the whole-list form")
    ap.add_argument("--checkpoint", default=str(FIXTURE / "checkpoint"))
    ap.add_argument("--chunk-size", type=int, default=10_000)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("FORM", "LINES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.checkpoint, args.chunk_size)))
        return
    rows = []
    for n, form in itertools.product(args.lines, args.forms):
        if form == "list" and n > args.list_max:
            continue
        cmd = [sys.executable, __file__, "--child", form, str(n), "--checkpoint", args.checkpoint,
               "--chunk-size", str(args.chunk_size)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{form:9s} {n:>9,} lines: {r['seconds']:.1f}s, peak {r['peak_mib']:.0f} MiB "
              f"(loaded {r['baseline_mib']:.0f} MiB), {r['wrong']} wrong", flush=True)
    table = ["| form | lines | seconds | sentences/s | RSS after load | peak RSS | peak - loaded | wrong or out of order |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['form']} | {r['lines']:,} | {r['seconds']:.1f} | {r['lines'] / r['seconds']:,.0f} | "
                     f"{r['baseline_mib']:.0f} MiB | {r['peak_mib']:.0f} MiB | {r['peak_mib'] - r['baseline_mib']:.0f} MiB "
                     f"| {r['wrong']} |")
    notes = (f"Checkpoint {args.checkpoint} (d_model 16, 1+1 layers, joint BPE 60), greedy, batch 256 sentences, "
             f"chunk {args.chunk_size:,} sentences; inputs are the fixture's 22 test lines repeated. iterable: "
             "translate_iterable over a generator; file: translate_file (a checking pass, then the streamed "
             "translation into the output file); list: translate on a list of all sentences (for contrast).")
    report("Streaming translation through the API: memory vs input size", table, notes, args.record)


if __name__ == "__main__":
    main()
