"""Documents through the API, the command line and the server (tformer.documents), against oracles: a
paragraph translates as its sentences do one by one, put back between its own whitespace; every HTML fixture
translated by a real model keeps its tag multiset and its pass-through content; where tags land is checked
on a stub translator whose word-reversal translations and alignments are known (WordReversal), the expected
HTML written out by hand, through the library and through a live server's LibreTranslate endpoint, and the
word alignment on hand-made attention; a glossary's terms become the constraints that sentence-level
translate takes; /v1/translate, LibreTranslate's /translate (text and html, its client's form) and `tformer
translate` answer what the library does; bad glossaries and requests are refused naming the line or field."""

import contextlib
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest

import tformer
from helpers.markup import FIXTURES, _passed, _read, _tags
from helpers.serve import CHECKPOINT, LINES, call, live
from tformer.documents import (Glossary, line_spans, prepare, translate_documents, word_alignment, word_attention,
                               word_of)
from tformer.documents.sentences import split_sentences
from tformer.errors import ConfigError, DataError
from tformer.explore import Explorer
from tformer.inspection import AttentionMaps
from tformer.results import Hypothesis, Translation
from tformer.serve import Server, Settings


def terms(glossary: Glossary, sentence: str) -> list[str]:
    """The target terms a glossary makes the sentence's outputs hold."""
    return glossary.phrases(sentence).get("constraints", [])


def _pieces(word: str) -> list[str]:
    """SentencePiece-like pieces of one word: '▁' and its first three characters, then three at a time."""
    return ["▁" + word[:3]] + [word[k:k + 3] for k in range(3, len(word), 3)]


class WordReversal:
    """A stub Translator whose translations are known without the code under test: hypothesis 0 of a
    sentence is its words reversed and upper-cased (target word j <- source word n-1-j), hypothesis 1 (with
    nbest > 1) its words in order, upper-cased (word i <- word i). Words come in several pieces each, and
    each target piece is aligned to its source word's piece at the same place (or the word's last). As
    Translator.translate does, it gives that hard alignment when asked for `alignment`, and with
    `return_attention` cross-attention maps: each target piece's query puts half its weight on that source
    piece and spreads the rest over every key, </s> included, in every layer and head. The rest (config,
    tokenizers: what a server reads) is the real translator's; a server's plans (prepare, run) are the real
    translator's, checked as ever, and run translates their sentences as `translate` does."""

    def __init__(self, real):
        self.real = real
        self.sentences = {}  # plan -> the sentences it was prepared from

    def prepare(self, sentences, **options):
        plan = self.real.prepare(sentences, **options)
        self.sentences[plan] = list(sentences)
        return plan

    def run(self, plans, cancelled=None):
        return [self.translate(self.sentences.pop(p), nbest=p.decoding.cfg.nbest, alignment=p.decoding.extras.alignment,
                               return_attention=p.decoding.extras.attention) for p in plans]

    def __getattr__(self, name):
        return getattr(self.real, name)

    def translate(self, sentences, *, nbest=None, alignment=False, return_attention=False, **options):
        out = []
        for sentence in sentences:
            words = sentence.split()
            source = [p for w in words for p in _pieces(w)]
            first = [sum(len(_pieces(w)) for w in words[:i]) for i in range(len(words))]
            orders = [list(reversed(range(len(words)))), list(range(len(words)))][:max(nbest or 1, 1)]
            hyps = []
            for order in orders:
                tokens, pairs = [], []
                for i in order:
                    target = _pieces(words[i].upper())
                    n = len(_pieces(words[i]))
                    pairs += [(first[i] + min(k, n - 1), len(tokens) + k) for k in range(len(target))]
                    tokens += target
                cross = np.full((len(tokens) + 1, len(source) + 1), 0.5 / (len(source) + 1))  # (T + 1, S + 1)
                cross[len(tokens)] *= 2  # </s>'s query: spread only
                for i, j in pairs:
                    cross[j, i] += 0.5
                maps = AttentionMaps(source + ["</s>"], ["<s>"] + tokens, tokens + ["</s>"],
                                     {"cross": np.broadcast_to(cross, (2, 4, *cross.shape)).copy()})
                text = " ".join(words[i].upper() for i in order)
                hyps.append(Hypothesis(text, tokens, 0.0, maps if return_attention else None,
                                       pairs if alignment else None))
            out.append(Translation(source, hyps))
        return out


