"""Speech recognition on the spoken corpus: TUPE-R against sinusoidal positions at an equal time budget, with the
cost of the audio front end (synthesis, features, memory).

    python benchmarks/speech.py [--corpus runs/spoken] [--models tupe-r sinusoidal conv] [--minutes 20]
        [--parallel 2] [--beam 4] [--record] [--note TEXT]

1. The corpus: `tformer data spoken` from ../shared/data/fra-eng (its English side), 10,000 training sentences x 2
   voices, 300 valid, 500 test (and the same 500 at 10 dB SNR), unless --corpus already holds one.
2. Features: `tformer prepare` (80 log-mel filterbanks, float16 shards, CMVN), timed; then fbank alone in one
   process on the first 300 training files (hours of audio per minute); then the peak RSS of a prepare and of
   one pass reading every utterance, at two corpus sizes (a quarter and all of the training list), each in a
   fresh process.
3. Models: each trains for --minutes of wall time (train.max_hours, evaluations included) with one thread,
   --parallel at a time side by side (so each sees the same machine); the best checkpoint (validation CER) is
   scored on test (clean) and test_snr10, greedy and with beam --beam.

    tupe-r+ctc       recipe speech_tupe: TUPE-R encoder (untied positional bias + relative term), LFR 4/3,
                     joint CTC/attention training (model.ctc, train.ctc_weight 0.3)
    sinusoidal+ctc   recipe speech_baseline: the same model, sinusoidal positions added to the frames
    tupe-r, sinusoidal   the same two with model.ctc=false: the attention decoder's loss alone
    tupe+ctc         speech_tupe with model.positions=tupe (TUPE-A, no relative term)
    conv+ctc         speech_baseline with the x4 convolutional front end instead of LFR stacking
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TFORMER = [sys.executable, "-m", "tformer"]
MODELS = {
    "tupe-r+ctc": ("speech_tupe", []),
    "sinusoidal+ctc": ("speech_baseline", []),
    "tupe-r": ("speech_tupe", ["model.ctc=false"]),
    "sinusoidal": ("speech_baseline", ["model.ctc=false"]),
    "tupe+ctc": ("speech_tupe", ["model.positions=tupe"]),
    "conv+ctc": ("speech_baseline", ["model.frontend=conv"]),
}


def peak_rss_mb(code: str) -> float:
    """Peak RSS (MB) of a fresh Python process running `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport resource;print(resource.getrusage("
                          "resource.RUSAGE_SELF).ru_maxrss)"], capture_output=True, text=True, check=True, cwd=ROOT)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def corpus(args) -> dict:
    if not (args.corpus / "spoken.json").exists():
        tic = time.perf_counter()
        subprocess.run([*TFORMER, "data", "spoken", "--text", str(SHARED_DATA / "fra-eng" / "fra.txt.gz"), "--out",
                        str(args.corpus), "--train", str(args.train)], check=True)
        print(f"synthesised in {time.perf_counter() - tic:.0f} s")
    return json.loads((args.corpus / "spoken.json").read_text())


def features(args, spoken: dict) -> list[str]:
    rows = []
    timing = args.corpus.parent / f"{args.corpus.name}-prepared-timing"  # from nothing, each time
    shutil.rmtree(timing, ignore_errors=True)
    tic = time.perf_counter()
    subprocess.run([*TFORMER, "prepare", "--config", "speech_tupe", "--out", str(timing), f"data.dir={args.corpus}",
                    "--no-progress"], check=True)
    seconds = time.perf_counter() - tic
    hours = sum(spoken["hours"][s] for s in ("train", "valid", "test"))
    rows.append(f"| prepare (2 processes), {hours:.2f} h of audio | {seconds:.0f} s | "
                f"{seconds / hours:.1f} s per hour of audio |")
    from tformer.data.audio import audio_features, read_audio
    files = sorted((args.corpus / "train").glob("*.flac"))[:300]
    audio = sum(read_audio(f).size for f in files) / 16000 / 3600
    tic = time.perf_counter()
    for f in files:
        audio_features(f)
    t = time.perf_counter() - tic
    rows.append(f"| read + fbank, one process, {len(files)} files ({audio * 60:.1f} min of audio) | {t:.1f} s | "
                f"{audio / (t / 60):.1f} hours of audio per minute |")
    lines = (args.corpus / "train.tsv").read_text().splitlines()
    for share in (4, 1):
        sub = args.corpus / f"train_{share}.tsv"
        sub.write_text("\n".join(lines[: len(lines) // share]) + "\n")
        out = args.corpus.parent / f"{args.corpus.name}-rss-{share}"
        shutil.rmtree(out, ignore_errors=True)
        code = (f"import dataclasses, tformer\nfrom tformer.data.features import prepare_features\n"
                f"cfg = tformer.Config.from_yaml('speech_tupe', ['data.dir={args.corpus}', "
                f"'data.train_prefix=train_{share}', 'data.workers=1'])\n"
                f"prepare_features(cfg.data, '{out}', 80, ['train'])")
        prep = peak_rss_mb(code)
        read = peak_rss_mb(f"from tformer.data.features import PreparedFeatures\nf = PreparedFeatures.open('{out}')"
                           ".frames('train')\nn = 0\nfor i in range(len(f)):\n    n += f[i].shape[0]\n"
                           "    if i % 1000 == 999:\n        f.release()  # training: every 256 updates")
        rows.append(f"| peak RSS, {len(lines) // share:,} training utterances | prepare (1 worker) {prep:.0f} MB | "
                    f"read every utterance {read:.0f} MB |")
    return rows


def train(args, names: list[str]) -> None:
    prepared = args.corpus.parent / f"{args.corpus.name}-prepared"
    subprocess.run([*TFORMER, "prepare", "--config", "speech_tupe", "--out", str(prepared), f"data.dir={args.corpus}",
                    "--no-progress"], check=True)  # once; a rerun finds it complete
    procs: list[tuple[str, subprocess.Popen]] = []
    for name in names:
        run_dir = args.runs / name
        if (run_dir / "done").exists():
            continue
        recipe, extra = MODELS[name]
        cmd = [*TFORMER, "train", "--config", recipe, "--run-dir", str(run_dir), f"data.dir={args.corpus}",
               f"data.prepared={prepared}", f"train.max_hours={args.minutes / 60}", "train.threads=1",
               "--no-progress", *extra]
        while len([p for _, p in procs if p.poll() is None]) >= args.parallel:
            time.sleep(5)
        run_dir.mkdir(parents=True, exist_ok=True)
        print(" ".join(cmd))
        procs.append((name, subprocess.Popen(cmd, stdout=open(run_dir / "train.log", "w"), stderr=subprocess.STDOUT,
                                             cwd=ROOT)))
    for name, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"{name} failed: see {args.runs / name / 'train.log'}")
        (args.runs / name / "done").write_text("")


def score(args, name: str) -> dict:
    import tformer

    cache = args.runs / name / "scores.json"
    if cache.exists():
        return json.loads(cache.read_text())
    out: dict = {}
    for prefix in ("test", "test_snr10"):
        t = tformer.load(args.runs / name, threads=2, overrides=[f"data.dir={args.corpus}", "data.prepared=",
                                                                 f"data.test_prefix={prefix}"])
        for beam in (1, args.beam):
            e = t.evaluate("test", beam=beam)
            out[f"{prefix}/{beam}"] = {"cer": e.metrics["cer"], "wer": e.metrics["wer"], "seconds": e.seconds}
    log = [json.loads(line) for line in (args.runs / name / "metrics.jsonl").read_text().splitlines()]
    out["steps"] = max(r.get("step", 0) for r in log)
    out["params"] = sum(p.numel() for p in t.model.parameters())
    cache.write_text(json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=ROOT / "runs" / "spoken")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "speech-bench")
    ap.add_argument("--train", type=int, default=10000, help="training sentences when the corpus is built here")
    ap.add_argument("--models", nargs="+", default=["tupe-r+ctc", "sinusoidal+ctc"], choices=list(MODELS))
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--skip-features", action="store_true", help="leave out step 2's timings")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    spoken = corpus(args)
    rows = ["| front end | time | rate |", "|---|---|---|"]
    rows += [] if args.skip_features else features(args, spoken)
    train(args, args.models)
    table = rows + ["", f"| model ({args.minutes:g} min, 1 thread each, {args.parallel} side by side) | updates | "
                    f"test CER | test WER | 10 dB CER | 10 dB WER | test CER, beam {args.beam} | 10 dB CER, beam "
                    f"{args.beam} |", "|---|---|---|---|---|---|---|---|"]
    for name in args.models:
        s = score(args, name)
        table.append(f"| {name} ({MODELS[name][0]} {' '.join(MODELS[name][1])}) | {s['steps']} | "
                     f"{s['test/1']['cer']:.1f} | {s['test/1']['wer']:.1f} | {s['test_snr10/1']['cer']:.1f} | "
                     f"{s['test_snr10/1']['wer']:.1f} | {s[f'test/{args.beam}']['cer']:.1f} | "
                     f"{s[f'test_snr10/{args.beam}']['cer']:.1f} |")
    notes = (f"Corpus: {spoken['utterances']} utterances ({spoken['hours']} hours) synthesised by "
             f"{spoken['espeak_ng'].split('  Data')[0]}; test sentences never spoken in training. CER/WER in percent "
             "(edits / reference characters or words), best checkpoint by validation CER. " + args.note)
    report("Speech: TUPE-R and sinusoidal encoders on real (synthesised) audio", table, notes, args.record)


if __name__ == "__main__":
    main()
