"""Sentence splitters on real paragraphs: boundary precision/recall/F1, exact paragraphs, speed.

    python benchmarks/sentence_split.py [--paragraphs 500] [--rounds 3] [--record]

A "real paragraph" is 2-6 consecutive lines of a corpus (seeded), joined with one space; the lines are the
gold sentences. Corpora (shared/data): WMT newstest2013+2014 en/de (document-ordered news), Multi30k test2016
en/de (image captions), Tatoeba fra-eng fr/en (short conversational sentences). By default a paragraph is
dropped when one of its lines other than the last ends without . ! ? or … (a headline): no splitter can see
that boundary once the lines are joined with a space; `--keep-unterminated` keeps them.

Every splitter's output goes through the same alignment (tformer.documents.sentences.align) to get character
offsets; a boundary is the start offset of every sentence after the first. Speed is sentences per second of
the splitter call alone, best of `--rounds` passes over the paragraphs.

Splitters (pip install sentencex pysbd sentence-splitter syntok blingfire): sentencex (Wikimedia), pysbd,
sentence-splitter (Moses non-breaking prefixes), syntok (no language argument: en/de/es rules) and blingfire
(no language argument). Only sentencex is a dependency of tformer; the last row is tformer's own
split_sentences (sentencex, opening quotes moved to the sentence they open, alignment included in its speed).
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED_DATA, report

from tformer.documents.sentences import align, split_sentences

TERMINATED = re.compile(r"[.!?…][\s\"'»«“”„’)\]]*$")


def read_lines(path: Path, column: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return [line.split("\t")[column] for line in lines] if column is not None else lines


def corpora(data: Path) -> dict[tuple[str, str], list[str]]:
    """(corpus, lang) -> lines in corpus order."""
    fra = data / "fra-eng" / "fra.txt.gz"
    out = {}
    for lang in ("en", "de"):
        out["newstest", lang] = (read_lines(data / "wmt14" / f"newstest2013.{lang}.gz")
                                 + read_lines(data / "wmt14" / f"newstest2014.{lang}.gz"))
        out["multi30k", lang] = read_lines(data / "multi30k" / f"test2016.{lang}.gz")
    out["tatoeba", "en"] = read_lines(fra, 0)[:-1]  # the last line is the Tatoeba disclaimer
    out["tatoeba", "fr"] = read_lines(fra, 1)[:-1]
    return out


def paragraphs(lines: list[str], n: int, seed: int, keep_unterminated: bool) -> tuple[list[list[str]], int]:
    """Cut `lines` into consecutive chunks of 2-6; return `n` of them (seeded, in corpus order) and how many
    chunks were dropped for an unterminated inner line."""
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(lines) - 1:
        k = rng.randint(2, 6)
        chunk = [s.strip() for s in lines[i:i + k]]
        i += k
        if len(chunk) >= 2 and all(chunk):
            chunks.append(chunk)
    kept = [c for c in chunks if keep_unterminated or all(TERMINATED.search(s) for s in c[:-1])]
    dropped = len(chunks) - len(kept)
    if len(kept) > n:
        kept = [kept[j] for j in sorted(rng.sample(range(len(kept)), n))]
    return kept, dropped


def splitters(lang: str) -> dict[str, callable]:
    """name -> function(text) -> list of sentence strings, for `lang`."""
    import blingfire
    import pysbd
    import sentencex
    from sentence_splitter import SentenceSplitter
    from syntok import segmenter

    sbd = pysbd.Segmenter(language=lang, clean=False)
    moses = SentenceSplitter(language=lang)

    def syntok_split(text):
        return [text[s[0].offset:s[-1].offset + len(s[-1].value)] for p in segmenter.analyze(text) for s in p]

    return {"sentencex": lambda text: list(sentencex.segment(lang, text)),
            "pysbd": sbd.segment,
            "sentence-splitter": moses.split,
            "syntok": syntok_split,
            "blingfire": lambda text: blingfire.text_to_sentences(text).split("\n"),
            "tformer (sentencex + opening quotes)": lambda text: [text[a:b] for a, b in split_sentences(text, lang)]}


def versions() -> str:
    from importlib.metadata import version
    return ", ".join(f"{p} {version(p)}" for p in ("sentencex", "pysbd", "sentence-splitter", "syntok", "blingfire"))


def evaluate(split, paras: list[list[str]], rounds: int) -> dict:
    texts = [" ".join(p) for p in paras]
    outputs, best = None, float("inf")
    for _ in range(rounds):
        tic = time.perf_counter()
        outputs = [split(t) for t in texts]
        best = min(best, time.perf_counter() - tic)
    tp = fp = fn = exact = 0
    errors = []
    for para, text, out in zip(paras, texts, outputs):
        offsets = [0]
        for s in para[:-1]:
            offsets.append(offsets[-1] + len(s) + 1)
        gold = set(offsets[1:])
        pred = set(align(text, out)) - {0}
        tp += len(gold & pred)
        fp += len(pred - gold)
        fn += len(gold - pred)
        exact += gold == pred
        if gold != pred:
            errors.append((text, sorted(pred - gold), sorted(gold - pred)))
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return {"paragraphs": len(paras), "exact": exact / len(paras), "p": p, "r": r,
            "f1": 2 * p * r / (p + r) if p + r else 0.0, "speed": sum(map(len, paras)) / best, "errors": errors}


def show(text: str, at: int, width: int = 30) -> str:
    return (text[max(0, at - width):at] + "|" + text[at:at + width]).replace("\n", " ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paragraphs", type=int, default=500, help="paragraphs per corpus and language")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes per splitter; the best counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    ap.add_argument("--keep-unterminated", action="store_true",
                    help="keep paragraphs whose inner lines lack final punctuation (headlines)")
    ap.add_argument("--examples", type=int, default=2, help="errors to print per splitter and corpus")
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()

    table = ["| corpus | lang | splitter | paragraphs | exact paragraphs | precision | recall | F1 | sentences/s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for (corpus, lang), lines in corpora(args.data).items():
        paras, dropped = paragraphs(lines, args.paragraphs, args.seed, args.keep_unterminated)
        notes.append(f"{corpus} {lang}: {len(paras)} paragraphs, {sum(map(len, paras))} sentences "
                     f"({dropped} chunks dropped for an unterminated inner line)")
        for name, split in splitters(lang).items():
            m = evaluate(split, paras, args.rounds)
            table.append(f"| {corpus} | {lang} | {name} | {m['paragraphs']} | {m['exact']:.1%} | {m['p']:.3f} | "
                         f"{m['r']:.3f} | {m['f1']:.3f} | {m['speed']:,.0f} |")
            for text, extra, missed in m["errors"][:args.examples]:
                what = [f"split at `{show(text, a)}`" for a in extra] + [f"missed `{show(text, a)}`" for a in missed]
                print(f"  {corpus} {lang} {name}: " + "; ".join(what[:3]), file=sys.stderr)
    report("Sentence splitting on real paragraphs (joined corpus lines)", table,
           versions() + ".\n\n" + "; ".join(notes) + ".", args.record)


if __name__ == "__main__":
    main()