# Several sentences in each block, tags on words of the first, second and last sentence of a block. Each
# tag's expected target words, read off the reversal by hand: "The red dog runs." -> "RUNS. DOG RED THE".
PLACED = ('<p>The <b>red</b> dog runs. A small <i>man</i> sings!</p>\n<ul><li>Two <a href="/w">women</a> wait. '
          'The <em>old</em> dog sleeps on <b>a green</b> bench.</li></ul>')
REVERSED = ('<p>RUNS. DOG <b>RED</b> THE SINGS! <i>MAN</i> SMALL A</p>\n<ul><li>WAIT. <a href="/w">WOMEN</a> TWO '
            'BENCH. <b>GREEN A</b> ON SLEEPS DOG <em>OLD</em> THE</li></ul>')
IN_ORDER = ('<p>THE <b>RED</b> DOG RUNS. A SMALL <i>MAN</i> SINGS!</p>\n<ul><li>TWO <a href="/w">WOMEN</a> WAIT. '
            'THE <em>OLD</em> DOG SLEEPS ON <b>A GREEN</b> BENCH.</li></ul>')


@pytest.fixture(scope="module")
def translator():
    return tformer.load(CHECKPOINT, device="cpu")


PARAGRAPHS = [f"{LINES[0]}. {LINES[1]}!  {LINES[2]}?\n\n {LINES[3]}. ", f"  {LINES[4]}", "", "   \n"]


def _by_sentences(translator, text, **options):
    """The oracle: each sentence split_sentences finds, translated alone, put back in place."""
    out, at = [], 0
    for a, b in split_sentences(text, "en"):
        out += [text[at:a], translator.translate([text[a:b]], **options)[0].text]
        at = b
    return "".join(out) + text[at:]


def test_a_paragraph_translates_as_its_sentences_one_by_one_between_its_own_whitespace(translator):
    assert len(split_sentences(PARAGRAPHS[0], "en")) == 4  # the oracle splits, so the test means something
    got = translate_documents(translator, PARAGRAPHS)
    assert got == [_by_sentences(translator, p) for p in PARAGRAPHS]
    assert got[2:] == ["", "   \n"]
    lines = translate_documents(translator, PARAGRAPHS[:2], split=False)  # a line is a sentence
    assert lines[1] == "  " + translator.translate([LINES[4]])[0].text
    assert line_spans(" a b \n\n c\n") == [(1, 4), (8, 9)]


GLOSSARY = "# terms\nman\tWOMAN\nred dog\tBIG CAT\n\nsmall\tA\n"


def test_a_glossarys_terms_are_the_constraints_sentence_level_translate_takes(translator, tmp_path):
    g = Glossary.parse(GLOSSARY)
    assert terms(g, "The Man saw a red dog, a small red doggy and a man.") == ["WOMAN", "BIG CAT", "A"]
    assert terms(g, "manly reddog smaller") == []  # whole words only
    assert terms(Glossary.parse("red\tX\nred dog\tY\n"), "a red dog and red") == ["Y", "X"]  # longest first
    texts = [f"{LINES[0]}. {LINES[1]}", LINES[5]]
    got = translate_documents(translator, texts, glossary=g, beam=4)
    sentences = [s for t in texts for s in prepare(t).sentences]
    want = translator.translate(sentences, beam=4, constraints=[terms(g, s) for s in sentences])
    assert any(terms(g, s) for s in sentences)
    assert got == [f"{want[0].text} {want[1].text}", want[2].text]
    (tmp_path / "g.tsv").write_text(GLOSSARY, encoding="utf-8")
    assert Glossary.read(tmp_path / "g.tsv") == g
    with pytest.raises(ConfigError, match="beam search"):
        translate_documents(translator, texts, glossary=g)  # greedy cannot hold terms


@pytest.mark.parametrize("text, message", [
    ("a\tb\tc\n", "line 1: 2 tabs"), ("ok\tfine\nnone here\n", "line 2: 0 tabs"), ("\tb\n", "line 1: the source term is empty"),
    ("a\tb\n#\nA\tc\n", "line 3: 'A' is already in line 1 with another target term")])
def test_a_bad_glossary_is_refused_naming_the_line(tmp_path, text, message):
    path = tmp_path / "g.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"{path}, {message}"):
        Glossary.read(path)


def test_a_glossary_that_is_not_utf8_names_the_line(tmp_path):
    (tmp_path / "g.tsv").write_bytes(b"a\tb\nc\t\xff\n")
    with pytest.raises(DataError, match="line 2: not UTF-8"):
        Glossary.read(tmp_path / "g.tsv")


