"""An Argos Translate package of a trained model against tformer itself: sacreBLEU of argostranslate's
translations and of tformer's on the same test split.

    python benchmarks/studies/argos.py --checkpoint runs/m30k_quick [--split test] [--record]

The package is exported twice (`tformer export --format argos`: int8, the default, and float32), installed by
the real argostranslate into a temporary home folder, and each test sentence is translated by
argostranslate.translate.translate (beam 4, length penalty 0.2: Argos's settings; sentences split by the
packaged spaCy pipeline, ARGOS_CHUNK_TYPE=SPACY). tformer translates the same sentences with beam 4 and with
its run's own settings. Argos runs in a child process, so its settings and folders never touch this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import report  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.data.translation import read_split  # noqa: E402
from tformer.export import export_argos  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402

CHILD = """
import json, sys, time
import argostranslate.package as package, argostranslate.translate as translate
package.install_from_path(sys.argv[1])
lines = json.load(open(sys.argv[2]))
translation = translate.get_translation_from_codes(sys.argv[3], sys.argv[4])
tic = time.perf_counter()
out = [translation.translate(q) for q in lines]
print(json.dumps({"out": out, "seconds": time.perf_counter() - tic}))
"""


def run_argos(package: Path, sources: list[str], src: str, tgt: str, home: Path) -> tuple[list[str], float]:
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "ARGOS_CHUNK_TYPE": "SPACY", "ARGOS_DEVICE_TYPE": "cpu"}
    (home / "in.json").parent.mkdir(parents=True, exist_ok=True)
    (home / "in.json").write_text(json.dumps(sources), encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", CHILD, str(package), str(home / "in.json"), src, tgt],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    return answer["out"], answer["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a translation run folder (one SentencePiece model)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    data = load_checkpoint(args.checkpoint).cfg.data
    corpus = read_split(data, args.split)
    translator = tformer.load(args.checkpoint)
    rows = ["| translation | sacreBLEU | chrF | vs tformer beam 4 | identical to tformer beam 4 | seconds |",
            "|---|---:|---:|---:|---:|---:|"]
    tic = time.perf_counter()
    own = [t.text for t in translator.translate(corpus.src, beam=4)]
    base = translation_scores(own, corpus.tgt, data.tgt_lang)
    results = [("tformer, beam 4 (GNMT length penalty 0.6)", own, time.perf_counter() - tic)]
    tic = time.perf_counter()
    results.append(("tformer, the run's decoding", [t.text for t in translator.translate(corpus.src)],
                    time.perf_counter() - tic))
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("int8", None):
            package = export_argos(args.checkpoint, Path(tmp) / f"{quantization or 'fp32'}.argosmodel",
                                   quantization=quantization)
            out, seconds = run_argos(package, corpus.src, data.src_lang, data.tgt_lang,
                                     Path(tmp) / f"home-{quantization}")
            results.append((f"argostranslate, {quantization or 'float32'} package", out, seconds))
    for name, hyps, seconds in results:
        s = translation_scores(hyps, corpus.tgt, data.tgt_lang)
        same = sum(a == b for a, b in zip(hyps, own))
        rows.append(f"| {name} | {s.bleu:.2f} | {s.chrf:.2f} | {s.bleu - base.bleu:+.2f} | {same}/{len(own)} | "
                    f"{seconds:.1f} |")
        print(rows[-1], flush=True)
    notes = (f"{args.checkpoint}, {args.split} split ({len(corpus.src)} sentences, {corpus.origin}); argostranslate "
             "one sentence per call, in a child process with a temporary home; seconds: translating only.")
    report(f"Argos Translate package against tformer ({Path(args.checkpoint).name}, {args.split})", rows, notes,
           args.record)


if __name__ == "__main__":
    main()
