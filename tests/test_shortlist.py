"""Lexical shortlists (tformer.shortlist) against oracles:

- the restricted output projection is the full one's columns, for plain, prepacked and int8 layers;
- a list of the whole vocabulary changes no output; with narrow lists, the batched search equals a full search,
  one sentence at a time, of a model whose logits outside that sentence's list are -inf (so outputs never leave
  a sentence's list, and do not depend on the batch);
- the table built from eflomal's alignments of a corpus whose 'German' is its English in capitals maps each word
  to its capitals, its frequent list is a count of the corpus, and its limits hold;
- files round-trip, a list for other vocabularies or a file that is not one is refused by name, the command line
  equals the library, and CTranslate2 reads the list as its vocabulary map.
"""

import random
from collections import Counter

import numpy as np
import pytest
import torch

import tformer
from tformer.decode import NBest
from tformer.errors import ConfigError, DataError
from tformer.inference import translate_ids
from tformer.model import build_model
from tformer.model.ensemble import Ensemble
from tformer.model.matmul import MeasuredLinear, Product
from tformer.model.output import restricted_linear
from tformer import shortlist as shortlist_module
from tformer.shortlist import SPECIALS, Shortlist, build_shortlist, restrict

from helpers.models import tiny_config
from helpers.serve import CHECKPOINT, LINES

pytest.importorskip("eflomal", reason="pip install eflomal (part of the test extra)")

WORDS = "a big cat child dog eats house man red runs sees small the woman".split()


def corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
    return src, [s.upper() for s in src]


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def translator():
    return tformer.load(CHECKPOINT, device="cpu")


@pytest.fixture(scope="module")
def built(translator, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shortlist")
    src, tgt = corpus(400)
    files = write(folder / "c.en", src), write(folder / "c.de", tgt)
    shortlist = build_shortlist(translator, *files, first=5, best=4)
    return shortlist, shortlist.save(folder / "s.safetensors"), files


def whole(translator, first: int | None = None) -> Shortlist:
    """A shortlist allowing every target id, <pad> and <s> too (or the `first` ones), nothing per source id."""
    V, Vs = len(translator.target_tokenizer.vocab), len(translator.source_tokenizer.vocab)
    keep = np.arange(0, V if first is None else first, dtype=np.int64)
    return Shortlist(keep, np.zeros(Vs + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                     np.zeros(0, dtype=np.float32),
                     (translator.source_tokenizer.fingerprint(), translator.target_tokenizer.fingerprint()))


# ------------------------------------------------------------------------------------------ the projection


@pytest.mark.parametrize("form", ["plain", "prepacked", "rows", "int8"])
def test_the_restricted_projection_is_the_full_projections_columns(form):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 50)
    if form in ("prepacked", "rows"):  # that library at every row count
        linear = MeasuredLinear(linear)
        linear.run = Product(linear.weight.detach(), linear.bias.detach(), (form,) * 9)
        assert linear.run.choice == (form,) * 9
    if form == "int8":
        linear = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                        dtype=torch.qint8)[0]
    ids = torch.tensor([2, 3, 17, 40, 49])
    x = torch.randn(7, 24)
    with torch.inference_mode():
        got, want = restricted_linear(linear, ids)(x), linear(x)[:, ids]
    if form == "int8":  # the same int8 weights, the same input scale: the same products
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="Embedding"):
        restricted_linear(torch.nn.Embedding(3, 4), ids)


def test_an_int8_layer_is_unpacked_once_and_again_after_its_weights_change():
    torch.manual_seed(0)
    layer = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(24, 50)), {torch.nn.Linear},
                                                   dtype=torch.qint8)[0]
    unpack, calls = layer._packed_params._weight_bias, []
    layer._packed_params._weight_bias = lambda: calls.append(1) or unpack()
    ids, x = torch.tensor([1, 5, 30]), torch.randn(4, 24)
    with torch.inference_mode():
        first, second = restricted_linear(layer, ids)(x), restricted_linear(layer, ids)(x)
        assert len(calls) == 1 and torch.equal(first, second)
        weight = torch.quantize_per_tensor(torch.randn(50, 24), 0.02, 0, torch.qint8)
        layer.set_weight_bias(weight, torch.randn(50))  # new weights: the restricted rows follow them
        assert torch.equal(restricted_linear(layer, ids)(x), layer(x)[:, ids]) and len(calls) == 2