def test_pieces_map_to_whitespace_words_and_alignments_to_word_pairs():
    assert word_of(["▁A", "▁do", "g", "▁runs", "."]) == [0, 1, 1, 2, 2]
    assert word_of(["A", "dog", "runs"]) == [0, 1, 2]  # a word vocabulary
    assert word_of(["x", "▁y"]) == [0, 1]
    t = Translation(["▁A", "▁do", "g", "."], [Hypothesis("Ein Hund.", ["▁Ein", "▁Hu", "nd", "."], 0.0, None,
                                                        [(0, 0), (1, 1), (2, 2), (3, 3)])])
    assert word_alignment(t) == [(0, 0), (1, 1)]


def test_a_source_word_is_paired_with_the_target_word_that_attends_to_it_most_over_layers_and_heads():
    """Hand-made attention where each shortcut picks another word: the rows (a piece's argmax: Ein -> dog),
    the sum over a target word's pieces (Hund's two pieces outweigh läuft on 'runs'), the last layer alone or
    the first head alone (both put 'runs' on Hund), and the </s> query (all on 'A')."""
    src, tgt = ["▁A", "▁do", "g", "▁runs"], ["▁Ein", "▁Hu", "nd", "▁läuft"]
    base = np.array([[0.40, 0.45, 0.05, 0.05, 0.05],   # Ein     keys: A do g runs </s>
                     [0.05, 0.30, 0.30, 0.30, 0.05],   # Hu
                     [0.05, 0.30, 0.30, 0.30, 0.05],   # nd
                     [0.10, 0.05, 0.05, 0.35, 0.45],   # läuft
                     [0.90, 0.00, 0.00, 0.00, 0.10]])  # </s>
    cross = np.stack([np.stack([base.copy(), base.copy()]) for _ in range(2)])  # (layers, H, T + 1, S + 1)
    for layer, head, change in [(0, 0, -0.05), (0, 1, -0.25), (1, 0, 0.25), (1, 1, 0.05)]:
        cross[layer, head, 1:3, 3] += change  # Hund -> runs: 0.30 on average, 0.45 in the last layer
    maps = AttentionMaps(src + ["</s>"], ["<s>"] + tgt, tgt + ["</s>"], {"cross": cross})
    rows = [(1, 0), (1, 1), (1, 2), (3, 3)]  # each target piece's argmax source piece
    t = Translation(src, [Hypothesis("Ein Hund läuft", tgt, 0.0, maps, rows)])
    assert np.allclose(word_attention(t), [[0.40, 0.50, 0.05], [0.05, 0.60, 0.30], [0.10, 0.10, 0.35]])
    assert word_alignment(t) == [(0, 0), (1, 1), (2, 2)]
    hard = Translation(src, [Hypothesis("Ein Hund läuft", tgt, 0.0, None, rows)])
    assert word_alignment(hard) == [(1, 0), (1, 1), (2, 2)]  # without maps: the hard alignment's word pairs


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_every_html_fixture_translated_by_a_model_keeps_its_tags_and_pass_through_content(translator, fixture):
    html = fixture.read_text(encoding="utf-8")
    out = translate_documents(translator, [html], format="html")[0]
    before, after = _read(html), _read(out)
    assert _tags(after) == _tags(before)
    assert _passed(after) == _passed(before)
    doc = prepare(html, "html")
    translated = translator.translate(doc.sentences) if doc.sentences else []
    words = " ".join(t.text for t in translated).split()
    text = " ".join(after.itertext()).split()
    assert all(w in text for w in words)  # every translated word is in the output


def test_html_needs_one_models_alignments():
    pair = tformer.load([CHECKPOINT, CHECKPOINT], device="cpu")
    with pytest.raises(ConfigError, match="ensemble"):
        translate_documents(pair, ["<p>man runs</p>"], format="html")


def test_tags_land_on_the_words_their_source_words_were_aligned_to_in_every_sentence_of_a_block(translator,
                                                                                                 monkeypatch):
    stub = WordReversal(translator)
    doc = prepare(PLACED, "html")
    assert [len(spans) for _, spans in doc.parts] == [2, 2]  # two blocks of two sentences: offsets matter
    assert translate_documents(stub, [PLACED], format="html") == [REVERSED]  # from the attention maps
    texts = [PLACED, "", "<p>man <b>runs</b> fast</p>", PLACED]
    want = [REVERSED, "", "<p>FAST <b>RUNS</b> MAN</p>", REVERSED]
    assert translate_documents(stub, texts, format="html") == want
    monkeypatch.setattr(tformer.documents, "HTML_CHUNK", 3)  # texts in groups of about 3 sentences
    assert translate_documents(stub, texts, format="html") == want
    for given in ({"return_attention": True}, {"alignment": True}):  # and from the hard piece alignment
        two = stub.translate(doc.sentences, nbest=2, **given)
        assert doc.assemble(two, 0) == REVERSED
        assert doc.assemble(two, 1) == IN_ORDER


