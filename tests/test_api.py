"""The public Python API (tformer.load, Translator, tformer.training) against oracles: the outputs the command
line wrote before the API existed (a checkpoint committed in that format), the command line now, the
searches' own scores, decoding done by hand with the uncached forward pass, and attention_maps."""

from __future__ import annotations

import gzip
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tformer
from helpers.oracles import REL, assert_same_scores
from tformer.config import DecodeConfig
from tformer.data import Vocab
from tformer.errors import CheckpointError, ConfigError, DataError, TformerError
from tformer.inference import translate_ids
from tformer.inspection import KINDS, attention_maps

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1"  # written before the API, with its outputs (see README.md)
LINES = (V1 / "input.en").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def translator():
    return tformer.load(V1 / "checkpoint", device="cpu")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


# ------------------------------------------------------------------------------------------ the v1 checkpoint


# the beam outputs were written under fairseq's rule for endings, which decode.beam_finish=top_k keeps
@pytest.mark.parametrize("file, options, cli_options", [
    ("greedy.de", {}, []),
    ("beam5.de", {"beam": 5, "beam_finish": "top_k"}, ["--beam", "5", "decode.beam_finish=top_k"]),
    ("beam4_nbest2.de", {"beam": 4, "nbest": 2, "beam_finish": "top_k"},
     ["--beam", "4", "--nbest", "2", "decode.beam_finish=top_k"]),
    ("sample_seed3_nbest2.de", {"strategy": "sample", "seed": 3, "nbest": 2},
     ["decode.strategy=sample", "decode.seed=3", "--nbest", "2"]),
])
def test_a_checkpoint_written_before_the_api_translates_as_it_did(translator, file, options, cli_options, tmp_path):
    """The library, its file form and today's command line all reproduce the bytes translate wrote then."""
    want = (V1 / file).read_text(encoding="utf-8")
    nbest = options.get("nbest", 1) > 1
    got = translator.translate(LINES, **options)
    _same_output("".join(tformer.api.format_translation(t, i, nbest) for i, t in enumerate(got)), want)
    translator.translate_file(V1 / "input.en", tmp_path / "out.de", **options)
    _same_output((tmp_path / "out.de").read_text(encoding="utf-8"), want)
    r = cli("translate", "--checkpoint", V1 / "checkpoint", "--input", V1 / "input.en", *cli_options)
    assert r.returncode == 0, r.stderr
    _same_output(r.stdout, want)
    r = cli("translate", "--checkpoint", V1 / "checkpoint", *cli_options, stdin="\n".join(LINES) + "\n")
    assert r.returncode == 0, r.stderr
    _same_output(r.stdout, want)


def _same_output(got: str, want: str) -> None:
    """The same lines, and in n-best lines ('i ||| text ||| score') the same index and text with the score
    printed to 4 decimals by a machine whose float32 rounding may differ (conftest.REL): one unit of the last
    digit apart at most."""
    assert got.endswith("\n") == want.endswith("\n") and len(got.splitlines()) == len(want.splitlines())
    for g, w in zip(got.splitlines(), want.splitlines()):
        if " ||| " not in w:
            assert g == w
            continue
        *g_fields, g_score = g.split(" ||| ")
        *w_fields, w_score = w.split(" ||| ")
        assert g_fields == w_fields and float(g_score) == pytest.approx(float(w_score), abs=1e-4 + REL * 10)


def test_translations_carry_text_pieces_and_scores(translator):
    out = translator.translate(["the big red dog eats", ""], beam=4, nbest=2)
    best = out[0]
    assert best.text == best.hypotheses[0].text and best.score == best.hypotheses[0].score
    assert len(best.hypotheses) == 2 and best.hypotheses[0].score >= best.hypotheses[1].score
    assert translator.decode(translator.encode(best.text, "target")) == best.text
    assert best.tokens == translator.pieces(translator.encode(best.text, "target"))
    assert best.source_tokens == translator.pieces(translator.encode("the big red dog eats"), "source")
    assert best.attention is None
    assert out[1].text == "" and out[1].tokens == [] and out[1].score == 0.0  # empty in, empty out: no decoding


