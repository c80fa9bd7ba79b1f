"""Many languages in one model (tformer.languages): directions prepared with their target's token, sampled with a
temperature, scored per direction; a multilingual Translator asked for a language. Oracles: the raw files read
and tokenised here, sacreBLEU on each direction's lines, decoding each language alone."""

import gzip
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

from helpers.multilingual import LANGS, _lines
from tformer.checkpoint import validation_key
from tformer.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, load_config
from tformer.data import load_task
from tformer.data.corpus import normalize
from tformer.errors import ConfigError, DataError
from tformer.languages import Directions, language_tags, sampled

N_TRAIN, N_EVAL = 300, 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data):
    """The first lines of Multi30k in its four languages (multi-way: line i is one caption in each)."""
    out = tmp_path_factory.mktemp("m30k4")
    for split, n in (("train", N_TRAIN), ("val", N_EVAL), ("test2016", N_EVAL)):
        for lang in LANGS:
            lines = _lines(shared_data / "multi30k", split, lang)[:n]
            with gzip.open(out / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
    return out


def _data(folder, pairs, **kw) -> DataConfig:
    base = dict(task="translation", dir=str(folder), pairs=tuple(pairs), train_prefix="train", valid_prefix="val",
                test_prefix="test2016", vocab_size=600)
    return DataConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("override, message", [
    ("data.pairs=[en_de]", "not a direction 'SRC-TGT'"),
    ("data.pairs=[en-EN1]", "not a direction 'SRC-TGT'"),
    ("data.pairs=[en-en]", "translates a language into itself"),
    ("data.pairs=[en-de, en-de]", "listed twice"),
    ("data.joint_vocab=false", "data.joint_vocab=true"),
    ("data.temperature=0", "data.temperature"),
    ("train.best_direction=de-en", "not one of data.pairs"),
])
def test_bad_settings_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tformer/recipes/multi30k_multi.yaml", [override])


def test_a_one_pair_model_accepts_its_own_languages_only():
    from tformer.data.vocab import Vocab

    data, vocab = DataConfig(task="translation", dir="x", src_lang="en", tgt_lang="de"), Vocab(["<2de>"])
    assert language_tags(data, vocab, "de", "en") is None
    with pytest.raises(DataError, match="translates en -> de only"):
        language_tags(data, vocab, "fr", None)
    with pytest.raises(DataError, match="source language 'cs'"):
        language_tags(data, vocab, None, "cs")


# ------------------------------------------------------------------------------------------ data


def test_each_direction_is_prepared_with_its_target_token(corpus):
    pairs = ("en-de", "en-fr", "de-en")
    data = load_task(_data(corpus, pairs), ("train", "valid"), joint=True)
    tok = data.tokenizers[0]
    assert data.tokenizers[1] is tok or data.tokenizers[1].vocab == tok.vocab  # one vocabulary for all
    for split, prefix, n in (("train", "train", N_TRAIN), ("valid", "val", N_EVAL)):
        directions = data.directions[split]
        assert directions.sizes() == {p: n for p in pairs}
        for name in pairs:
            src_lang, tgt_lang = name.split("-")
            src, tgt = _lines(corpus, prefix, src_lang), _lines(corpus, prefix, tgt_lang)
            tag = tok.vocab.encode([f"<2{tgt_lang}>"])[0]
            assert tag != tok.vocab.unk
            for k, i in enumerate(directions.members(name)[:: n // 6]):  # every direction's lines, spread
                line = k * (n // 6)
                ids_src, ids_tgt = data.examples[split][int(i)]
                assert ids_src == [tag, *tok.encode(normalize(src[line]))]
                assert ids_tgt == tok.encode(normalize(tgt[line]))
    assert len(tok.encode("<2fr>")) <= 2 and tok.vocab.encode(["<2fr>"])[0] in tok.encode("<2fr>")  # one piece


def test_filtered_pairs_keep_their_direction(corpus):
    limit = 12
    data = load_task(_data(corpus, ("en-fr", "en-cs"), filter_max_len=limit), ("train",), joint=True)
    tok = data.tokenizers[0]
    want = {}
    for name in ("en-fr", "en-cs"):
        tgt_lang = name.split("-")[1]
        pairs = zip(_lines(corpus, "train", "en"), _lines(corpus, "train", tgt_lang))
        kept = [(s, t) for s, t in pairs
                if len(tok.encode(normalize(s))) + 1 <= limit and len(tok.encode(normalize(t))) <= limit]
        want[name] = kept
    directions = data.directions["train"]
    assert directions.sizes() == {k: len(v) for k, v in want.items()} and 0 < len(want["en-cs"]) < N_TRAIN
    for name, kept in want.items():
        got = [data.examples["train"][int(i)][1] for i in directions.members(name)]
        assert got == [tok.encode(normalize(t)) for _, t in kept]


def test_pair_folders_hold_directions_of_their_own(corpus, tmp_path):
    """{dir}/en-de/ holds a direction's own files (not multi-way); the others come from {dir} itself."""
    for name in ("train.en", "train.de", "val.en", "val.de"):
        (tmp_path / "en-de").mkdir(exist_ok=True)
        src = _lines(corpus, name.split(".")[0], name.split(".")[1])[:40]
        (tmp_path / "en-de" / name).write_text("".join(x + "\n" for x in src), encoding="utf-8")
    for split in ("train", "val"):
        for lang in ("en", "fr"):
            (tmp_path / f"{split}.{lang}.gz").write_bytes((corpus / f"{split}.{lang}.gz").read_bytes())
    data = load_task(_data(tmp_path, ("en-de", "en-fr")), ("train", "valid"), joint=True)
    assert data.directions["train"].sizes() == {"en-de": 40, "en-fr": N_TRAIN}
    assert data.directions["valid"].sizes() == {"en-de": 24, "en-fr": N_EVAL}


def test_sentencepiece_learns_each_language_as_the_temperature_says(corpus, tmp_path):
    """de: 100 lines, fr: 300 (pair folders), en: both sides' 400. The budget is 2 x tokenizer_sample sentences."""
    for name, n in (("en-de", 100), ("en-fr", 300)):
        folder = tmp_path / name
        folder.mkdir()
        for lang in name.split("-"):
            for split in ("train", "val"):
                lines = _lines(corpus, split, lang)[:n]
                (folder / f"{split}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    from tformer.data.prepare import prepare

    shares = {}
    for temperature in (1.0, 1000.0):
        cfg = _data(tmp_path, ("en-de", "en-fr"), tokenizer_sample=200, temperature=temperature)
        out = prepare(cfg, tmp_path / f"prepared{temperature}", ("train",))
        shares[temperature] = out.manifest["tokenizer"]["sample"]["sentences"]
    assert shares[1.0] == {"en": 200, "de": 50, "fr": 150}  # 400 sentences as the languages' sizes: 400/100/300
    assert shares[1000.0] == {"en": 133, "de": 100, "fr": 133}  # alike (133.4 each), de capped at its 100


def test_temperature_repeats_small_directions_and_drops_nothing():
    of = np.array([0] * 100 + [1] * 10)
    directions = Directions(("big", "small"), of)
    assert sampled(directions, 1.0, seed=3) is None  # as the sizes: every example once
    # T = 5: p ~ (100/110)^0.2 : (10/110)^0.2 = 0.6132 : 0.3868; the big direction keeps its 100, so the
    # small one gets 100 x 0.3868 / 0.6132 = 63.08 -> 63 draws: 6 whole copies and 3 more, distinct
    pool = sampled(directions, 5.0, seed=3)
    counts = np.bincount(pool, minlength=110)
    assert (counts[:100] == 1).all() and counts[100:].sum() == 63
    assert sorted(counts[100:].tolist()) == [6] * 7 + [7] * 3
    assert (sampled(directions, 5.0, seed=3) == pool).all()  # seeded
    flat = np.bincount(sampled(directions, 1e9, seed=3), minlength=110)
    assert (flat[100:] == 10).all()  # as good as uniform: the small direction ten times


def test_an_epoch_covers_the_sampled_examples(corpus):
    from tformer.training.batches import Batches
    from tformer.training.distributed import Context

    data_cfg = _data(corpus, ("en-de", "en-fr"), filter_max_len=14, temperature=4.0)
    data = load_task(data_cfg, ("train",), joint=True)
    cfg = Config(model=ModelConfig(d_model=16, n_heads=2, d_ff=16, encoder_layers=1, decoder_layers=1),
                 data=data_cfg, train=TrainConfig(max_tokens=300))
    directions = data.directions["train"]
    batches = Batches(data.examples["train"], cfg, Context(), directions=directions)
    pool = sampled(directions, 4.0, cfg.train.seed)
    assert pool is not None and len(pool) > len(directions.of)  # the filter made the sizes differ
    seen = [i for update in batches.updates(0, 0) for b in update for i in b.indices]
    assert sorted(seen) == sorted(pool.tolist())
    for update in batches.updates(1, 0):  # each batch's examples are the ones its indices name
        b = update[0]
        assert b.src[0, 0].item() == data.examples["train"][b.indices[0]][0][0]
        break


# ------------------------------------------------------------------------------------------ scoring


def test_direction_scores_are_sacrebleu_per_direction_and_their_mean():
    from tformer.evaluation import direction_scores

    refs = ["ein Hund läuft .", "zwei Katzen", "un chien court .", "deux chats", "un oiseau"]
    hyps = ["ein Hund rennt .", "zwei Katzen", "un chien court .", "trois chats", "un oiseau vole"]
    directions = Directions(("en-de", "en-fr"), np.array([0, 0, 1, 1, 1]))
    got = direction_scores(hyps, refs, directions)
    de = sacrebleu.corpus_bleu(hyps[:2], [refs[:2]]).score
    fr = sacrebleu.corpus_bleu(hyps[2:], [refs[2:]]).score
    assert got["bleu_en-de"] == pytest.approx(de) and got["bleu_en-fr"] == pytest.approx(fr)
    assert got["bleu"] == pytest.approx((de + fr) / 2)
    assert got["chrf_en-fr"] == pytest.approx(sacrebleu.corpus_chrf(hyps[2:], [refs[2:]]).score)


def test_a_named_direction_chooses_the_best_checkpoint():
    mean_better = {"bleu": 30.0, "bleu_en-fr": 20.0, "loss": 1.0}
    fr_better = {"bleu": 25.0, "bleu_en-fr": 24.0, "loss": 1.0}
    assert validation_key(mean_better) > validation_key(fr_better)
    chosen = [{**m, "selection": m["bleu_en-fr"]} for m in (mean_better, fr_better)]
    assert validation_key(chosen[1]) > validation_key(chosen[0])


# ------------------------------------------------------------------------------------------ a trained model


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    import tformer

    cfg = Config(
        model=ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=1, decoder_layers=1, norm="pre",
                          share_embeddings=True),
        data=_data(corpus, ("en-de", "en-fr")),
        train=TrainConfig(max_tokens=1500, max_steps=4, eval_every=2, log_every=2, lr=2.0, warmup=4,
                          best_direction="en-fr"),
        decode=DecodeConfig(max_len_a=1.0, max_len_b=4, batch_size=16),
    )
    folder = tmp_path_factory.mktemp("multi") / "run"
    tformer.train(cfg, folder)
    return folder


def test_training_logs_each_direction_and_chooses_by_the_named_one(run):
    valid = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [v for v in valid if v["kind"] == "valid"]
    assert [v["step"] for v in valid] == [0, 2, 4] or [v["step"] for v in valid] == [2, 4]
    for v in valid:
        assert v["bleu"] == pytest.approx((v["bleu_en-de"] + v["bleu_en-fr"]) / 2, abs=1e-5)
        assert v["selection"] == v["bleu_en-fr"]


def test_the_target_language_is_asked_for_and_checked(run):
    import tformer

    t = tformer.load(run)
    assert t.languages.targets == ("de", "fr") and t.languages.sources == ("en",)
    with pytest.raises(DataError, match="this model writes de, fr: name the target language"):
        t.translate(["A dog."])
    with pytest.raises(DataError, match="target language 'cs': this model writes de, fr"):
        t.translate(["A dog."], target="cs")
    with pytest.raises(DataError, match="source language 'de': this model reads en"):
        t.translate(["A dog."], target="fr", source="de")
    tag_fr = t.source_tokenizer.vocab.encode(["<2fr>"])[0]
    plan = t.prepare(["A dog runs.", ""], target="fr")
    assert plan.sources[0] == (tag_fr, *t.encode("A dog runs.")) and plan.sources[1] is None


def test_languages_decode_together_as_each_alone(run):
    """Plans for two targets joined in one batch give what each gives alone, and what the search gives on the
    tagged ids directly."""
    import tformer
    from tformer.inference import translate_ids

    t = tformer.load(run)
    texts = ["A man rides a bike.", "Two dogs play in the snow.", "A girl in a red dress."]
    together = t.run([t.prepare(texts, target="de", beam=3), t.prepare(texts[:2], target="fr", beam=3)])
    alone = [t.translate(texts, target="de", beam=3), t.translate(texts[:2], target="fr", beam=3)]
    assert [[x.text for x in r] for r in together] == [[x.text for x in r] for r in alone]
    tag = t.source_tokenizer.vocab.encode(["<2de>"])[0]
    ids = translate_ids(t.model, [[tag, *t.encode(x)] for x in texts], t.decode_settings(beam=3)).tokens
    assert [t.decode(n[0]) for n in ids] == [x.text for x in alone[0]]
    out = io.StringIO()
    t.translate_file(io.BytesIO("".join(x + "\n" for x in texts).encode()), out, target="de", beam=3)
    assert out.getvalue().splitlines() == [x.text for x in alone[0]]
    assert [x.text for x in t.translate_iterable(texts, target="de", beam=3)] == [x.text for x in alone[0]]


def test_scores_and_the_explorer_read_the_target_language(run):
    import tformer
    from tformer.explore import Explorer, Limits
    from tformer.inference import score_ids
    from tformer.serve import Settings

    t = tformer.load(run)
    tag = t.source_tokenizer.vocab.encode(["<2fr>"])[0]
    got = t.score(["A dog runs."], ["Un chien court."], target="fr")[0]
    want = score_ids(t.model, [[tag, *t.encode("A dog runs.")]], [t.encode("Un chien court.", "target")])[0]
    assert got.token_log_probs == pytest.approx(want, abs=1e-5)
    assert got.log_prob != pytest.approx(t.score(["A dog runs."], ["Un chien court."], target="de")[0].log_prob)
    explorer = Explorer(t, Limits.of(Settings()))
    assert explorer.info()["languages"] == ["en", "de"]  # its page writes the first target
    assert explorer.check({"text": "A dog runs."}).plan.sources[0][0] == t.source_tokenizer.vocab.encode(["<2de>"])[0]


def test_documents_and_constraints_take_the_target(run):
    import tformer
    from tformer.documents import translate_documents

    t = tformer.load(run)
    text = "A man rides a bike. Two dogs play in the snow."
    sentences = ["A man rides a bike.", "Two dogs play in the snow."]
    for target in ("de", "fr"):
        alone = [x.text for x in t.translate(sentences, target=target)]
        assert translate_documents(t, [text], target=target) == [" ".join(alone)]
    constrained = t.translate(sentences[:1], target="fr", beam=3, constraints=[["Hund"]])[0].text
    assert "Hund" in constrained


def test_ctranslate2_translates_an_export_as_tformer_does_per_target(run, tmp_path):
    import tformer
    from tformer.export import export_ctranslate2, translate_ctranslate2

    t = tformer.load(run)
    out = tmp_path / "ct2"
    export_ctranslate2(run, out)
    texts = ["A man rides a bike.", "Two dogs play in the snow."]
    outputs = {}
    for target in ("de", "fr"):
        ours = [x.text for x in t.translate(texts, target=target, beam=3, len_penalty=0.0, max_len_a=0, max_len_b=30)]
        outputs[target] = translate_ctranslate2(out, t, texts, beam=3, len_penalty=0.0, max_len=30, target=target)
        assert outputs[target] == ours
    with pytest.raises(DataError, match="name the target language"):
        translate_ctranslate2(out, t, texts)


def test_evaluate_scores_each_direction_and_zero_shot_ones(run, corpus):
    import tformer

    t = tformer.load(run)
    result = t.evaluate("valid")
    assert set(result.directions) == {"en-de", "en-fr"} and result.metrics["n"] == 2 * N_EVAL
    de_refs = _lines(corpus, "val", "de")
    assert result.references[:N_EVAL] == [normalize(x) for x in de_refs]
    want = sacrebleu.corpus_bleu(result.outputs[:N_EVAL], [result.references[:N_EVAL]]).score
    assert result.metrics["bleu_en-de"] == pytest.approx(want)
    zero = t.evaluate("valid", pairs=["de-fr"])
    assert list(zero.directions) == ["de-fr"] and zero.sources[0] == normalize(_lines(corpus, "val", "de")[0])
    with pytest.raises(DataError, match="<2cs>"):
        t.evaluate("valid", pairs=["en-cs"])  # a language the model never wrote

    cli = [sys.executable, "-m", "tformer", "evaluate", "--checkpoint", str(run), "--split", "valid", "--json"]
    report = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)
    assert set(report["directions"]) == {"en-de", "en-fr"}
    assert report["directions"]["en-fr"]["bleu"] == pytest.approx(result.metrics["bleu_en-fr"])
    r = subprocess.run([sys.executable, "-m", "tformer", "translate", "--checkpoint", str(run), "--target", "es"],
                       input="A dog.\n", capture_output=True, text=True)
    assert r.returncode == 2 and "this model writes de, fr" in r.stderr