@contextlib.contextmanager
def _serving(stub, **settings):
    """A live in-process server (as test_serve.live) translating with `stub`; its explorer page keeps the real
    translator, which it needs whole."""
    server = Server(stub, "127.0.0.1", 0, Settings(**settings), explorer=Explorer(stub.real))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield server.url.rstrip("/")
    finally:
        server.stop()
        thread.join(30)


def test_libretranslate_html_places_tags_where_the_alignments_put_them(translator):
    with _serving(WordReversal(translator), max_sentences=16) as url:
        status, out, _ = _libre_form(url, PLACED, format="html")
        assert status == 200 and out["translatedText"] == REVERSED
        status, out, _ = _libre_form(url, PLACED, format="html", alternatives=1)
        assert status == 200 and out["translatedText"] == REVERSED and out["alternatives"] == [IN_ORDER]
        status, out, _ = call(url, "/translate", {"q": [PLACED, "<p>man <b>runs</b> fast</p>"], "source": "en",
                                                  "target": "de", "format": "html"})
        assert status == 200 and out["translatedText"] == [REVERSED, "<p>FAST <b>RUNS</b> MAN</p>"]


def test_the_server_takes_constraints_and_a_repetition_penalty_as_the_library_does(translator):
    with live(translator, max_sentences=8) as (_, url):
        body = {"src": LINES[:3], "beam": 4, "nbest": 2, "constraints": [["CAT"], None, ["RED DOG", "MAN"]],
                "repetition_penalty": 1.3}
        status, out, _ = call(url, "/v1/translate", body)
        want = translator.translate(LINES[:3], beam=4, nbest=2, constraints=body["constraints"],
                                    repetition_penalty=1.3)
        assert status == 200
        assert [[h["text"] for h in t["hypotheses"]] for t in out["translations"]] == \
            [[h.text for h in t.hypotheses] for t in want]
        plain = translator.translate(LINES[:3], beam=4, nbest=2)
        assert [t.text for t in plain] != [t.text for t in want]
        for bad, message in [
            ({"constraints": [["CAT"]]}, "constraints: must be a list with one list of target phrases (or null) per "
                                         "sentence of src (3), got a list of 1"),
            ({"constraints": ["CAT", None, None]}, "constraints[0]: must be a list of target phrases or null"),
            ({"constraints": [[5], None, None]}, "constraints[0][0]: must be a string"),
            ({"constraints": [["ß€"], None, None]}, "constraints[0][0] ('ß€') holds 1 piece(s)"),
            ({"constraints": [["CAT"], None, None], "beam": 1}, "constraints are enforced by beam search"),
            ({"repetition_penalty": 0}, "repetition_penalty: must be > 0, from 0.001 to 1000"),  # the config's
            ({"repetition_penalty": "2"}, "repetition_penalty: must be a number")]:
            status, out, _ = call(url, "/v1/translate", {"src": LINES[:3], "beam": 3, **bad})
            assert status == 400 and message in out["error"], (bad, out)


def _libre_form(url, q, **fields):
    """What libretranslatepy's LibreTranslateAPI.translate posts (a urlencoded form: q, source, target), with
    more fields: its 2.1 API has no format argument, so this adds format=html to its own request."""
    form = urllib.parse.urlencode({"q": q, "source": "en", "target": "de", **fields}).encode()
    return call(url, "/translate", raw=form, content_type="application/x-www-form-urlencoded")