def test_decoding_settings_change_only_the_call(translator):
    assert translator.config.decode.strategy == "greedy"
    short = translator.translate(["the big red dog eats"], max_len_a=0.0, max_len_b=2)[0]
    assert len(short.tokens) <= 2
    assert translator.config.decode.max_len_b == 10  # the defaults are untouched
    loaded = tformer.load(V1 / "checkpoint", device="cpu", beam_size=4, strategy="beam", nbest=2)
    assert [t.text for t in loaded.translate(LINES[:5])] == [t.text for t in translator.translate(LINES[:5], beam=4)]


def test_int8_is_chosen_when_loading_not_per_call(translator):
    """quantize changes the weights: a call that asks for another than the loaded model's is refused by name
    (it was once ignored in silence); repeating the loaded choice is fine."""
    with pytest.raises(tformer.ConfigError, match="decode.quantize.*tformer.load"):
        translator.translate(LINES[:1], quantize="int8")
    assert translator.translate(LINES[:1], quantize="none")[0].text == translator.translate(LINES[:1])[0].text


# ------------------------------------------------------------------------------------------ score, prefix


def _finished(translator, sources, out):
    """The outputs that ended with </s> (not cut at the length limit, whose search score has no </s> term) and
    whose text tokenises back to the pieces the search chose."""
    d = translator.config.decode
    return [(src, t) for src, t in zip(sources, out) if src.strip()
            and len(t.tokens) < int(len(translator.encode(src)) * d.max_len_a + d.max_len_b)
            and translator.pieces(translator.encode(t.text, "target")) == t.tokens]


def test_score_of_a_greedy_output_is_the_search_score(translator):
    pairs = _finished(translator, LINES, translator.translate(LINES))
    assert len(pairs) >= 10
    scores = translator.score([s for s, _ in pairs], [t.text for _, t in pairs])
    for (_, t), s in zip(pairs, scores):
        assert s.tokens == t.tokens + ["</s>"] and len(s.token_log_probs) == len(s.tokens)
        assert s.log_prob == pytest.approx(t.score, abs=1e-5)
        assert s.log_prob == pytest.approx(sum(s.token_log_probs), abs=1e-6)


def test_score_equals_the_cached_decoder_token_by_token(translator):
    """Oracle: feed the target through model.decode_step one token at a time (the cache path, not the
    teacher-forced pass score() uses) and sum the log-probabilities, </s> included."""
    model = translator.model
    src, tgt = translator.encode(LINES[3]), translator.encode("DOG CAT RUNS", "target")
    with torch.inference_mode():
        enc = model.encode(torch.tensor([src + [Vocab.eos]]), torch.tensor([len(src) + 1]))
        cache, prev, want = model.init_cache(enc), Vocab.bos, []
        for tok in tgt + [Vocab.eos]:
            logits, cache = model.decode_step(torch.tensor([prev]), cache)
            want.append(float(torch.log_softmax(logits, -1)[0, tok]))
            prev = tok
    got = translator.score([LINES[3]], ["DOG CAT RUNS"])[0]
    np.testing.assert_allclose(got.token_log_probs, want, atol=1e-5)


def _forced_then_free(model, src: list[int], prefix: list[int], limit: int) -> list[int]:
    """By hand: the prefix, then the argmax of the full uncached forward pass until </s> or the limit."""
    out = list(prefix)
    with torch.inference_mode():
        s = torch.tensor([src + [Vocab.eos]])
        while len(out) < limit:
            tgt_in = torch.tensor([[Vocab.bos] + out])
            hidden = model(s, torch.tensor([s.shape[1]]), tgt_in, torch.tensor([tgt_in.shape[1]])).hidden
            logits = model.generator(hidden[0, -1])
            logits[[Vocab.pad, Vocab.bos]] = float("-inf")
            tok = int(logits.argmax())
            if tok == Vocab.eos:
                break
            out.append(tok)
    return out


def test_prefix_forces_the_start_and_the_model_continues(translator):
    sources = LINES[:6]
    prefixes = ["DOG", None, "A BIG", "", "SMALL WOMAN", "CAT CAT CAT"]
    out = translator.translate(sources, prefix=prefixes)
    limit = translator.config.decode
    for src, prefix, t in zip(sources, prefixes, out):
        ids = translator.encode(src)
        forced = translator.encode(prefix or "", "target")
        want = _forced_then_free(translator.model, ids, forced, int(len(ids) * limit.max_len_a + limit.max_len_b))
        assert translator.encode(t.text, "target") == want
        assert t.text.startswith(prefix or "")
    alone = [translator.translate([s], prefix=[p])[0].text for s, p in zip(sources, prefixes)]
    assert alone == [t.text for t in out]  # a sentence's output does not depend on its batch
    finished = _finished(translator, sources, out)
    scored = translator.score([s for s, _ in finished], [t.text for _, t in finished])
    assert [s.log_prob for s in scored] == pytest.approx([t.score for _, t in finished], abs=1e-5)  # prefix included
    beams = translator.translate(sources, prefix=prefixes, beam=4, nbest=3)
    for prefix, t in zip(prefixes, beams):
        assert all(h.text.startswith(prefix or "") for h in t.hypotheses)


