"""One server, several models (tformer.serve.models): each request goes to the model for its languages, one
model's batch never waits for another's, a pair no model covers goes through the pivot language when asked,
/languages lists every pair, and the interactive API page is served from its package. Oracle: each model's own
Translator, called directly (through the pivot: the two calls in turn)."""

import concurrent.futures
import shutil
import subprocess
import sys
import threading

import pytest
import yaml

import tformer
from helpers.browser import BROWSER_ARGS, CHROMIUM, _browser
from helpers.serve import CHECKPOINT, LINES, call, live
from tformer.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from tformer.serve import Settings
from tformer.serve.models import Models


def _relabelled(folder, src: str, tgt: str):
    """The fixture checkpoint with other language labels (the same weights): a model for another pair."""
    shutil.copytree(CHECKPOINT, folder)
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["data"].update(src_lang=src, tgt_lang=tgt)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def translators(tmp_path_factory, shared_data):
    """en -> de, de -> en (the fixture, relabelled) and a multilingual en -> {fr, cs} trained here."""
    from helpers.multilingual import LANGS, _lines

    root = tmp_path_factory.mktemp("models")
    corpus = root / "corpus"
    corpus.mkdir()
    for split, n in (("train", 200), ("val", 16)):
        for lang in LANGS:
            lines = _lines(shared_data / "multi30k", split, lang)[:n]
            (corpus / f"{split}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    cfg = Config(model=ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=1, decoder_layers=1, norm="pre",
                                   share_embeddings=True),
                 data=DataConfig(task="translation", dir=str(corpus), pairs=("en-fr", "en-cs"), train_prefix="train",
                                 valid_prefix="val", test_prefix="val", vocab_size=400),
                 train=TrainConfig(max_tokens=1500, max_steps=2, eval_every=2, lr=2.0, warmup=4),
                 decode=DecodeConfig(max_len_a=1.0, max_len_b=4, batch_size=16))
    tformer.train(cfg, root / "multi")
    return {"en-de": tformer.load(CHECKPOINT), "de-en": tformer.load(_relabelled(root / "de_en", "de", "en")),
            "multi": tformer.load(root / "multi")}


def test_routes_pairs_and_languages(translators):
    models = Models(translators, Settings())
    assert models.route("en", "de").legs[0].model.name == "en-de"
    assert models.route("de", "en").legs[0].model.name == "de-en"
    assert [(leg.model.name, leg.options) for leg in models.route("en", "cs").legs] == [
        ("multi", {"source": "en", "target": "cs"})]
    assert models.codes() == ("en", "de", "fr", "cs")
    with pytest.raises(Exception, match="target: no model here translates de -> fr .--pivot LANG"):
        models.route("de", "fr")
    with pytest.raises(Exception, match="source: 'es' is not a language here"):
        models.route("es", "de")
    with pytest.raises(Exception, match="give source and target"):
        models.route(None, None)
    twice = Models({"first": translators["en-de"], "second": translators["en-de"]}, Settings())
    assert twice.route("en", "de").legs[0].model.name == "first"  # the first model, in the order given
    pivoting = Models(translators, Settings(pivot="en"))
    route = pivoting.route("de", "fr")
    assert route.pivot == "en" and [leg.model.name for leg in route.legs] == ["de-en", "multi"]
    assert pivoting.reachable("de") == ["en", "fr", "cs"] and models.reachable("de") == ["en"]


def test_each_request_goes_to_its_model(translators):
    with live(translators) as (_, url):
        status, out, _ = call(url, "/languages")
        assert status == 200 and out == [
            {"code": "en", "name": "English", "targets": ["de", "fr", "cs"]},
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "fr", "name": "French", "targets": []}, {"code": "cs", "name": "Czech", "targets": []}]
        fr, cs = (translators["multi"].translate(LINES[:3], beam=2, target=x) for x in ("fr", "cs"))
        assert [t.hypotheses[0].score for t in fr] != [t.hypotheses[0].score for t in cs]  # the tag decides
        for source, target, name, options in (("en", "de", "en-de", {}), ("de", "en", "de-en", {}),
                                              ("en", "fr", "multi", {"target": "fr"}),
                                              ("en", "cs", "multi", {"target": "cs"})):
            want = [(t.text, t.hypotheses[0].score) for t in translators[name].translate(LINES[:3], beam=2, **options)]
            status, out, _ = call(url, "/v1/translate", {"src": LINES[:3], "source": source, "target": target,
                                                         "beam": 2})
            got = [(t["text"], t["score"]) for t in out["translations"]]
            assert status == 200 and [x for x, _ in got] == [x for x, _ in want] and out["models"] == [name]
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)
            status, out, _ = call(url, "/translate", {"q": LINES[:3], "source": source, "target": target})
            plain = [t.text for t in translators[name].translate(LINES[:3], **options)]
            assert status == 200 and out["translatedText"] == plain
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:1]})
        assert status == 400 and "give source and target" in out["error"]
        status, out, _ = call(url, "/translate", {"q": "Ein Hund läuft im Schnee.", "source": "auto", "target": "en"})
        want = translators["de-en"].translate(["Ein Hund läuft im Schnee."])[0].text
        assert status == 200 and out["detectedLanguage"]["language"] == "de" and out["translatedText"] == want
        status, out, _ = call(url, "/translate", {"q": "A dog.", "source": "de", "target": "fr"})
        assert status == 400 and "no model here translates de -> fr" in out["error"]
        status, info, _ = call(url, "/v1/info")
        assert [(m["name"], m["pairs"]) for m in info["models"]] == [
            ("en-de", ["en-de"]), ("de-en", ["de-en"]), ("multi", ["en-fr", "en-cs"])]


