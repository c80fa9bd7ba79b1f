"""Training under bf16 autocast and under torch.compile (train.precision, train.compile): a run killed with
SIGKILL or stopped and resumed ends bitwise equal to a straight run of the same mode; checkpoints stay plain
fp32 weights that every other path reads; where compiling cannot work, the run says why and trains eager,
exactly as an eager run; the log says what the CPU has and what was chosen.

Oracles: the straight run of the same configuration (bit for bit), the eager model's loss on the same batches,
PyTorch's own loading of the saved weights."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal

import pytest
import torch
from safetensors.torch import load_file

import tformer.training.compile as compile_mod
from tformer.checkpoint import load_checkpoint
from tformer.model import build_model
from tformer.training.loop import train
from tformer.training.precision import cpu_choice

from helpers.faults import EVENTS_PER_WRITE, _final_weights, _records, _start
from helpers.models import tiny_config

pytestmark = pytest.mark.slow  # whole training runs, one of them compiled (about a minute the first time)


def _with(cfg, **train_keys):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_keys))


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(load_checkpoint(run, which="latest").path / "model.safetensors"))


def _losses(run) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").open()) if r["kind"] == "train"]


def test_a_bf16_run_killed_with_sigkill_and_resumed_ends_bitwise_equal_to_a_straight_bf16_run(tmp_path):
    """Killed inside its third checkpoint write (after the rename stage), resumed to the end: every update's
    metrics and the final weights equal the straight bf16 run's; the weights are float32 and differ from an fp32
    run's (bf16 did run)."""
    bf16 = ("train.precision=bf16",)
    straight, fp32 = _start(tmp_path / "straight", False, extra=bf16), _start(tmp_path / "fp32", False)
    for p in (straight, fp32):
        assert p.communicate(timeout=300)[0] is not None and p.returncode == 0, p.stderr
    killed = _start(tmp_path / "run", False, kill_at=2 * EVENTS_PER_WRITE + 6, extra=bf16)
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert load_checkpoint(tmp_path / "run", "latest").trainer["step"] < 60  # it died mid-run
    resumed = _start(tmp_path / "run", True, extra=bf16)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert _records(tmp_path / "run") == _records(tmp_path / "straight")
    want, got = _final_weights(tmp_path / "straight"), _final_weights(tmp_path / "run")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert all(t.dtype == torch.float32 for t in got.values())
    other = _final_weights(tmp_path / "fp32")
    assert any(not torch.equal(other[k], got[k]) for k in got)


def test_a_compiled_run_resumes_exactly_computes_the_eager_loss_and_saves_plain_weights(tmp_path, caplog):
    """train.compile with dropout: a run stopped mid-epoch and resumed equals a straight compiled run bitwise
    (inductor's atomic-add sums would break this: training/compile.py); the first update's loss equals the
    eager model's on the same batch; the saved weights load into a plain model (no `_orig_mod.` names)."""
    cfg = _with(tiny_config(dropout=0.1, attention_dropout=0.1, encoder_layers=1, decoder_layers=1), epochs=2,
                log_every=1, compile=True)  # one layer a side: half the graph to compile
    with caplog.at_level(logging.INFO, logger="tformer"):
        train(cfg, tmp_path / "full")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train.compile")]
    assert len(said) == 1 and "the first update took" in said[0] and compile_mod.cache_dir() in said[0], said
    train(_with(cfg, max_steps=7), tmp_path / "split")
    train(cfg, tmp_path / "split", resume=True)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "full") == _losses(tmp_path / "split")
    train(_with(cfg, compile=False), tmp_path / "eager")
    assert set(a) == set(_weights(tmp_path / "eager"))  # the names an eager run saves
    model = build_model(cfg.model, 12, 12)
    load_checkpoint(tmp_path / "full", which="latest").load_model_state(model)  # refuses a missing or unknown name
    assert all(torch.equal(model.state_dict()[k], a[k]) for k in a)
    first_compiled, first_eager = _losses(tmp_path / "full")[0], _losses(tmp_path / "eager")[0]
    assert first_compiled[0] == first_eager[0] == 1
    assert first_compiled[1] == pytest.approx(first_eager[1], rel=1e-5)
    assert any(not torch.equal(a[k], _weights(tmp_path / "eager")[k]) for k in a)  # it did run compiled code


