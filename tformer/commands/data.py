"""tformer data: download Multi30k or WMT14 en-de (checksums verified), write a synthetic task as parallel
text files, synthesise a spoken corpus with espeak-ng, or clean a parallel corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.config import SYNTHETIC_TASKS
from tformer.data.spoken import SpokenSettings


def add_parser(sub) -> None:
    sp = sub.add_parser("data", help="download Multi30k or WMT14 en-de, write a synthetic task, or synthesise speech",
                        description="multi30k: download the official Multi30k task-1 English-German files "
                        "(checksums verified). wmt14: download the WMT14 English-German training archives "
                        "(Europarl v7, Common Crawl, News Commentary v9) and newstest2013/2014 (about 1.2 GB, "
                        "checksums verified) and write {train,newstest2013,newstest2014}.{en,de}; a rerun keeps "
                        "what is complete. copy/sort/reverse: write {train,valid,test}.{src,tgt} of a synthetic task. "
                        "spoken: read sentences of --text aloud with espeak-ng (several voices, speeds, pitches, "
                        "noise at chosen SNRs), split by sentence, as a speech corpus (16 kHz flac + "
                        "'id<TAB>transcript' lists) for the speech_tupe and speech_baseline recipes. clean: "
                        "copy a parallel corpus (--src, --tgt) into --out without empty, over-long, unbalanced, "
                        "untranslated, duplicate or (--langid) wrong-language pairs, and say how many of each.")
    sp.add_argument("task", choices=("multi30k", "wmt14", *SYNTHETIC_TASKS, "spoken", "clean"))
    sp.add_argument("--out", required=True, help="output folder")
    sp.add_argument("--url", help="multi30k, wmt14: base URL to fetch from, holding the files under their "
                    "upstream names (default: the official locations)")
    sp.add_argument("--config", help="YAML file (or recipe name) whose data section to use")
    spoken = sp.add_argument_group("spoken (see tformer.data.spoken)")
    spoken.add_argument("--text", help="sentences, one per line (plain or .gz; a tab-separated line gives its first "
                        "field, so the fra-eng file works as it is)")
    d = SpokenSettings()
    for name, help_ in (("train", "training sentences"), ("valid", "validation sentences"),
                        ("test", "test sentences"), ("renditions", "voices per training sentence"),
                        ("seed", "draws the sentences, voices and noise"), ("workers", "processes (0: one per core)")):
        spoken.add_argument(f"--{name}", type=int, default=getattr(d, name),
                            help=f"{help_} (default {getattr(d, name)})")
    spoken.add_argument("--snr", type=float, nargs="+", default=list(d.snrs), metavar="DB",
                        help="training: clean or white noise at one of these SNRs (default "
                        f"{' '.join(map(str, d.snrs))})")
    spoken.add_argument("--test-snr", type=float, default=d.test_snr, help="SNR of the noisy test copy (default "
                        f"{d.test_snr:g}: test_snr{d.test_snr:g}.tsv)")
    spoken.add_argument("--voices", nargs="+", default=list(d.voices), help="espeak-ng languages (default: "
                        f"{' '.join(d.voices)})")
    spoken.add_argument("--variants", nargs="+", default=list(d.variants), help="espeak-ng voice variants (default: "
                        f"{' '.join(d.variants)})")
    clean = sp.add_argument_group("clean (see tformer.data.clean; the outputs keep the inputs' names, .gz dropped)")
    clean.add_argument("--src", help="the source side: one sentence per line, plain or gzip")
    clean.add_argument("--tgt", help="the target side, line by line the translation of --src")
    clean.add_argument("--max-words", type=int, default=250, help="drop a pair with a side longer than this "
                       "(whitespace words; default 250)")
    clean.add_argument("--max-ratio", type=float, default=3.0, help="drop a pair whose longer side has more than "
                       "this times the words of the shorter (default 3)")
    clean.add_argument("--keep-duplicates", action="store_true", help="keep repeated pairs (default: the first only)")
    clean.add_argument("--keep-copies", action="store_true", help="keep pairs whose sides are the same text")
    clean.add_argument("--langid", nargs=2, metavar=("SRC_LANG", "TGT_LANG"), help="drop a pair with a side that "
                       "py3langid finds likelier to be the pair's other language (ISO 639-1 codes, e.g. en de)")
    sp.add_argument("overrides", nargs="*", metavar="data.key=value", help="e.g. data.symbols=10 data.seed=7")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.task == "multi30k":
        from tformer.data.download import MULTI30K_URL, download_multi30k

        for path in download_multi30k(args.out, args.url or MULTI30K_URL):
            print(path)
        print(f"now: tformer train --config multi30k_quick data.dir={args.out} --run-dir runs/multi30k_quick   (about "
              "two minutes; multi30k_en_de for the full recipe)")
        return 0
    if args.task == "wmt14":
        from tformer.data.download import download_wmt14

        for f in download_wmt14(args.out, args.url):
            print(f"{f.path}: {f.lines} lines" if f.lines is not None else f"{f.path}: kept (complete already)")
        print(f"now: tformer prepare --config wmt14_en_de data.dir={args.out} --out {args.out}/prepared\n"
              f"then: tformer train --config wmt14_en_de data.dir={args.out} data.prepared={args.out}/prepared")
        return 0
    if args.task == "spoken":
        return _spoken(args)
    if args.task == "clean":
        return _clean(args)
    from tformer.config import Config, load_config
    from tformer.data import SPLITS, load_pairs
    from tformer.data.text import write_parallel

    overrides = [f"data.task={args.task}", *args.overrides]
    cfg = (Config.from_yaml(args.config, overrides) if args.config else load_config(None, overrides)).data
    for split in SPLITS:
        pairs = load_pairs(cfg, split)
        write_parallel(args.out, split, pairs)
        print(f"{args.out}/{split}.src, {split}.tgt: {len(pairs)} pairs")
    return 0


def _spoken(args: argparse.Namespace) -> int:
    from tformer.data.corpus import iter_lines
    from tformer.data.spoken import build_spoken_corpus
    from tformer.errors import ConfigError

    if not args.text:
        raise ConfigError("tformer data spoken needs --text FILE, the sentences to speak (e.g. "
                          "../shared/data/fra-eng/fra.txt.gz)")
    settings = SpokenSettings(train=args.train, valid=args.valid, test=args.test, renditions=args.renditions,
                              snrs=tuple(args.snr), test_snr=args.test_snr, voices=tuple(args.voices),
                              variants=tuple(args.variants), seed=args.seed, workers=args.workers)
    corpus = build_spoken_corpus(iter_lines(Path(args.text)), args.out, settings, source=str(args.text))
    for split, n in corpus.splits.items():
        print(f"{args.out}/{split}.tsv: {n} utterances, {corpus.seconds[split] / 3600:.2f} hours")
    print(f"synthesised by {corpus.espeak}")
    print(f"now: tformer train --config speech_tupe data.dir={args.out}")
    return 0


def _clean(args: argparse.Namespace) -> int:
    import json

    from tformer.data.clean import CleanRules, clean_files
    from tformer.errors import ConfigError

    if not args.src or not args.tgt:
        raise ConfigError("tformer data clean needs --src FILE and --tgt FILE, the two sides of the corpus")
    rules = CleanRules(max_words=args.max_words, max_ratio=args.max_ratio, dedup=not args.keep_duplicates,
                       copies=not args.keep_copies, languages=tuple(args.langid) if args.langid else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [Path(p).name.removesuffix(".gz") for p in (args.src, args.tgt)]
    if names[0] == names[1]:
        raise ConfigError(f"--src and --tgt are both named {names[0]}; the outputs keep the inputs' names")
    report = clean_files(args.src, args.tgt, out / names[0], out / names[1], rules, progress=True)
    (out / "clean.json").write_text(json.dumps({"src": args.src, "tgt": args.tgt, "rules": vars(rules) | {
        "languages": rules.languages}, **report.as_dict()}, indent=1) + "\n", encoding="utf-8")
    dropped = ", ".join(f"{n} {reason}" for reason, n in report.dropped.items() if n) or "none"
    print(f"{out / names[0]}, {out / names[1]}: kept {report.kept:,} of {report.read:,} pairs; dropped: {dropped} "
          f"({report.seconds:.1f} s; counts in {out / 'clean.json'})")
    return 0
