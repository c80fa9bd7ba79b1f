"""Documents on a trained model (tformer.documents): paragraphs against sentence-by-sentence translation, and
the HTML fixtures through the API and through the LibreTranslate endpoint.

    python benchmarks/documents.py --checkpoint runs/m30k_quick [--split test] [--seed 0] [--record]

Paragraphs: the split's sentences, in order, joined with one space into paragraphs of 2 to 6 (seeded draw);
the references joined the same way. Both rows are scored on those paragraphs (sacreBLEU against the joined
references), so they differ only in how the model saw the text:
    sentence by sentence   each sentence translated alone (the oracle: the model's own unit), joined
    paragraph              tformer.documents.translate_documents on the paragraph: split by sentencex,
                           translated in one batch, put back
"boundaries right" counts paragraphs whose split found exactly the joined sentences. Multi30k sentences often
lack a final full stop, which no splitter can see; the table also scores the paragraphs whose inner sentences
all end in . ! or ? on their own.

Markup: every fixture of tests/fixtures/html translated by the model through the API (format html) and by a
live `tformer serve` through LibreTranslate's POST /translate (format=html, the form libretranslatepy posts):
whether it parses, keeps its multiset of tags with their attributes, keeps its pass-through elements, and
whether the two answers are the same.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

import json  # noqa: E402

import lxml.html  # noqa: E402

import tformer  # noqa: E402
from tformer.data.translation import read_split  # noqa: E402
from tformer.documents import prepare, translate_documents  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402
from tformer.training.checkpoint import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PASS = {"code", "pre", "script", "style", "kbd", "samp", "var", "textarea"}


def paragraphs(n: int, seed: int) -> list[range]:
    rng, out, at = random.Random(seed), [], 0
    while at < n:
        size = min(rng.randint(2, 6), n - at)
        out.append(range(at, at + size))
        at += size
    return out


def _read(html: str):
    if html.lstrip().lower().startswith("<!doctype"):
        return lxml.html.document_fromstring(html)
    return lxml.html.fragment_fromstring(html, create_parent="div")


def _tags(root) -> collections.Counter:
    return collections.Counter((el.tag, tuple(sorted(el.attrib.items()))) if isinstance(el.tag, str)
                               else ("<!---->", el.text) for el in root.iter())


def _passed(root) -> collections.Counter:
    def is_pass(el):
        return not isinstance(el.tag, str) or el.tag in PASS or el.get("translate") == "no"
    out = collections.Counter()
    for el in root.iter():
        if is_pass(el) and not any(is_pass(a) for a in el.iterancestors()):
            out[lxml.html.tostring(el, with_tail=False, encoding="unicode")] += 1
    return out


def paragraph_rows(translator, corpus, lang: str, seed: int) -> tuple[list[str], str]:
    groups = paragraphs(len(corpus.src), seed)
    text = [" ".join(corpus.src[i] for i in g) for g in groups]
    refs = [" ".join(corpus.tgt[i] for i in g) for g in groups]
    terminated = [all(corpus.src[i].rstrip()[-1:] in ".!?" for i in list(g)[:-1]) for g in groups]
    tic = time.perf_counter()
    alone = [t.text for t in translator.translate(corpus.src)]
    t_alone = time.perf_counter() - tic
    tic = time.perf_counter()
    para = translate_documents(translator, text)
    t_para = time.perf_counter() - tic
    joined = [" ".join(alone[i] for i in g) for g in groups]
    right = sum(prepare(p, lang=corpus_lang(translator)).sentences == [corpus.src[i].strip() for i in g]
                for p, g in zip(text, groups))
    rows = ["| translation | paragraphs | sacreBLEU | chrF | sacreBLEU, terminated paragraphs | boundaries right | "
            "seconds |", "|---|---:|---:|---:|---:|---:|---:|"]
    kept = [i for i, ok in enumerate(terminated) if ok]
    for name, hyps, seconds, bounds in (("sentence by sentence", joined, t_alone, "(given)"),
                                        ("paragraph (split, batch, join)", para, t_para, f"{right}/{len(groups)}")):
        s = translation_scores(hyps, refs, lang)
        s_kept = translation_scores([hyps[i] for i in kept], [refs[i] for i in kept], lang)
        rows.append(f"| {name} | {len(groups)} | {s.bleu:.2f} | {s.chrf:.2f} | {s_kept.bleu:.2f} ({len(kept)}) | "
                    f"{bounds} | {seconds:.1f} |")
        print(rows[-1], flush=True)
    return rows, f"{len(corpus.src)} sentences in {len(groups)} paragraphs of 2-6 (seed {seed})"


def corpus_lang(translator) -> str:
    return translator.config.data.src_lang


def markup_rows(translator) -> list[str]:
    from tformer.serve import Server, Settings
    import threading

    fixtures = sorted((ROOT / "tests" / "fixtures" / "html").glob("*.html"))
    server = Server(translator, "127.0.0.1", 0, Settings(max_sentences=256, max_chars=4000, max_tokens=512))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    data = translator.config.data
    counts = collections.Counter()
    try:
        for path in fixtures:
            html = path.read_text(encoding="utf-8")
            api = translate_documents(translator, [html], format="html")[0]
            form = urllib.parse.urlencode({"q": html, "source": data.src_lang, "target": data.tgt_lang,
                                           "format": "html"}).encode()
            with urllib.request.urlopen(urllib.request.Request(server.url.rstrip("/") + "/translate", data=form),
                                        timeout=120) as r:
                served = json.loads(r.read())["translatedText"]
            try:
                before, after = _read(html), _read(api)
                counts["parsed"] += 1
            except Exception:
                continue
            counts["tags kept"] += _tags(after) == _tags(before)
            counts["pass-through kept"] += _passed(after) == _passed(before)
            counts["LibreTranslate = API"] += served == api
    finally:
        server.stop()
        thread.join(30)
    n = len(fixtures)
    return ["| fixtures | parsed | tag multiset kept | pass-through kept | LibreTranslate format=html = API |",
            "|---:|---:|---:|---:|---:|",
            f"| {n} | {counts['parsed']}/{n} | {counts['tags kept']}/{n} | {counts['pass-through kept']}/{n} | "
            f"{counts['LibreTranslate = API']}/{n} |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a translation run (or checkpoint) folder")
    ap.add_argument("--split", default="test", help="the run's split: valid or test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = ap.parse_args()
    data = load_checkpoint(args.checkpoint).cfg.data
    corpus = read_split(data, args.split)
    translator = tformer.load(args.checkpoint)
    rows, what = paragraph_rows(translator, corpus, data.tgt_lang, args.seed)
    markup = markup_rows(translator)
    print("\n".join(markup))
    notes = (f"{args.checkpoint}, {args.split} split ({corpus.origin}): {what}; greedy (the run's decoding). Markup: "
             "tests/fixtures/html through the API and a live server's LibreTranslate endpoint.")
    report(f"Documents: paragraphs and HTML ({Path(args.checkpoint).name}, {args.split})", rows + [""] + markup,
           notes, args.record)


if __name__ == "__main__":
    main()
