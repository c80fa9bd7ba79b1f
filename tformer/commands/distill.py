"""tformer distill: a teacher translates a training corpus for a student to learn from (tformer.distill)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.commands import common


def add_parser(sub) -> None:
    sp = sub.add_parser("distill", help="a teacher translates a training corpus, for a student (knowledge distillation)",
                        description="Sequence-level knowledge distillation's corpus: the teacher (--checkpoint; give "
                        "it several times for an ensemble, or an imported OPUS-MT folder) translates --src (by "
                        "default its own training split) with the decoding flags (beam search: --beam 5), and --out "
                        "gets train.SRC and train.TGT (the checkpoint's languages), line by line. It resumes: "
                        "chunks of --chunk-size lines are "
                        "written as they are done, and running the same command again goes on after the last one "
                        "written. With --ref (the corpus's target side) and --nbest N, the hypothesis of the N-best "
                        "closest to the reference by sentence chrF is kept (the Firefox Translations pipeline's "
                        "selection). With --student RECIPE (student_deep_shallow, student_small, or a YAML file) "
                        "a student then trains on the folder into --student-dir, a lexical shortlist is built "
                        "from the folder for it, and a table compares teacher, student and student with int8 "
                        "weights and the shortlist on the test split (BLEU, chrF, speed, size), also written to "
                        "STUDENT_DIR/distill_report.json. Example: tformer distill --checkpoint runs/teacher --src "
                        "train.en --ref train.de --beam 5 --out runs/distilled --student student_deep_shallow "
                        "--student-dir runs/student")
    sp.add_argument("--checkpoint", required=True, action="append", help=common.ENSEMBLE_HELP)
    sp.add_argument("--src", help="the corpus's source side, one sentence per line (plain or gzip); default: the "
                    "teacher's own training split (its config's corpus, a TSV file's seeded split included), "
                    "written to OUT/source.SRC and OUT/source.TGT, the latter the references")
    sp.add_argument("--ref", help="its target side, for --nbest selection")
    sp.add_argument("--out", required=True, help="the folder: train.SRC, train.TGT, distill.json, parts/")
    sp.add_argument("--chunk-size", type=int, default=10_000, metavar="N",
                    help="lines translated and written at a time: what a stop can lose (default 10000)")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a progress bar")
    sp.add_argument("--student", metavar="RECIPE", help="train this recipe on the distilled corpus, then compare")
    sp.add_argument("--student-dir", metavar="DIR", help="the student's run folder (with --student; a run there "
                    "is resumed)")
    sp.add_argument("--student-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting of the student's recipe (train.max_hours=0.5, model.d_model=256, ...)")
    common.decoding(sp)
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.distill import distill_corpus, write_split
    from tformer.errors import ConfigError

    teacher = common.load_translator(args)
    if args.print_config:
        common.print_config(teacher.config)
        return 0
    if args.student and not args.student_dir:
        raise ConfigError("--student needs --student-dir, the student's run folder")
    if args.student_set and not args.student:
        raise ConfigError("--student-set sets the student's recipe: give --student RECIPE")
    src, ref = args.src, args.ref
    if src is None:
        if ref is not None:
            raise ConfigError("--ref is the target side of --src: give --src too, or neither (the teacher's own "
                              "training split)")
        src, ref = write_split(teacher, "train", args.out, prefix="source")
    report = distill_corpus(teacher, src, args.out, references=ref, chunk_size=args.chunk_size,
                            progress=args.progress)
    again = f" ({report.resumed_chunks} of {report.chunks} chunks from an earlier run)" if report.resumed_chunks else ""
    print(f"{report.sources}, {report.targets}: {report.lines:,} lines{again} in {report.seconds:.1f} s")
    if args.student:
        _student(args, teacher, report)
    else:
        print(f"next: train a student on it, e.g. tformer distill ... --student student_small (or tformer train "
              f"--config student_small with data.dir at {Path(report.targets).parent})")
    return 0


def _student(args: argparse.Namespace, teacher, report) -> None:
    """Train the student, build its shortlist, compare the three on the test split."""
    import dataclasses
    import json
    from pathlib import Path

    from tformer.api import load
    from tformer.distill import compare, format_rows, student_overrides
    from tformer.files import replace_atomically
    from tformer.shortlist import build_shortlist
    from tformer.training.start import train

    run_dir = Path(args.student_dir)
    resume = (run_dir / "checkpoints").is_dir()
    train(None if resume else args.student, run_dir, resume=resume,
          overrides=[] if resume else student_overrides(teacher, args.out) + args.student_set, progress=args.progress)
    student = load(run_dir, device="cpu")
    shortlist = run_dir / "shortlist.safetensors"
    build_shortlist(student, report.sources, report.targets).save(shortlist)
    fast = load(run_dir, device="cpu", quantize="int8", shortlist=str(shortlist))
    sources, references = student.load_split("test").texts["test"]
    options = {"beam": args.beam} if args.beam else {}
    rows = compare({"teacher": teacher, "student": student, "student, int8 + shortlist": fast}, sources, references,
                   student.config.data.tgt_lang, **options)
    print(format_rows(rows))
    with replace_atomically(run_dir / "distill_report.json") as f:
        f.write(json.dumps({"teacher": [str(p) for p in args.checkpoint], "corpus": report.targets,
                            "shortlist": str(shortlist), "test sentences": len(sources),
                            "rows": [dataclasses.asdict(r) for r in rows]}, indent=1) + "\n")
