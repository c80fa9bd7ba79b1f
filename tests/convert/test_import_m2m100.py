"""Hugging Face M2M-100 folders read as tformer models (tformer.convert.hf_m2m100), judged against transformers'
own M2M100Tokenizer and M2M100ForConditionalGeneration on tiny random models built here from their configs
(nothing downloaded): token ids, teacher-forced logits, forced-decoding scores, greedy and beam outputs between
several language pairs, as generate(forced_bos_token_id=...) writes them."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from helpers.hf_m2m100_models import make_folder
from tformer.errors import CheckpointError, DataError

SOURCES = {"en": ["A dog runs on the beach.", "Two men are playing chess in a park.", "A girl."],
           "de": ["Ein Hund läuft am Strand.", "Zwei Männer spielen Schach."]}
TARGETS = {"fr": ["Un chien court sur la plage.", "Deux hommes jouent aux échecs dans un parc.", "Une fille."]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, shared_data):
    return make_folder(tmp_path_factory.mktemp("m2m") / "tiny")


def hf_pair(folder):
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer

    return M2M100ForConditionalGeneration.from_pretrained(folder).eval(), M2M100Tokenizer.from_pretrained(folder)


def original(t, ids):
    return [t.source_tokenizer.original[i] for i in ids]


def test_token_ids_equal_the_m2m100_tokenizer(folder):
    t = tformer.load(folder, device="cpu")
    _, tok = hf_pair(folder)
    for lang, texts in SOURCES.items():
        tok.src_lang = lang
        for text in texts:
            tags = t.language_tags("fr", lang)
            assert original(t, [tags.source, *t.encode(text), 2]) == tok(text)["input_ids"]
    assert original(t, [t.language_tags("fr", "en").target]) == [tok.get_lang_id("fr")]
    assert t.languages.tag("fr") == "__fr__" and len(t.languages.sources) == 100


def test_teacher_forced_logits_and_scores_equal_hugging_face(folder):
    from helpers.hf_nllb_mbart_models import check_teacher_forced

    t = tformer.load(folder, device="cpu")
    hf, tok = hf_pair(folder)
    tok.src_lang, tok.tgt_lang = "en", "fr"
    check_teacher_forced(t, hf, tok, SOURCES["en"], TARGETS["fr"], "en", "fr")


@pytest.mark.parametrize("source, target", [("en", "fr"), ("de", "en"), ("en", "de")])
def test_greedy_and_beam_equal_generate(folder, source, target):
    t = tformer.load(folder, device="cpu")
    hf, tok = hf_pair(folder)
    tok.src_lang = source
    N = 20
    texts = SOURCES[source]
    lengths = set()
    for beams, alpha in ((1, 1.0), (4, 1.0), (4, 0.6)):
        got = t.translate(texts, source=source, target=target, beam=beams, len_penalty=alpha, len_penalty_rule="power",
                          max_len_a=0.0, max_len_b=N)
        with torch.no_grad():
            gen = hf.generate(**tok(texts, return_tensors="pt", padding=True), num_beams=beams, do_sample=False,
                              length_penalty=alpha, max_new_tokens=N, max_length=None,
                              forced_bos_token_id=tok.get_lang_id(target), early_stopping=False,
                              output_scores=True, return_dict_in_generate=True)  # tformer stops as generate's
            # default does (the folder's early_stopping=True stops at K finished: a rule tformer does not run)
        for ours, row, text, want in zip(got, gen.sequences.tolist(), texts, gen.sequences_scores.tolist()
                                         if beams > 1 else [None] * len(texts)):
            row = row[1:]  # the decoder's start
            row = [x for x in (row[: row.index(2)] if 2 in row else row) if x != 1]
            assert original(t, [t.source_tokenizer.vocab.stoi[p] for p in ours.hypotheses[0].tokens]) == row, \
                (beams, alpha, text)
            assert row[0] == tok.get_lang_id(target)  # forced first: the target's token, left out of the text
            words = [x for x in row[1:] if x not in tok.id_to_lang_token]  # M2M100Tokenizer's special tokens
            assert ours.text == tok.decode(words, skip_special_tokens=True)
            lengths.add(len(row))
            if want is not None:  # the forced token scores 0 in both (decode.prefix_score zero)
                assert abs(ours.hypotheses[0].score - want) <= 1e-5 * max(1.0, abs(want))
    assert len(lengths) >= 2  # outputs that end at different lengths


def test_languages_are_named_and_checked(folder):
    t = tformer.load(folder, device="cpu")
    with pytest.raises(DataError, match="name the source language"):
        t.translate(["A dog."], target="fr")
    with pytest.raises(DataError, match="target language 'xx'"):
        t.translate(["A dog."], source="en", target="xx")
    fr = t.translate(["A dog."], source="en", target="fr")[0]
    assert fr.hypotheses[0].tokens[0] == "__fr__" and "__fr__" not in fr.text


def test_import_writes_a_run_folder_that_translates_identically(folder, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "tformer", "import", "hf-m2m100", str(folder), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    direct, imported = tformer.load(folder), tformer.load(out)
    for source, target in (("en", "fr"), ("de", "en")):
        want = direct.translate(SOURCES[source], source=source, target=target, beam=3)
        got = imported.translate(SOURCES[source], source=source, target=target, beam=3)
        assert [(x.text, x.hypotheses[0].tokens) for x in got] == [(x.text, x.hypotheses[0].tokens) for x in want]
    r = subprocess.run([sys.executable, "-m", "tformer", "translate", "--checkpoint", str(out), "--source", "en",
                        "--target", "fr"], input="A dog runs on the beach.\n", capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == direct.translate(SOURCES["en"][:1], source="en",
                                                                       target="fr")[0].text


def test_import_then_export_gives_the_folder_back_tensor_for_tensor(folder, tmp_path):
    from tformer.export import export

    out = export("hf-m2m100", folder, tmp_path / "back")
    hf, tok = hf_pair(folder)
    back, back_tok = hf_pair(out)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(theirs) == set(ours)
    for name, tensor in theirs.items():
        assert torch.equal(tensor, ours[name]), name
    assert back_tok.get_vocab() == tok.get_vocab()
    for lang in ("en", "de"):
        tok.src_lang = back_tok.src_lang = lang
        assert back_tok(SOURCES[lang])["input_ids"] == tok(SOURCES[lang])["input_ids"]
    with pytest.raises(Exception, match="not imported from an M2M-100, NLLB-200 or mBART-50 folder"):
        from helpers.serve import CHECKPOINT

        export("hf-m2m100", CHECKPOINT, tmp_path / "other")


def test_a_server_routes_any_pair_of_its_languages(folder):
    from helpers.serve import call, live

    t = tformer.load(folder, device="cpu")
    with live({"m2m": t}) as (_, url):
        for source, target in (("en", "fr"), ("de", "en")):
            want = [x.text for x in t.translate(SOURCES[source], source=source, target=target)]
            status, out, _ = call(url, "/translate", {"q": SOURCES[source], "source": source, "target": target})
            assert status == 200 and out["translatedText"] == want
        status, out, _ = call(url, "/languages")
        assert len(out) == 100 and {x["code"]: len(x["targets"]) for x in out}["fr"] == 99


def test_the_explorer_page_asks_for_the_folders_own_languages(folder):
    from tformer.explore import Explorer, Limits
    from tformer.serve import Settings

    t = tformer.load(folder, device="cpu")
    explorer = Explorer(t, Limits.of(Settings()))
    assert explorer.info()["languages"] == ["en", "fr"]  # tokenizer_config.json's src_lang and tgt_lang
    plan = explorer.check({"text": "A dog runs."}).plan
    tags = t.language_tags("fr", "en")
    assert plan.sources[0][0] == tags.source and plan.prefixes[0] == (tags.target,)


def test_a_folder_that_does_not_fit_is_refused_by_name(folder, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    info = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({**info, "language_codes": "wmt21"}))
    with pytest.raises(CheckpointError, match="language_codes"):
        tformer.load(bad)
    (bad / "tokenizer_config.json").write_text(json.dumps({**info, "language_codes": "klingon"}))
    with pytest.raises(CheckpointError, match="tformer knows m2m100, wmt21"):
        tformer.load(bad)
