"""Distillation's targets (issue 49): a teacher against its distilled student, the student with int8 weights and a
lexical shortlist, the same student in CTranslate2 int8 with the shortlist as its vocabulary map, and the same
student recipe trained on the original data.

    python benchmarks/studies/distill.py --teacher runs/teacher --student runs/student --also "on the original data=runs/orig" \
        --shortlist runs/student/shortlist.safetensors [--rounds 3] [--record]

Quality: sacreBLEU and chrF on the test split, beam 4, each run's own length penalty. Speed: every engine
translates the test split at batch 32, beam 4, length penalty 0, outputs of at most --max-len tokens (the
settings CTranslate2 shares), taking turns for --rounds rounds (the median counts), each CTranslate2 model in a
worker process of its own (ct2_worker.py). Shortlist: how many outputs the shortlist leaves identical to the full
search, for fp32 and int8, greedy and beam 4. Sizes: the weights as held (torch.save of the state dict: int8
layers at a byte a weight), and the CTranslate2 folder's model.bin.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import report  # noqa: E402
from ct2_worker import CT2Worker  # noqa: E402

import tformer  # noqa: E402
import tformer.shortlist  # noqa: E402
from tformer.distill import parameter_count, weights_megabytes  # noqa: E402
from tformer.export import export_ctranslate2  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def _settings(path: str) -> str:
    """A shortlist file's --first and --best, as its rows name it."""
    s = tformer.shortlist.Shortlist.load(path).settings
    return f"shortlist first {s['first']}, best {s['best']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True, action="append", help="the teacher (twice: an ensemble)")
    ap.add_argument("--student", required=True, help="the student trained on the teacher's translations")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=RUN",
                    help="another model for the quality table and the speed table (fp32): the student recipe on the "
                    "original data, another student shape")
    ap.add_argument("--shortlist", required=True, help="the student's shortlist (tformer shortlist)")
    ap.add_argument("--more-shortlists", nargs="*", default=[], metavar="FILE",
                    help="other shortlists of the student (other --first/--best), for the identity table and the "
                    "speed table (int8)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    teacher_path = args.teacher[0] if len(args.teacher) == 1 else args.teacher
    teacher = tformer.load(teacher_path, device="cpu")
    student = tformer.load(args.student, device="cpu")
    int8 = tformer.load(args.student, device="cpu", quantize="int8")
    listed = tformer.load(args.student, device="cpu", shortlist=args.shortlist)
    fast = tformer.load(args.student, device="cpu", quantize="int8", shortlist=args.shortlist)
    others = {label: tformer.load(run, device="cpu") for label, run in (a.split("=", 1) for a in args.also)}
    more = {path: tformer.load(args.student, device="cpu", quantize="int8", shortlist=path)
            for path in args.more_shortlists}
    split = student.load_split(args.split)
    sources, refs = split.texts[args.split]
    lang = student.config.data.tgt_lang

    # ---- quality
    quality = ["| model | sacreBLEU | chrF | vs teacher | parameters | MB as held |", "|---|---:|---:|---:|---:|---:|"]
    named = [("teacher" + (" (ensemble)" if teacher.ensemble else ""), teacher), ("student", student),
             ("student, int8", int8), ("student, int8 + shortlist", fast)]
    named[2:2] = list(others.items())
    outputs: dict[str, list[str]] = {}
    base_bleu = None
    for name, t in named:
        outputs[name] = [x.text for x in t.translate(sources, beam=4, batch_size=args.batch_size)]
        s = translation_scores(outputs[name], refs, lang)
        base_bleu = s.bleu if base_bleu is None else base_bleu
        models = t.model.models if t.ensemble else [t.model]
        quality.append(f"| {name} | {s.bleu:.2f} | {s.chrf:.2f} | {s.bleu - base_bleu:+.2f} | "
                       f"{sum(parameter_count(m) for m in models):,} | "
                       f"{sum(weights_megabytes(m) for m in models):.2f} |")
        print(quality[-1], flush=True)

    # ---- shortlist identity
    same = ["| shortlist | mean list / vocabulary | decoding | fp32: identical to the full search | int8: identical "
            "to int8 without the shortlist |", "|---|---:|---|---:|---:|"]
    vocab = student.model.generator.out_features
    for path in [args.shortlist, *args.more_shortlists]:
        table = tformer.shortlist.Shortlist.load(path)
        mean = sum(len(table.allowed(student.encode(s))) for s in sources) / len(sources)
        pair = ((student, tformer.load(args.student, device="cpu", shortlist=path)),
                (int8, more.get(path, fast)))
        for beam in (1, 4):
            counts = []
            for full, short in pair:
                a = [x.text for x in full.translate(sources, beam=beam, batch_size=args.batch_size)]
                b = [x.text for x in short.translate(sources, beam=beam, batch_size=args.batch_size)]
                counts.append(sum(x == y for x, y in zip(a, b)))
            same.append(f"| {_settings(path)} | {mean:.0f} / {vocab} | "
                        f"{'greedy' if beam == 1 else f'beam {beam}'} | {counts[0]}/{len(sources)} "
                        f"({100 * counts[0] / len(sources):.1f}%) | {counts[1]}/{len(sources)} "
                        f"({100 * counts[1] / len(sources):.1f}%) |")
            print(same[-1], flush=True)

    # ---- speed, taking turns
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = export_ctranslate2(args.student, Path(tmp) / "ct2", quantization="int8", shortlist=args.shortlist)
        ct2_mb = (ct2_dir / "model.bin").stat().st_size / 2**20
        worker = CT2Worker(str(ct2_dir), args.threads)
        pieces = [student.pieces(student.encode(s), "source") for s in sources]
        common = dict(beam=4, len_penalty=0.0, max_len_a=0.0, max_len_b=args.max_len, batch_size=args.batch_size)
        engines = {"teacher, fp32": lambda: teacher.translate(sources, **common),
                   "student, fp32": lambda: student.translate(sources, **common),
                   "student, int8": lambda: int8.translate(sources, **common),
                   "student, fp32 + shortlist": lambda: listed.translate(sources, **common),
                   "student, int8 + shortlist": lambda: fast.translate(sources, **common),
                   **{f"student, int8 + {_settings(path)}": (lambda m=m: m.translate(sources, **common))
                      for path, m in more.items()},
                   **{f"{label}, fp32": (lambda m=m: m.translate(sources, **common)) for label, m in others.items()}}
        times: dict[str, list[float]] = {k: [] for k in [*engines, "CTranslate2 student, int8", "CTranslate2 student, "
                                                         "int8 + vocabulary map"]}
        for _ in range(args.rounds):
            for name, fn in engines.items():
                tic = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - tic)
            for name, vmap in (("CTranslate2 student, int8", False), ("CTranslate2 student, int8 + vocabulary map",
                                                                      True)):
                _, seconds = worker.translate(pieces, 4, args.max_len, args.batch_size, use_vmap=vmap)
                times[name].append(seconds)
        worker.close()
    median = {k: statistics.median(v) for k, v in times.items()}
    speed = ["| engine | seconds (median) | sentences/s | vs teacher fp32 | vs CTranslate2 int8 + vocabulary map |",
             "|---|---:|---:|---:|---:|"]
    for name, sec in median.items():
        speed.append(f"| {name} | {sec:.2f} | {len(sources) / sec:.0f} | {median['teacher, fp32'] / sec:.2f}x | "
                     f"{median['CTranslate2 student, int8 + vocabulary map'] / sec:.2f}x |")
        print(speed[-1], flush=True)
    notes = (f"teacher {args.teacher}, student {args.student}, also {args.also}, shortlist {args.shortlist}; "
             f"{args.split} split, {len(sources)} sentences ({split.origin if hasattr(split, 'origin') else lang}); "
             f"{args.threads} threads; quality at beam 4 with each run's length penalty; speed at batch "
             f"{args.batch_size}, beam 4, length penalty 0, at most {args.max_len} tokens, {args.rounds} rounds taking "
             f"turns, CTranslate2 in a worker process (int8, its model.bin {ct2_mb:.2f} MB). Seconds: translating "
             "text (tformer: tokenising included; CTranslate2: translate_batch on pieces).")
    report(f"Distillation: teacher, student, int8, shortlist ({Path(args.student).name}, {args.split})",
           quality + [""] + same + [""] + speed, notes, args.record)


if __name__ == "__main__":
    main()