# ------------------------------------------------------------------------------------------ streaming, batching


def test_streaming_keeps_order_and_reads_lazily(translator):
    want = [t.text for t in translator.translate(LINES)]
    got = [t.text for t in translator.translate_iterable(iter(LINES), chunk_size=4)]
    assert got == want
    endless = itertools.cycle(LINES)  # an input that never ends: only a stream can answer it
    first = [t.text for t in itertools.islice(translator.translate_iterable(endless, chunk_size=5), 30)]
    assert first == (want + want)[:30]


@pytest.mark.parametrize("batch", [dict(batch_size=1), dict(batch_size=7), dict(batch_size=40, batch_type="tokens"),
                                   dict(batch_size=1, batch_type="tokens")])
def test_batching_never_changes_the_output(translator, batch):
    for options in ({}, {"beam": 4, "nbest": 2}):
        want = [[h.text for h in t.hypotheses] for t in translator.translate(LINES, **options)]
        assert [[h.text for h in t.hypotheses] for t in translator.translate(LINES, **options, **batch)] == want


@pytest.mark.parametrize("options", [{}, {"beam": 4, "nbest": 2}, {"strategy": "sample", "seed": 1, "nbest": 2}])
def test_cancelled_sentences_leave_the_batch_and_the_others_decode_as_they_would_have(translator, options):
    """Sentences 2, 5 and 6 are given up on from the 3rd decoding step (the empty 21st never is decoded): they
    come back None, the search stops computing their rows, and every other output is what it was without
    them (texts exactly, scores within the batching promise)."""
    model, step, rows = translator.model, translator.model.decode_step, []

    def spy(prev, cache):
        rows.append(prev.shape[0])
        return step(prev, cache)

    gone = {2, 5, 6, 21}
    model.decode_step = spy
    try:
        want = translator.translate(LINES, batch_size=8, **options)
        full, rows[:] = list(rows), []
        got = translator.translate(LINES, batch_size=8, cancelled=lambda i: i in gone and len(rows) >= 2, **options)
    finally:
        del model.decode_step
    assert [i for i, t in enumerate(got) if t is None] == [2, 5, 6]
    assert got[21].text == "" and sum(rows) < sum(full) and len(rows) <= len(full)
    for t, w in ((t, w) for t, w in zip(got, want) if t is not None):
        assert [h.text for h in t.hypotheses] == [h.text for h in w.hypotheses]
        assert [h.score for h in t.hypotheses] == pytest.approx([h.score for h in w.hypotheses], rel=REL, abs=REL)
    assert translator.translate(LINES[:3], cancelled=lambda i: True, **options) == [None] * 3


def test_cancelled_pairs_are_not_scored(translator):
    targets = [t.text for t in translator.translate(LINES)]
    want = translator.score(LINES[:8], targets[:8], alignment=True)
    got = translator.score(LINES[:8], targets[:8], alignment=True, batch_size=3, cancelled=lambda i: i % 3 == 1)
    assert [i for i, s in enumerate(got) if s is None] == [1, 4, 7]
    assert_same_scores([s for s in got if s is not None], [s for i, s in enumerate(want) if i % 3 != 1])


def test_translate_file_checks_every_line_first_and_writes_atomically(translator, tmp_path):
    src = tmp_path / "in.en.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(LINES) + "\n")
    assert translator.translate_file(src, tmp_path / "out.de") == len(LINES)
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == (V1 / "greedy.de").read_text(encoding="utf-8")
    (tmp_path / "bad.en").write_text("a cat\n" + "the dog " * 700 + "\nthe cat\n", encoding="utf-8")
    (tmp_path / "old.de").write_text("an earlier translation\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.en, line 2: \d+ source pieces \(5,600 characters\), more than "
                                        r"max_source_tokens=1024"):
        translator.translate_file(tmp_path / "bad.en", tmp_path / "old.de")
    assert (tmp_path / "old.de").read_text(encoding="utf-8") == "an earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.en", "in.en.gz", "old.de", "out.de"]