def test_a_model_step_with_a_restricted_output_gives_the_full_steps_columns():
    torch.manual_seed(1)
    model = build_model(tiny_config().model, 20, 20).eval()
    src = torch.randint(4, 20, (3, 6))
    enc = model.encode(src, torch.tensor([6, 4, 5]))
    ids = torch.tensor([2, 5, 6, 11])
    with torch.inference_mode():
        full, _ = model.decode_step(torch.ones(3, dtype=torch.long), model.init_cache(enc))
        part, _ = model.decode_step(torch.ones(3, dtype=torch.long), model.init_cache(enc),
                                    model.restricted_output(ids))
    torch.testing.assert_close(part, full[:, ids], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize("options", [{}, {"beam": 4, "nbest": 2}, {"strategy": "sample", "seed": 3, "nbest": 2}])
@pytest.mark.parametrize("int8", [False, True])
def test_a_list_of_the_whole_vocabulary_changes_nothing(translator, tmp_path, options, int8):
    path = whole(translator).save(tmp_path / "all.safetensors")
    q = "int8" if int8 else "none"
    plain = tformer.load(CHECKPOINT, device="cpu", quantize=q).translate(LINES, batch_size=5, **options)
    listed = tformer.load(CHECKPOINT, device="cpu", quantize=q, shortlist=str(path)).translate(LINES, batch_size=5,
                                                                                             **options)
    assert [[h.text for h in t.hypotheses] for t in listed] == [[h.text for h in t.hypotheses] for t in plain]
    assert [h.score for t in listed for h in t.hypotheses] == pytest.approx(
        [h.score for t in plain for h in t.hypotheses], abs=1e-4)


@pytest.mark.parametrize("multiple", [1, 8])
def test_the_search_sees_the_batchs_columns_padded_and_maps_them_back(built, translator, multiple, monkeypatch):
    monkeypatch.setattr(shortlist_module, "COLUMN_MULTIPLE", multiple)
    shortlist, _, _ = built
    model = tformer.load(CHECKPOINT, device="cpu").model
    sources = [translator.encode(line) for line in LINES[:3]]
    allowed = [shortlist.allowed(s) for s in sources]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s + [2]) for s in sources], True)
    with torch.inference_mode():
        cache = model.init_cache(model.encode(src, torch.tensor([len(s) + 1 for s in sources])))
        r = restrict(model, cache, allowed, model.generator.out_features)
        union = sorted(set(np.concatenate(allowed).tolist()) | {0, 1, 2, 3})
        V = model.generator.out_features
        if multiple == 1:
            assert r.ids.tolist() == union
        else:  # padded with other ids, still sorted
            assert set(union) < set(r.ids.tolist()) and r.ids.tolist() == sorted(r.ids.tolist())
            assert len(r.ids) % multiple == 0 and len(r.ids) < V
        assert r.ids[:4].tolist() == [0, 1, 2, 3]  # the searches' special ids are columns too
        logits, _ = r.step(torch.full((3,), 1), r.cache)
        full, _ = model.decode_step(torch.full((3,), 1), model.init_cache(model.encode(src, torch.tensor(
            [len(s) + 1 for s in sources]))))
    assert logits.shape == (3, len(r.ids))
    for j, a in enumerate(allowed):  # each sentence: its own list's logits, -inf elsewhere
        mine = torch.from_numpy(np.isin(r.ids.numpy(), a))
        torch.testing.assert_close(logits[j, mine], full[j, r.ids[mine]], rtol=1e-5, atol=1e-5)
        assert torch.isneginf(logits[j, ~mine]).all()
    word = [r.ids[5].item(), r.ids[7].item()]
    assert r.columns([word, None]) == [[5, 7], None]
    assert r.tokens(NBest([[[5, 7]], None], [[0.0], None])).tokens == [[word], None]


class Masked(torch.nn.Module):
    """The oracle: one sentence's model whose logits outside `allowed` are -inf, decoded without a shortlist (of an
    ensemble: each member's, as a shortlist normalises each over the sentence's list)."""

    def __init__(self, model, allowed: np.ndarray) -> None:
        super().__init__()
        self.model, self.generator, self.cfg = model, model.generator, model.cfg
        self.keep = torch.zeros(model.generator.out_features, dtype=torch.bool)
        self.keep[torch.from_numpy(allowed)] = True

    def encode(self, *a):
        return self.model.encode(*a)

    def init_cache(self, enc):
        return self.model.init_cache(enc)

    def decode_step(self, tokens, cache, output=None):
        logits, cache = self.model.decode_step(tokens, cache)
        return logits.masked_fill(~self.keep, float("-inf")), cache


RULES = {"no_repeat_ngram": 2, "repetition_penalty": 1.5, "min_len": 3}  # the rules that read a row's tokens


@pytest.mark.parametrize("options", [{"strategy": "greedy"}, {"strategy": "beam", "beam_size": 4, "nbest": 2},
                                     {"strategy": "greedy", **RULES}, {"strategy": "beam", "beam_size": 3, **RULES}])
