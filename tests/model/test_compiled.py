"""The decoding step compiled ahead of time (tformer.model.compiled, decode.compile): against the eager step it is
compiled from (an oracle whose kernels are PyTorch's, not inductor's), saved and read back, refused where it
cannot be."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import tformer
import tformer.model.compiled as compiled
from helpers.hf_marian_models import make_folder
from tformer.errors import ConfigError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small OPUS-MT-like model whose outputs end at varied lengths (sentences leave a batch at varied steps)."""
    return make_folder(tmp_path_factory.mktemp("compiled") / "opus", seed=0)


@pytest.fixture(scope="module")
def sources(shared_data):
    with gzip.open(shared_data / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f][:23]


@pytest.mark.parametrize("batch_size", [1, 7])
def test_the_compiled_step_translates_as_the_eager_step(folder, sources, batch_size):
    eager = tformer.load(folder, device="cpu")
    fast = tformer.load(folder, device="cpu", compile=True)
    assert eager.model.compiled_step is None and fast.model.compiled_step is not None
    fast.model.compiled_step.faster = (True,) * len(compiled.ROWS)  # every search compiled, whatever was measured
    for settings in (dict(beam=1), dict(beam=4, nbest=2), dict(beam=3, no_repeat_ngram=2, min_len=3)):
        want = eager.translate(sources, batch_size=batch_size, max_len_b=40, **settings)
        got = fast.translate(sources, batch_size=batch_size, max_len_b=40, **settings)
        assert [t.tokens for t in got] == [t.tokens for t in want]
        assert [len(t.tokens) for t in want] != [len(want[0].tokens)] * len(want)  # lengths vary: rows leave
        for g, w in zip(got, want):
            assert g.score == pytest.approx(w.score, abs=1e-4)
            assert [h.tokens for h in g.hypotheses] == [h.tokens for h in w.hypotheses]


def test_the_compiled_step_is_saved_once_and_read_back(folder, monkeypatch):
    first = tformer.load(folder, device="cpu", compile=True)  # compiled here or by the test above
    assert first.model.compiled_step.path.exists()

    def no_compiling(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(compiled, "_compile", no_compiling)
    again = tformer.load(folder, device="cpu", compile=True)
    assert again.model.compiled_step.seconds == 0 and again.model.compiled_step.path == first.model.compiled_step.path
    other = tformer.load(make_folder(folder.parent / "other", seed=1), device="cpu")  # other weights: another package
    assert compiled._key(other.model) != compiled._key(first.model)
    with pytest.raises(AssertionError, match="compiled again"):
        compiled.compile_step(other.model)


def test_what_the_compiled_step_does_not_cover_is_refused_with_the_reason(folder, tmp_path):
    with pytest.raises(ConfigError, match="cannot be compiled: weights not in fp32"):
        tformer.load(folder, device="cpu", compile=True, quantize="int8")
    with pytest.raises(ConfigError, match="cannot be compiled: weights not in fp32"):
        tformer.load(folder, device="cpu", compile=True, precision="bf16")
    with pytest.raises(ConfigError, match="decode.compile: an ensemble decodes eagerly"):
        tformer.load([folder, folder], device="cpu", compile=True)
    from helpers.models import tiny_config
    from tformer.model import build_model

    universal = build_model(tiny_config(kind="universal").model, 20, 20)
    assert compiled.compile_problems(universal) == ["model.kind=universal (ACT halting has no CTranslate2 counterpart)"]
    with pytest.raises(ConfigError, match="'decode.compile': the model was loaded with compile=False"):
        tformer.load(folder, device="cpu").translate(["a"], compile=True)


def test_a_step_past_the_table_of_positions_is_a_clear_error(folder):
    fast = tformer.load(folder, device="cpu", compile=True)
    step = fast.model.compiled_step
    model = fast.model
    src = torch.tensor([[5, 6, 2]])
    with torch.inference_mode():
        cache = step.start(model.init_cache(model.encode(src, torch.tensor([3]))))
    long = compiled.CompiledCache(cache.src_mask, cache.cross_k, cache.cross_v,
                                  *(x.new_zeros(*x.shape[:3], step.positions, x.shape[4])
                                    for x in (cache.self_k, cache.self_v)))
    with pytest.raises(ConfigError, match=f"at most {step.positions} positions"):
        step(torch.tensor([4]), long)


def test_searches_run_compiled_where_it_was_measured_faster(folder, monkeypatch):
    """The measurement at load decides per row count (sentences x beams at a search's start); it is saved beside
    the package, read back, and timed again when damaged."""
    fast = tformer.load(folder, device="cpu", compile=True)
    step = fast.model.compiled_step
    choice = step.path.with_suffix(".json")
    assert json.loads(choice.read_text())["faster"] == list(step.faster)
    calls = []
    real = step._run
    monkeypatch.setattr(step, "_run", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    step.faster = (False, True, True, False)  # rows 1, 4, 16, 64
    for n, settings, used in ((1, dict(beam=1), False), (1, dict(beam=4), True), (3, dict(beam=5), True),
                              (20, dict(beam=1), True), (20, dict(beam=4), False), (2, dict(beam=1), False)):
        calls.clear()
        fast.translate(["a b c"] * n, batch_size=n, max_len_b=5, **settings)
        assert bool(calls) == used, (n, settings)
    assert step.wins(3) and not step.wins(1) and step.wins(8) and not step.wins(33) and not step.wins(100)
    assert step.summary()["compiled_at_rows"] == [4, 16] and step.summary()["eager_at_rows"] == [1, 64]
    choice.write_text('{"faster": [true]}')  # damaged: timed again and saved
    measured = []
    monkeypatch.setattr(compiled, "measure", lambda model, s: measured.append(1) or (True, False, True, False))
    again = tformer.load(folder, device="cpu", compile=True)
    assert measured == [1] and again.model.compiled_step.faster == (True, False, True, False)
    assert json.loads(choice.read_text())["faster"] == [True, False, True, False]


def test_a_server_of_a_compiled_model_says_so_and_translates_as_the_eager_one(folder):
    from helpers.serve import call, live

    fast = tformer.load(folder, device="cpu", compile=True)
    fast.model.compiled_step.faster = (True,) * len(compiled.ROWS)
    want = [t.text for t in tformer.load(folder, device="cpu").translate(["a b c", "d e"], beam=1, max_len_b=20)]
    with live(fast, warm_up=2) as (srv, url):
        info = call(url, "/v1/info")[1]
        assert info["compiled_step"]["compiled_at_rows"] == list(compiled.ROWS) and info["decode"]["compile"] is True
        status, answer, _ = call(url, "/v1/translate", {"src": ["a b c", "d e"], "beam": 1, "max_len_b": 20})
        assert status == 200 and [t["text"] for t in answer["translations"]] == want


def test_a_machine_that_cannot_compile_gets_a_clear_error(folder, tmp_path, monkeypatch):
    """No C++ compiler (inductor's InvalidCxxCompiler): a ConfigError that says what to do; nothing is saved."""
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler(model, path):
        raise InvalidCxxCompiler()

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path))
    monkeypatch.setattr(compiled, "_compile", no_compiler)
    with pytest.raises(ConfigError, match=r"step failed \(InvalidCxxCompiler.*without --compile"):
        tformer.load(folder, device="cpu", compile=True)
    assert not list(tmp_path.glob("steps/*"))
