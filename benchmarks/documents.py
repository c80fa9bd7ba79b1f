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
whether the two answers are the same. Those counts say nothing of where tags land (no alignment at all keeps
every tag) and the two answers come from the same code; placement has an oracle of its own:

Placement: the split's sentences that hold one of PLACEMENT_WORDS once, whose reference holds its German word
once (dog -> Hund, red -> rot, ...; a form is the German word and up to 3 more letters: roter, Hunde), up to
--per-word of each in order, each as <p>..</p> with that one English word in an inline tag (b, i, a, em in
turn). Each output is read by lxml: of the outputs whose text holds a form of the German word, how many hold it
inside the tag ("tag holds it"), and how many hold nothing else there ("only it", punctuation aside). Three
rows, in one run on one model: the hard piece alignment (translate(alignment=True): each target piece's argmax
source piece, every pair kept; what translate_documents used before), translate_documents (each source word
to the target word that attends to it most, tformer.documents.word_alignment), and the live server's
LibreTranslate endpoint (whatever the server asks the model for).
"""

from __future__ import annotations

import argparse
import collections
import random
import re
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
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.data.translation import read_split  # noqa: E402
from tformer.documents import prepare, translate_documents  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PASS = {"code", "pre", "script", "style", "kbd", "samp", "var", "textarea"}
# English word -> the German word it translates to, one sense in Multi30k's captions
PLACEMENT_WORDS = {"dog": "Hund", "man": "Mann", "woman": "Frau", "girl": "Mädchen", "boy": "Junge", "child": "Kind",
                   "red": "rot", "blue": "blau", "black": "schwarz", "white": "weiß", "green": "grün",
                   "yellow": "gelb", "brown": "braun", "ball": "Ball", "water": "Wasser", "street": "Straße",
                   "beach": "Strand", "guitar": "Gitarre", "snow": "Schnee", "table": "Tisch", "camera": "Kamera",
                   "building": "Gebäude", "two": "zwei", "three": "drei"}
PLACEMENT_TAGS = ("<b>", "<i>", '<a href="#w">', "<em>")


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


def _bare(word: str) -> str:
    return re.sub(r"^\W+|\W+$", "", word)


def _forms(german: str) -> re.Pattern:
    return re.compile(re.escape(german) + r"\w{0,3}", re.IGNORECASE)


def placement_snippets(corpus, per_word: int) -> list[tuple[str, str, str]]:
    """(html, tag name, German word): test sentences with one English word of PLACEMENT_WORDS in a tag."""
    out = []
    for english, german in PLACEMENT_WORDS.items():
        forms, n = _forms(german), 0
        for src, tgt in zip(corpus.src, corpus.tgt):
            words = src.split()
            at = [k for k, w in enumerate(words) if _bare(w).lower() == english]
            if len(at) != 1 or sum(bool(forms.fullmatch(_bare(w))) for w in tgt.split()) != 1 or n == per_word:
                continue
            k, word = at[0], words[at[0]]
            tag = PLACEMENT_TAGS[len(out) % len(PLACEMENT_TAGS)]
            name = tag[1:].split()[0].rstrip(">")
            core = _bare(word)
            lead = word[:word.index(core)]
            words[k] = f"{lead}{tag}{core}</{name}>{word[len(lead) + len(core):]}"
            out.append((f"<p>{' '.join(words)}</p>", name, german))
            n += 1
    return out


def placed(html: str, tag: str, german: str) -> tuple[bool, bool, bool]:
    """(the output holds a form of `german`, the tag holds one, the tag holds nothing else)."""
    root = _read(html)
    forms = _forms(german)
    tagged = [_bare(w) for el in root.iter(tag) for w in el.text_content().split()]
    tagged = [w for w in tagged if w]
    holds = any(forms.fullmatch(w) for w in tagged)
    return (any(forms.fullmatch(_bare(w)) for w in root.text_content().split()), holds,
            holds and len(tagged) == 1)


def _libre(url: str, texts: list[str], data) -> list[str]:
    body = json.dumps({"q": texts, "source": data.src_lang, "target": data.tgt_lang, "format": "html"}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/translate", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())["translatedText"]


def placement_rows(translator, corpus, per_word: int) -> tuple[list[str], str]:
    from tformer.serve import Server, Settings
    import threading

    snippets = placement_snippets(corpus, per_word)
    texts = [h for h, _, _ in snippets]
    server = Server(translator, "127.0.0.1", 0, Settings(max_sentences=len(texts) + 1, max_chars=10 ** 6,
                                                          max_tokens=512, max_body=10 ** 7))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        tic = time.perf_counter()
        prepared = [prepare(t, "html", translator.config.data.src_lang) for t in texts]
        out, hard, at = translator.translate([s for p in prepared for s in p.sentences], alignment=True), [], 0
        for p in prepared:
            hard.append(p.assemble(out[at:at + len(p.sentences)]))
            at += len(p.sentences)
        t_hard = time.perf_counter() - tic
        tic = time.perf_counter()
        api = translate_documents(translator, texts, format="html")
        t_api = time.perf_counter() - tic
        tic = time.perf_counter()
        served = _libre(server.url, texts, translator.config.data)
        t_served = time.perf_counter() - tic
    finally:
        server.stop()
        thread.join(30)
    rows = ["| word alignment | snippets | output holds the word | tag holds it | tag holds only it | seconds |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, outputs, took in (("hard piece alignment, translate(alignment=True) (before)", hard, t_hard),
                                ("translate_documents: per source word, attention (after)", api, t_api),
                                ("LibreTranslate POST /translate format=html, live server", served, t_served)):
        counts = collections.Counter()
        for out, (_, tag, german) in zip(outputs, snippets):
            has, holds, only = placed(out, tag, german)
            counts.update({"has": has, "holds": has and holds, "only": has and only})
        n = counts["has"]
        rows.append(f"| {name} | {len(snippets)} | {n} | {counts['holds']}/{n} ({100 * counts['holds'] / n:.1f}%) | "
                    f"{counts['only']}/{n} ({100 * counts['only'] / n:.1f}%) | {took:.1f} |")
        print(rows[-1], flush=True)
    kinds = collections.Counter(g for _, _, g in snippets)
    return rows, (f"{len(snippets)} snippets, up to {per_word} per word ({len(kinds)} words: "
                  f"{', '.join(f'{e} {g}' for e, g in PLACEMENT_WORDS.items())})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a translation run (or checkpoint) folder")
    ap.add_argument("--split", default="test", help="the run's split: valid or test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-word", type=int, default=8, help="placement: at most this many snippets per word")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = ap.parse_args()
    data = load_checkpoint(args.checkpoint).cfg.data
    corpus = read_split(data, args.split)
    translator = tformer.load(args.checkpoint)
    rows, what = paragraph_rows(translator, corpus, data.tgt_lang, args.seed)
    markup = markup_rows(translator)
    print("\n".join(markup))
    placement, words = placement_rows(translator, corpus, args.per_word)
    notes = (f"{args.checkpoint}, {args.split} split ({corpus.origin}): {what}; greedy (the run's decoding). Markup: "
             f"tests/fixtures/html through the API and a live server's LibreTranslate endpoint. Placement: {words}.")
    report(f"Documents: paragraphs and HTML ({Path(args.checkpoint).name}, {args.split})",
           rows + [""] + markup + [""] + placement, notes, args.record)


if __name__ == "__main__":
    main()