@pytest.mark.parametrize("ensemble", [False, True])
@pytest.mark.parametrize("prefixed", [False, True])
def test_the_batched_search_equals_a_full_search_of_each_sentence_masked_to_its_list(built, translator, options,
                                                                                      ensemble, prefixed,
                                                                                      monkeypatch):
    """The search runs in the batch's columns: its rules and forced prefixes must read columns as the full
    search reads ids; a phrase to avoid whose tokens are outside the lists is moot. (Unpadded: padded to 64,
    this 60-piece vocabulary's columns would be its ids.)"""
    monkeypatch.setattr(shortlist_module, "COLUMN_MULTIPLE", 1)
    shortlist, path, _ = built
    paths = [CHECKPOINT, CHECKPOINT] if ensemble else CHECKPOINT
    listed = tformer.load(paths, device="cpu", shortlist=str(path))
    cfg = listed.decode_settings(batch_size=7, **options)
    sources = [listed.encode(line) for line in LINES if line]
    rare = [i for i in translator.encode("HOUSE WOMAN", "target") if i not in set(shortlist.frequent)]
    prefixes = [rare[: i % 3] for i in range(len(sources))] if prefixed else None
    phrases = ([[rare[-1:]] if i % 2 else None for i in range(len(sources))]
               if prefixed and options["strategy"] == "beam" else None)
    free = translate_ids(listed.model, sources, cfg, prefixes=prefixes)
    avoid = [[rare[:1], h[0][len(p or ()):][:1]] if h[0][len(p or ()):] else None  # outside its list; its first
             for h, p in zip(free.tokens, prefixes or [None] * len(sources))]  # token (a phrase to avoid)
    got = translate_ids(listed.model, sources, cfg, prefixes=prefixes, phrases={"constraints": phrases, "avoid": avoid})
    assert got.tokens != free.tokens  # the avoided tokens bite
    plain_cfg = listed.decode_settings(batch_size=1, shortlist="", **options)
    for i, src in enumerate(sources):
        prefix = [prefixes[i]] if prefixed else None
        phrase = [phrases[i]] if phrases else None
        allowed = shortlist.allowed(src, (prefix[0] if prefixed else []) + (phrase[0][0] if phrase and phrase[0]
                                                                             else []))
        oracle = (Ensemble([Masked(m, allowed) for m in listed.model.models]) if ensemble
                  else Masked(listed.model, allowed))
        want = translate_ids(oracle, [src], plain_cfg, prefixes=prefix,
                             phrases={"constraints": phrase, "avoid": [avoid[i]]})
        if prefixed:
            assert all(h[: len(prefix[0])] == prefix[0] for h in got.tokens[i])
        if phrase and phrase[0]:
            assert all(rare[-1] in h for h in got.tokens[i])
        assert got.tokens[i] == want.tokens[0], i
        assert got.scores[i] == pytest.approx(want.scores[0], abs=1e-4), i
        assert all(t in set(allowed.tolist()) for hyp in got.tokens[i] for t in hyp)
    narrow = sum(len(shortlist.allowed(s)) for s in sources) / len(sources)
    assert narrow < 0.6 * listed.model.generator.out_features  # the lists do restrict


def test_outputs_do_not_depend_on_the_batch_and_forced_tokens_stay_allowed(built, translator):
    shortlist, path, _ = built
    listed = tformer.load(CHECKPOINT, device="cpu", shortlist=str(path), beam_size=3)
    one = [t.hypotheses[0].tokens for t in listed.translate(LINES, beam=3, batch_size=1)]
    seven = [t.hypotheses[0].tokens for t in listed.translate(LINES, beam=3, batch_size=7)]
    assert one == seven
    # a prefix and a constraint whose pieces no list holds still come out
    rare = [w for w in ("HOUSE", "WOMAN") if not set(translator.encode(w, "target")) <= set(shortlist.frequent)]
    assert rare
    done = listed.translate(["a dog"], beam=3, prefix=[rare[0]], constraints=[[rare[-1]]])[0]
    assert done.text.startswith(rare[0]) and rare[-1] in done.text


# ------------------------------------------------------------------------------------------ building