# ------------------------------------------------------------------------------------------ plans


def _texts(translations):
    return [None if t is None else [(h.text, round(h.score, 4)) for h in t.hypotheses] for t in translations]


def test_prepare_tokenises_each_text_exactly_once(translator, monkeypatch):
    """A plan holds the ids: the checks and the search read them, nothing encodes a text twice."""
    seen = []
    for tokenizer in {id(t): t for t in (translator.source_tokenizer, translator.target_tokenizer)}.values():
        encode = tokenizer.encode
        monkeypatch.setattr(tokenizer, "encode", lambda text, encode=encode: seen.append(text) or encode(text))
    sources, prefix, constraints = LINES[:3], ["DOG", None, ""], [None, ["RUNS", "SMALL"], None]
    plan = translator.prepare(sources, prefix=prefix, constraints=constraints, beam=3)
    assert sorted(seen) == sorted(sources + ["DOG", "RUNS", "SMALL"])
    assert len(plan) == 3 and plan.widths == tuple(len(s) + 1 for s in plan.sources)
    assert plan.phrases["constraints"][0] is None and len(plan.phrases["constraints"][1]) == 2
    seen.clear()
    translator.run([plan])
    assert seen == []  # running decodes; it does not tokenise again
    translator.translate(sources, prefix=prefix, constraints=constraints, beam=3)
    assert len(seen) == 6


def test_run_over_plans_equals_translating_each_alone(translator):
    """Plans of one key decode as one list (sorted and batched together) and come back per plan, each what it
    would have been alone; `cancelled` indexes the joined list."""
    first = translator.prepare(LINES[:5], beam=3, nbest=2)
    second = translator.prepare(LINES[5:9], beam=3, nbest=2, prefix=["DOG", None, None, "MAN"],
                                constraints=[None, ["RUNS"], None, None])
    alone = [translator.run([first])[0], translator.run([second])[0]]
    assert _texts(alone[1]) == _texts(translator.translate(LINES[5:9], beam=3, nbest=2, prefix=["DOG", None, None,
                                                           "MAN"], constraints=[None, ["RUNS"], None, None]))
    together = translator.run([first, second])
    assert [_texts(x) for x in together] == [_texts(x) for x in alone]
    assert together[1][0].text.startswith("DOG") and "RUNS" in together[1][1].text
    gone = translator.run([first, second], cancelled=lambda i: i in (1, 6))  # first[1] and second[1]
    assert [_texts(x) for x in gone] == [_texts(alone[0][:1]) + [None] + _texts(alone[0][2:]),
                                         _texts(alone[1][:1]) + [None] + _texts(alone[1][2:])]


def test_files_of_prefixes_and_phrases_stream_beside_the_input(translator, tmp_path):
    """translate_file's prefix_file and phrase_files (one line per input line; phrases tab-separated, an empty
    line: none) translate as the lists do, in chunks too; a phrase file of another length is named."""
    lines, prefix, constraints = LINES[:5], ["DOG", None, None, "MAN", None], [None, ["RUNS", "SMALL"], None, None,
                                                                               ["WOMAN"]]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "prefix").write_text("".join((p or "") + "\n" for p in prefix), encoding="utf-8")
    (tmp_path / "phrases").write_text("".join("\t".join(c or []) + "\n" for c in constraints), encoding="utf-8")
    want = [t.text for t in translator.translate(lines, prefix=prefix, constraints=constraints, beam=3)]
    translator.translate_file(tmp_path / "in.en", tmp_path / "out", prefix_file=tmp_path / "prefix",
                              phrase_files={"constraints": tmp_path / "phrases"}, beam=3, chunk_size=2)
    assert (tmp_path / "out").read_text(encoding="utf-8").splitlines() == want
    got = translator.translate_iterable(iter(lines), prefix=iter(prefix), constraints=iter(constraints), beam=3,
                                        chunk_size=3)
    assert [t.text for t in got] == want
    (tmp_path / "phrases").write_text("RUNS\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in\.en has 5 lines but .*phrases has 1; give one line of constraints"):
        translator.translate_file(tmp_path / "in.en", tmp_path / "out", phrase_files={"constraints":
                                                                                      tmp_path / "phrases"}, beam=3)