@pytest.mark.parametrize("failure", ["compile", "compiler"])
def test_where_compiling_fails_the_run_says_why_and_trains_exactly_as_eager(tmp_path, caplog, monkeypatch, failure):
    """An error in the first compiled call (torch.compile raises lazily, e.g. BackendCompilerFailed), or no C++
    compiler for inductor's CPU code: one warning naming the reason, then the eager run, bit for bit (the
    failed attempt leaves the dropout stream where it was)."""
    cfg = _with(tiny_config(dropout=0.1), epochs=1, log_every=1, compile=True)
    if failure == "compile":
        def broken(model, **kwargs):
            def call(*args, **kw):
                torch.rand(100)  # a failed attempt that drew random numbers first
                raise RuntimeError("backend 'inductor' raised:\nCppCompileError: the C++ compile failed")
            return call
        monkeypatch.setattr(compile_mod.torch, "compile", broken)
        reason = "RuntimeError: backend 'inductor' raised:"
    else:
        from torch._inductor import cpp_builder

        def no_compiler():
            raise RuntimeError("no working C++ compiler found in ['g++', 'clang++']")
        monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
        reason = "inductor needs a C++ compiler for CPU code (no working C++ compiler found"
    with caplog.at_level(logging.INFO, logger="tformer"):
        train(cfg, tmp_path / "fallback")
    said = [r for r in caplog.records if r.getMessage().startswith("train.compile")]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and reason in said[0].getMessage(), said
    assert said[0].getMessage().endswith("training runs eager")
    train(_with(cfg, compile=False), tmp_path / "eager")
    a, b = _weights(tmp_path / "fallback"), _weights(tmp_path / "eager")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "fallback") == _losses(tmp_path / "eager")


def test_the_log_says_whether_the_cpu_has_bf16_units_and_what_training_chose(caplog, monkeypatch):
    """One line at the start of every CPU run: the precision chosen and the units (or their absence, by name)."""
    assert cpu_choice("fp32", {"avx2", "avx512_bf16"}) == (
        "fp32 throughout; this CPU has bf16 units (avx512_bf16): train.precision=bf16 would run the products in bf16")
    assert cpu_choice("fp32", {"avx2"}) == "fp32 throughout; this CPU has no bf16 units (avx512_bf16 or amx_bf16)"
    assert cpu_choice("bf16", {"amx_bf16", "avx512_bf16"}).startswith(
        "the forward under autocast in bf16 on this CPU's avx512_bf16, amx_bf16 units")
    import tformer.precision as policy
    from tformer.training.precision import Precision

    for flags, want in (({"avx2"}, "train.precision=fp32: fp32 throughout; this CPU has no bf16 units"),
                        ({"avx512_bf16"}, "train.precision=fp32: fp32 throughout; this CPU has bf16 units"),
                        (None, "train.precision=fp32: fp32 throughout (this CPU's flags cannot be read)")):
        monkeypatch.setattr(policy, "cpu_flags", lambda flags=flags: flags)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tformer"):
            Precision("fp32", torch.device("cpu"))
        assert [r.getMessage()[:len(want)] for r in caplog.records] == [want]


def test_the_compiled_forward_keeps_one_graph_for_batches_of_any_size_and_length():
    """Token-budget batches change the batch size and both lengths at every update: dynamo must keep them
    symbolic (a position slice fixed the lengths in the graph: a recompile per length, then eager after
    torch's limit). Sizes of 1 are left out: dynamo specialises those by design."""
    from torch._dynamo.utils import counters

    from helpers.models import padded_batch

    model = build_model(tiny_config().model, 20, 20)
    compiled = torch.compile(model, backend="eager", dynamic=True)  # dynamo alone: the guards, not the code
    counters.clear()
    for src_lengths, tgt_lengths, seed in (([5, 3], [4, 2], 1), ([9, 7, 2], [6, 6, 3], 2), ([4, 6], [8, 3], 3)):
        src, sl = padded_batch(src_lengths, seed, vocab=20)
        tgt, tl = padded_batch(tgt_lengths, seed + 10, vocab=20)
        torch.testing.assert_close(compiled(src, sl, tgt, tl).padded(), model(src, sl, tgt, tl).padded())
    assert counters["stats"]["unique_graphs"] == 1