def test_the_table_maps_each_word_to_its_capitals_and_keeps_its_limits(built, translator):
    shortlist, _, (src_file, tgt_file) = built
    src_itos, tgt_itos = translator.source_tokenizer.vocab.itos, translator.target_tokenizer.vocab.itos
    capitals = {s: tgt_itos.index(p.upper()) for s, p in enumerate(src_itos) if s >= 4 and p != p.upper()
                and p.upper() in tgt_itos and len(shortlist.candidates(s))}
    hits = [s for s, t in capitals.items() if shortlist.candidates(s)[0] == t]
    assert len(capitals) >= 10 and len(hits) >= 0.9 * len(capitals), [src_itos[s] for s in capitals if s not in hits]
    sizes = np.diff(shortlist.indptr)
    assert sizes.max() <= 4 and len(shortlist.frequent) == 5
    for s in range(shortlist.source_vocab):
        probs = shortlist.probs[shortlist.indptr[s]:shortlist.indptr[s + 1]]
        assert (np.diff(probs) <= 0).all() and probs.sum() <= 1 + 1e-6
    counts = Counter(i for line in tgt_file.read_text(encoding="utf-8").splitlines()
                     for i in translator.encode(line, "target"))
    top = sorted(counts.values(), reverse=True)[4]
    assert all(counts[i] >= top for i in shortlist.frequent)  # the five most frequent pieces
    assert set(SPECIALS) <= set(shortlist.allowed([]).tolist())


def test_files_round_trip_and_wrong_ones_are_refused_by_name(built, translator, tmp_path):
    shortlist, path, (src_file, tgt_file) = built
    again = Shortlist.load(path)
    for name in ("frequent", "indptr", "indices", "probs"):
        assert np.array_equal(getattr(again, name), getattr(shortlist, name))
    assert again.fingerprints == shortlist.fingerprints and again.settings["best"] == 4
    other = Shortlist(shortlist.frequent, shortlist.indptr, shortlist.indices, shortlist.probs, ("x", "y"))
    other_path = other.save(tmp_path / "other.safetensors")
    with pytest.raises(ConfigError, match="other vocabularies"):
        tformer.load(CHECKPOINT, device="cpu", shortlist=str(other_path))
    with pytest.raises(ConfigError, match="other vocabularies"):
        translator.translate(["a dog"], shortlist=str(other_path))
    with pytest.raises(DataError, match="does not exist"):
        tformer.load(CHECKPOINT, device="cpu", shortlist=str(tmp_path / "none.safetensors"))
    junk = write(tmp_path / "junk.safetensors", ["not a table"])
    with pytest.raises(DataError, match="junk.safetensors is not a"):
        translator.translate(["a dog"], shortlist=str(junk))
    with pytest.raises(DataError, match="lines"):
        build_shortlist(translator, src_file, write(tmp_path / "short.de", ["A"]))
    with pytest.raises(ConfigError, match="best"):
        build_shortlist(translator, src_file, tgt_file, best=-1)


def test_the_command_line_builds_and_decodes_as_the_library(built, translator, tmp_path, capsys):
    from tformer.cli import main

    _, path, (src_file, tgt_file) = built
    out = tmp_path / "cli.safetensors"
    assert main(["shortlist", "--checkpoint", str(CHECKPOINT), "--src", str(src_file), "--tgt", str(tgt_file),
                 "--out", str(out), "--first", "5", "--best", "4"]) == 0
    made = Shortlist.load(out)
    assert made.settings["first"] == 5 and np.diff(made.indptr).max() <= 4 and "wrote" in capsys.readouterr().out
    inputs = write(tmp_path / "in.en", LINES)
    assert main(["translate", "--checkpoint", str(CHECKPOINT), "--input", str(inputs), "--beam", "3",
                 "--shortlist", str(path)]) == 0
    want = tformer.load(CHECKPOINT, device="cpu", shortlist=str(path)).translate(LINES, beam=3)
    assert capsys.readouterr().out.splitlines() == [t.text for t in want]


def test_ctranslate2_reads_the_list_as_its_vocabulary_map(built, translator, tmp_path):
    pytest.importorskip("ctranslate2", reason="pip install ctranslate2 (part of the test extra)")
    from tformer.export import export_ctranslate2, translate_ctranslate2

    shortlist, path, _ = built
    out = export_ctranslate2(CHECKPOINT, tmp_path / "ct2", shortlist=path)
    lines = (out / "vmap.txt").read_text(encoding="utf-8").splitlines()
    itos = translator.target_tokenizer.vocab.itos
    assert lines[0] == "\t" + " ".join(itos[i] for i in shortlist.frequent)
    src_itos = translator.source_tokenizer.vocab.itos
    for line in lines[1:]:
        key, values = line.split("\t")
        assert values.split() == [itos[i] for i in shortlist.candidates(src_itos.index(key))]
    sources = [line for line in LINES if line]
    theirs = translate_ctranslate2(out, translator, sources, beam=1, max_len=30, use_vmap=True)
    union = set(np.unique(np.concatenate([shortlist.allowed(translator.encode(s)) for s in sources])).tolist())
    for text in theirs:  # CTranslate2 allows the batch's union (and <s>, which decoding never outputs here)
        assert set(translator.encode(text, "target")) <= union