@pytest.mark.parametrize("options, message", [
    (dict(beam=4, nbest=2), "decode.beam_size: 3 and 4"),
    (dict(beam=3, nbest=2, alignment=True), "alignment: False and True"),
    (dict(beam=3, nbest=2, batch_type="tokens"), "batch_type: 'examples' and 'tokens'"),
])
def test_run_refuses_plans_that_decode_differently(translator, options, message):
    plan = translator.prepare(LINES[:2], beam=3, nbest=2)
    with pytest.raises(ValueError, match=message):
        translator.run([plan, translator.prepare(LINES[2:4], **options)])
    sampled = translator.prepare(LINES[:2], strategy="sample", seed=1)
    assert sampled.key is None
    with pytest.raises(ValueError, match="decodes alone"):
        translator.run([sampled, translator.prepare(LINES[:2], strategy="sample", seed=1)])


def test_a_checkpoint_that_says_beam_decodes_with_beam_everywhere(tmp_path):
    """The decode section a checkpoint (its recipe) names is what the library, the command line and the
    explorer use unless told otherwise, and each says which."""
    import shutil

    from tformer.explore import Explorer

    ckpt = tmp_path / "checkpoint"
    shutil.copytree(V1 / "checkpoint", ckpt)
    cfg = (ckpt / "config.yaml").read_text(encoding="utf-8")
    (ckpt / "config.yaml").write_text(cfg.replace("  strategy: greedy\n", "  strategy: beam\n")
                                      .replace("  beam_size: 5\n", "  beam_size: 3\n"), encoding="utf-8")
    translator = tformer.load(ckpt, device="cpu")
    want = [t.text for t in translator.translate(LINES[:6])]
    assert want == [t.text for t in translator.translate(LINES[:6], beam=3)]
    assert want != [t.text for t in translator.translate(LINES[:6], beam=1)]  # the fixture tells beam from greedy
    r = cli("translate", "--checkpoint", ckpt, stdin="\n".join(LINES[:6]) + "\n")
    assert r.returncode == 0 and r.stdout.splitlines() == want, r.stderr
    assert "translating with beam 3, length penalty alpha 0.6 (from the checkpoint's decode section)" in r.stderr
    r = cli("translate", "--checkpoint", ckpt, "--beam", "1", stdin=LINES[0] + "\n")
    assert r.returncode == 0 and "translating with greedy (from the command line: strategy)" in r.stderr
    explorer = Explorer(translator)
    assert explorer.defaults["beam"] == 3 and "decode section: beam 3" in explorer.info()["decoding"]
    answer = explorer.translate({"text": LINES[0]})
    assert answer["hypotheses"][0]["text"] == want[0]
    assert answer["decode"]["strategy"] == "beam" and "checkpoint's decode section" in answer["decode"]["from"]
    assert Explorer(tformer.load(V1 / "checkpoint", device="cpu")).defaults == {"beam": 1, "nbest": 1}


# ------------------------------------------------------------------------------------------ attention


def test_attention_is_what_attention_maps_computes(translator):
    out = translator.translate([LINES[0]], beam=3, nbest=2, return_attention=True)[0]
    ids = translator.encode(LINES[0])
    hyps = [translator.encode(h.text, "target") for h in out.hypotheses]
    for h, want in zip(out.hypotheses, attention_maps(translator.model, [(ids, t) for t in hyps])):
        for kind in KINDS:
            np.testing.assert_allclose(h.attention.weights[kind], want.weights[kind], atol=1e-6)
        assert h.attention.source == out.source_tokens + ["</s>"]
        assert h.attention.target_out == h.tokens + ["</s>"]
    forced = translator.score([LINES[0]], ["DOG DOG"], return_attention=True)[0]
    want = attention_maps(translator.model, [(ids, translator.encode("DOG DOG", "target"))])[0]
    np.testing.assert_allclose(forced.attention.weights["cross"], want.weights["cross"], atol=1e-6)


# ------------------------------------------------------------------------------------------ bad input


def _foreign(tmp_path: Path) -> Path:
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "trainer.json").write_text('{"global_step": 5}')
    return tmp_path / "foreign"