def test_libretranslate_translates_paragraphs_html_and_glossary_terms_as_the_library(translator):
    from libretranslatepy import LibreTranslateAPI

    html = (FIXTURES[0].parent / "news_paragraph.html").read_text(encoding="utf-8")
    with live(translator, max_sentences=64, max_chars=1000, max_tokens=256) as (_, url):
        client = LibreTranslateAPI(url + "/")
        assert client.translate(PARAGRAPHS[0], "en", "de") == translate_documents(translator, [PARAGRAPHS[0]])[0]
        status, out, _ = _libre_form(url, html, format="html")
        assert status == 200 and out["translatedText"] == translate_documents(translator, [html], format="html")[0]
        status, out, _ = call(url, "/translate", {"q": [html, "<p>man <b>runs</b></p>"], "source": "en", "target": "de",
                                                  "format": "html"})
        assert status == 200 and out["translatedText"] == translate_documents(
            translator, [html, "<p>man <b>runs</b></p>"], format="html")
        status, out, _ = call(url, "/translate", {"q": PARAGRAPHS[0], "source": "en", "target": "de", "alternatives": 2})
        sentences = prepare(PARAGRAPHS[0]).sentences
        want = translator.translate(sentences, beam=5, nbest=3)
        assert status == 200 and out["alternatives"][1] == prepare(PARAGRAPHS[0]).assemble(want, 2)
        status, out, _ = _libre_form(url, "<p>a <b>b</p></i><p", format="html")
        assert status == 200  # lxml recovers what a browser would
        status, out, _ = _libre_form(url, "a\x00b", format="html")
        assert status == 400 and out["error"].startswith("q: ")
    g = Glossary.parse(GLOSSARY)
    with live(translator, glossary=g) as (_, url):
        status, out, _ = call(url, "/translate", {"q": PARAGRAPHS[0], "source": "en", "target": "de"})
        assert status == 400 and "beam search" in out["error"] and "--glossary" in out["error"]
    beam = tformer.load(CHECKPOINT, device="cpu", strategy="beam", beam_size=4)
    with live(beam, glossary=g) as (_, url):
        status, out, _ = call(url, "/translate", {"q": PARAGRAPHS[0], "source": "en", "target": "de"})
        assert status == 200 and out["translatedText"] == translate_documents(beam, [PARAGRAPHS[0]], glossary=g)[0]
        status, out, _ = call(url, "/v1/translate", {"src": [LINES[0]], "constraints": [["CAT"]]})
        want = beam.translate([LINES[0]], constraints=[["CAT"] + terms(g, LINES[0])])
        assert status == 200 and out["translations"][0]["text"] == want[0].text


def test_the_command_line_translates_paragraphs_html_and_glossaries(translator, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(PARAGRAPHS[:2]) + "\n", encoding="utf-8")
    (tmp_path / "in.html").write_text("<p>man <b>runs</b> small</p>\n", encoding="utf-8")
    (tmp_path / "g.tsv").write_text(GLOSSARY, encoding="utf-8")
    run = lambda *a: subprocess.run([sys.executable, "-m", "tformer", "translate", "--checkpoint", str(CHECKPOINT),
                                     *a], capture_output=True, text=True)
    r = run("--input", str(tmp_path / "in.txt"), "--split", "--glossary", str(tmp_path / "g.tsv"), "--beam", "3")
    lines = "\n".join(PARAGRAPHS[:2]).splitlines()
    assert r.returncode == 0 and r.stdout == "".join(
        t + "\n" for t in translate_documents(translator, lines, glossary=Glossary.parse(GLOSSARY), beam=3))
    r = run("--input", str(tmp_path / "in.html"), "--format", "html")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == translate_documents(translator, ["<p>man <b>runs</b> small</p>\n"], format="html")[0].rstrip("\n")
    (tmp_path / "bad.tsv").write_text("a\tb\tc\n", encoding="utf-8")
    r = run("--input", str(tmp_path / "in.txt"), "--glossary", str(tmp_path / "bad.tsv"), "--beam", "3")
    assert r.returncode != 0 and "bad.tsv, line 1: 2 tabs" in r.stderr
    r = run("--input", str(tmp_path / "in.txt"), "--split", "--nbest", "2", "--beam", "3")
    assert r.returncode != 0 and "--nbest is for sentences one per line" in r.stderr


def test_serve_refuses_a_glossary_it_could_not_hold_and_a_malformed_one(tmp_path):
    (tmp_path / "g.tsv").write_text(GLOSSARY, encoding="utf-8")
    (tmp_path / "bad.tsv").write_text("a b\n", encoding="utf-8")
    serve = lambda *a: subprocess.run([sys.executable, "-m", "tformer", "serve", "--checkpoint", str(CHECKPOINT),
                                       "--port", "0", *a], capture_output=True, text=True, timeout=120)
    r = serve("--glossary", str(tmp_path / "g.tsv"))
    assert r.returncode != 0 and "--glossary: its terms are held by beam search" in r.stderr
    r = serve("--glossary", str(tmp_path / "bad.tsv"), "decode.strategy=beam")
    assert r.returncode != 0 and "bad.tsv, line 1: 0 tabs" in r.stderr