def test_a_pair_no_model_covers_goes_through_the_pivot(translators):
    with live(translators, pivot="en") as (_, url):
        via = [t.text for t in translators["de-en"].translate(LINES[:4])]
        want = [t.text for t in translators["multi"].translate(via, target="fr")]
        status, out, _ = call(url, "/translate", {"q": LINES[:4], "source": "de", "target": "fr"})
        assert status == 200 and out["translatedText"] == want and out["pivot"] == "en"
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:4], "source": "de", "target": "fr", "nbest": 2,
                                                     "beam": 2})
        via = [t.text for t in translators["de-en"].translate(LINES[:4], beam=2)]  # each leg searches alike
        last = translators["multi"].translate(via, target="fr", beam=2, nbest=2)  # the n-best of the last leg
        assert status == 200 and out["pivot"] == "en" and out["models"] == ["de-en", "multi"]
        assert [[h["text"] for h in t["hypotheses"]] for t in out["translations"]] == \
            [[h.text for h in t.hypotheses] for t in last]
        status, out, _ = call(url, "/v1/translate", {"src": LINES[:1], "source": "de", "target": "fr",
                                                     "alignment": True})
        assert status == 400 and "goes through en" in out["error"]
        status, out, _ = call(url, "/languages")
        assert {x["code"]: x["targets"] for x in out}["de"] == ["en", "fr", "cs"]


def test_a_glossary_per_target_language(translators, tmp_path):
    from tformer.documents import Glossary

    (tmp_path / "fr.tsv").write_text("dog\tchienchien\n", encoding="utf-8")
    multi = tformer.load(translators["multi"].path, strategy="beam", beam_size=3)
    glossary = Glossary.read(tmp_path / "fr.tsv")
    with live({"multi": multi}, glossaries={"fr": glossary}) as (_, url):
        for target, held in (("fr", True), ("cs", False)):
            want = multi.translate(["A dog runs."], target=target, constraints=[["chienchien"]] if held else None)
            status, out, _ = call(url, "/translate", {"q": "A dog runs.", "source": "en", "target": target})
            assert status == 200 and out["translatedText"] == want[0].text
            assert ("chienchien" in out["translatedText"]) == held
        status, info, _ = call(url, "/v1/info")
        assert info["limits"]["glossary_terms_by_target"] == {"fr": 1}


def test_one_models_batch_never_waits_for_anothers(translators):
    """The en -> de model is held inside its model call; a de -> en request is answered meanwhile."""
    with live(translators) as (server, url):
        held, release = threading.Event(), threading.Event()
        model = server.service.models.models[0]
        run = model.translator.run

        def slow(plans, cancelled=None):
            held.set()
            release.wait(30)
            return run(plans, cancelled)

        model.translator.run = slow
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                blocked = pool.submit(call, url, "/v1/translate", {"src": LINES[:2], "source": "en", "target": "de"})
                assert held.wait(30)
                status, out, _ = call(url, "/v1/translate", {"src": LINES[:2], "source": "de", "target": "en"},
                                      timeout=20)
                assert status == 200 and not blocked.done()
                release.set()
                assert blocked.result(timeout=30)[0] == 200
        finally:
            release.set()
            del model.translator.run


def test_frontend_settings_and_the_api_page(translators):
    with live(translators) as (_, url):
        status, out, _ = call(url, "/frontend/settings")
        assert status == 200 and out["language"]["source"]["code"] == "en" and out["keyRequired"] is False
        import urllib.request

        page = urllib.request.urlopen(url + "/docs").read().decode()
        assert "/openapi.json" in page and "http" not in page.replace("/openapi.json", "")  # nothing from a CDN
        script = urllib.request.urlopen(url + "/docs/swagger-ui-bundle.js")
        assert script.status == 200 and b"SwaggerUIBundle" in script.read()
        status, out, _ = call(url, "/docs/../../setup.py")
        assert status == 404
        sync_playwright = _browser()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            try:
                web = browser.new_page()
                errors = []
                web.on("pageerror", lambda e: errors.append(str(e)))
                web.goto(url + "/docs")
                web.wait_for_selector(".opblock-summary-path[data-path='/v1/translate']", timeout=30_000)
                assert "/frontend/settings" in web.content() and not errors
            finally:
                browser.close()


def test_the_command_loads_every_model_first_and_names_a_bad_one(tmp_path):
    base = [sys.executable, "-m", "tformer", "serve", "--port", "0"]
    r = subprocess.run(base + ["--model", f"a={CHECKPOINT}", "--model", f"b={tmp_path / 'nothing'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--model b=" in r.stderr and "tformer serve: serving" not in r.stdout
    r = subprocess.run(base + ["--checkpoint", str(CHECKPOINT), "--model", f"a={CHECKPOINT}"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "not both" in r.stderr
    r = subprocess.run(base + ["--model", "nameless"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "give NAME=PATH" in r.stderr