@pytest.mark.parametrize("call, error, message", [
    (lambda t, p: tformer.load(p / "nope"), CheckpointError, "nope does not exist"),
    (lambda t, p: tformer.load(_foreign(p)), CheckpointError, "foreign is not a tformer checkpoint"),
    (lambda t, p: tformer.load(V1 / "checkpoint", overrides=["model.dropout=0.5"]), ConfigError,
     "'model.dropout' cannot change after training"),
    (lambda t, p: tformer.load(V1 / "checkpoint", beem_size=4), ConfigError, "did you mean 'decode.beam_size'"),
    (lambda t, p: tformer.load(V1 / "checkpoint", attention="flash"), ConfigError, "'model.attention': must be one"),
    (lambda t, p: tformer.load(V1 / "checkpoint", threads=0), ConfigError, "threads must be a whole number"),
    (lambda t, p: tformer.load(V1 / "checkpoint", device="gpu7"), ConfigError, "'gpu7' is not a device"),
    (lambda t, p: t.translate([]), DataError, "sources is an empty list"),
    (lambda t, p: t.translate("a cat"), DataError, "sources must be a list, got str: wrap one sentence"),
    (lambda t, p: t.translate(["a cat", 7]), DataError, r"sources\[1\]: a sentence must be a string, got int"),
    (lambda t, p: t.translate(["a cat", "dog " * 2000]), DataError, r"sources\[1\]: \d+ source pieces"),
    (lambda t, p: t.translate(["a"], beam=0), ConfigError, "'decode.beam_size': must be >= 1"),
    (lambda t, p: t.translate(["a"], nbest=3), ConfigError, "'decode.nbest': greedy search has one hypothesis"),
    (lambda t, p: t.translate(["a"], batch_type="sentences"), ConfigError, "batch_type must be 'examples'"),
    (lambda t, p: t.translate(["a", "b"], prefix=["A"]), DataError, "prefix has 1 entries for 2 sources"),
    (lambda t, p: t.translate([np.zeros((3, 4))]), DataError, r"sources\[0\]: a sentence must be a string"),
    (lambda t, p: t.score(["a", "b"], ["A"]), DataError, "2 sources but 1 targets"),
    (lambda t, p: t.score([""], ["A"]), DataError, r"sources\[0\] is empty"),
    (lambda t, p: list(t.translate_iterable(["a", None])), DataError, "the input, line 2: a sentence must be"),
    (lambda t, p: t.translate_file(p / "missing.en", p / "out"), DataError, "missing.en does not exist"),
    (lambda t, p: t.encode("a", side="middle"), DataError, "side must be 'source' or 'target'"),
])
def test_bad_input_raises_one_family_naming_what_and_where(translator, tmp_path, call, error, message):
    with pytest.raises(error, match=message) as info:
        call(translator, tmp_path)
    assert isinstance(info.value, TformerError)


# ------------------------------------------------------------------------------------------ train, build


def test_train_and_translate_from_python(tmp_path):
    cfg = tformer.Config.from_yaml("copy", ["model.d_model=32", "model.d_ff=64", "data.train_size=300",
                                            "data.valid_size=20", "data.test_size=20", "data.max_len=8",
                                            "train.max_steps=30", "train.eval_every=15", "train.attention_examples=0",
                                            "train.max_hours=0"])  # the recipe's 4-minute cap: not in a test
    result = tformer.train(cfg, tmp_path / "run")
    assert isinstance(result, tformer.TrainResult) and result.step == 30 and result.checkpoint.exists()
    resumed = tformer.train(None, tmp_path / "run", resume=True, overrides=["train.max_steps=40"])
    assert resumed.step == 40
    translator = tformer.load(tmp_path / "run", which="latest", device="cpu")
    ids = translator.encode("a b c")
    want = translate_ids(translator.model, [ids], DecodeConfig()).tokens[0][0]
    assert translator.translate(["a b c"])[0].text == translator.decode(want)
    evaluation = translator.evaluate("test")
    assert evaluation.metrics["n"] == 20 and 0.0 <= evaluation.metrics["exact_match"] <= 1.0
    assert evaluation.outputs == [t.text for t in translator.translate(evaluation.sources)]
    model = tformer.build_model(cfg, 12, 9)
    assert model.src_embed.tokens.num_embeddings == 12 and model.generator.out_features == 9
    with pytest.raises(ConfigError, match="training needs a config"):
        tformer.train(None, tmp_path / "other")


def test_the_public_names_and_a_quick_import():
    for name in tformer.__all__:
        assert getattr(tformer, name) is not None, name
    code = "import sys, tformer; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.strip() == "False", r.stderr  # `import tformer` loads nothing heavy until a name is used
