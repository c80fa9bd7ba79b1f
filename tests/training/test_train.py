"""Training: the loss falls, accumulation is exact, resume continues exactly, checkpoints are safe."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from tformer.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from tformer.config import TrainConfig
from tformer.data import Vocab, collate
from tformer.model import build_model
from tformer.training.loop import train, train_step_loss

from helpers.models import tiny_config


def _with(cfg, **train):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


def test_short_copy_run_lowers_the_loss(tmp_path):
    cfg = _with(tiny_config(), epochs=4, lr=2.0)
    result = train(cfg, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_loss = [r["loss"] for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    assert train_loss[-1] < 0.7 * train_loss[0]
    assert valid[-1]["loss"] < valid[0]["loss"]
    assert {"lr", "tok_per_s", "token_acc"} <= set(records[0])
    assert result.step == records[-1]["step"]
    assert resolve_checkpoint(tmp_path / "run").name.startswith("step_")


def test_gradient_accumulation_equals_one_big_batch():
    cfg = tiny_config()
    model = build_model(cfg.model, 12, 12)
    ex = [([4, 5, 6], [4, 5, 6]), ([7, 8], [7, 8]), ([9, 10, 11, 4], [9, 10, 11, 4]), ([5], [5])]

    def grads(groups):
        model.zero_grad()
        batches = [collate([ex[i] for i in g], g, Vocab.pad, Vocab.bos, Vocab.eos) for g in groups]
        n = sum(b.n_tgt_tokens for b in batches)
        for b in batches:
            (train_step_loss(model, b, 0.1)[0] / n).backward()
        return [p.grad.clone() for p in model.parameters()]

    for a, b in zip(grads([[0, 1], [2, 3]]), grads([[0, 1, 2, 3]])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_resume_continues_exactly(tmp_path):
    """Train 2 epochs straight, and 1 epoch + resume + 1 epoch: identical weights and losses (with dropout)."""
    cfg = _with(tiny_config(dropout=0.1, attention_dropout=0.1), epochs=2, log_every=1)
    full = train(cfg, tmp_path / "full")
    train(_with(cfg, max_steps=7), tmp_path / "split")  # stops mid-epoch
    resumed = train(cfg, tmp_path / "split", resume=True)
    assert resumed.step == full.step
    a = load_checkpoint(tmp_path / "full", which="latest")
    b = load_checkpoint(tmp_path / "split", which="latest")
    ma, mb = build_model(cfg.model, *(len(t.vocab) for t in a.tokenizers)), build_model(cfg.model, 12, 12)
    a.load_model_state(ma)
    b.load_model_state(mb)
    for (name, pa), pb in zip(ma.state_dict().items(), mb.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=0, rtol=0, msg=name)

    def losses(run):
        return [(r["step"], r["loss"]) for r in map(json.loads, (tmp_path / run / "metrics.jsonl").open())
                if r["kind"] == "train" and r["step"] > 7]

    assert losses("split") and all(
        x == pytest.approx(y, abs=1e-6) for x, y in zip(losses("split"), losses("full")))


@pytest.mark.slow
@pytest.mark.parametrize("limit", [{"max_steps": 5}, {"epochs": 1}, {"max_hours": 1e-9}, {"patience": 1}])
def test_resuming_a_run_that_reached_its_limit_changes_nothing(tmp_path, limit):
    """A finished run resumed with the same limit takes no update, evaluates nothing and writes nothing (a
    benchmark may resume every run it lists); raising the limit trains on from where it stopped."""
    unlimited = _with(tiny_config(), epochs=3, eval_every=2)
    cfg = _with(unlimited, **limit)
    first = train(cfg, tmp_path / "r")
    assert first.step < train(unlimited, tmp_path / "unlimited").step  # the limit stopped it
    files = {p: p.read_bytes() for p in sorted((tmp_path / "r").rglob("*")) if p.is_file()}
    again = train(cfg, tmp_path / "r", resume=True)
    assert (again.step, again.checkpoint, again.best) == (first.step, first.checkpoint, first.best)
    assert {p: p.read_bytes() for p in sorted((tmp_path / "r").rglob("*")) if p.is_file()} == files
    more = train(_with(cfg, max_steps=first.step + 2, epochs=3, max_hours=0.0, patience=0), tmp_path / "r",
                 resume=True)
    assert more.step == first.step + 2


def test_refuses_to_overwrite_and_survives_a_partial_write(tmp_path):
    cfg = _with(tiny_config(), epochs=1)
    train(cfg, tmp_path / "r")
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train(cfg, tmp_path / "r")
    root = tmp_path / "r" / "checkpoints"
    good = resolve_checkpoint(tmp_path / "r", "latest")
    # a crash mid-write leaves a temporary folder and an incomplete step folder: both are ignored
    (root / ".tmp-step_0999999-1").mkdir()
    (root / "step_0999999").mkdir()
    (root / "step_0999999" / "model.safetensors").write_bytes(b"garbage")
    assert resolve_checkpoint(tmp_path / "r", "latest") == good
    (root / "latest").unlink()
    assert resolve_checkpoint(tmp_path / "r", "latest") == good


def test_corrupt_and_foreign_checkpoints_are_rejected(tmp_path):
    cfg = _with(tiny_config(), epochs=1)
    train(cfg, tmp_path / "r")
    ckpt = load_checkpoint(tmp_path / "r")
    wrong = build_model(dataclasses.replace(cfg.model, d_model=64, d_ff=64), 12, 12)
    with pytest.raises(CheckpointError, match="has shape"):
        ckpt.load_model_state(wrong)
    (ckpt.path / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="cannot be read as safetensors"):
        ckpt.load_model_state(build_model(cfg.model, 12, 12))
    info = json.loads((ckpt.path / "trainer.json").read_text())
    (ckpt.path / "trainer.json").write_text(json.dumps({**info, "version": 99}))
    with pytest.raises(CheckpointError, match="newer than this tformer reads"):
        load_checkpoint(ckpt.path)
    (ckpt.path / "trainer.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not a tformer checkpoint"):
        load_checkpoint(ckpt.path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_train_config_validates():
    with pytest.raises(ValueError, match="train.max_tokens"):
        TrainConfig(max_tokens=0)


def test_resume_survives_a_metrics_record_cut_short_by_a_crash(tmp_path):
    cfg = _with(tiny_config(), epochs=2)
    train(_with(cfg, max_steps=5), tmp_path / "r")
    log = tmp_path / "r" / "metrics.jsonl"
    with open(log, "a") as f:
        f.write('{"kind": "train", "step": 6, "lo')  # the crash hit mid-write
    result = train(cfg, tmp_path / "r", resume=True)
    records = [json.loads(line) for line in log.read_text().splitlines()]  # every line parses
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # no step logged twice
    assert records[-1]["kind"] == "valid" and records[-1]["step"] == result.step


def test_patience_stops_when_validation_stops_improving(tmp_path):
    """With a learning rate of ~0 nothing improves after the first evaluation: patience 2 stops at the
    third evaluation, and the best checkpoint stays the first."""
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, schedule="constant", lr=1e-12, eval_every=1,
                                                             max_steps=50, patience=2, epochs=5))
    result = train(cfg, tmp_path / "run")
    valid = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    valid = [r for r in valid if r["kind"] == "valid"]
    assert result.step == 3 and [r["step"] for r in valid] == [1, 2, 3]
    assert (tmp_path / "run" / "checkpoints" / "best").read_text().strip() == "step_0000001"


def test_max_hours_stops_after_the_update_that_crosses_it(tmp_path):
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_hours=1e-9, epochs=3))
    result = train(cfg, tmp_path / "run")
    assert result.step == 1 and result.best is not None  # evaluated and saved before stopping


@pytest.mark.slow
def test_bf16_autocast_runs_the_forward_in_bf16_and_keeps_float32_state(tmp_path, monkeypatch):
    """Under autocast the generator's logits come out of a bf16 matmul (the loss then takes the whole-logits
    path and computes in float32), the weights and optimizer state stay float32, and the loss still falls."""
    import tformer.training.loss as loss_mod

    seen = []
    real = loss_mod.label_smoothed_nll_loss

    def spy(logits, *args):
        if torch.is_grad_enabled():  # training's loss (evaluation scores in float32, outside autocast)
            seen.append(logits.dtype)
        return real(logits, *args)

    monkeypatch.setattr(loss_mod, "label_smoothed_nll_loss", spy)
    cfg = _with(tiny_config(), epochs=3, lr=2.0, precision="bf16")
    train(cfg, tmp_path / "run")
    assert seen and set(seen) == {torch.bfloat16}
    ckpt = load_checkpoint(tmp_path / "run", which="latest")
    assert all(t.dtype == torch.float32 for t in load_file(str(ckpt.path / "model.safetensors")).values())
    assert all(t.dtype == torch.float32 for t in load_file(str(ckpt.path / "optimizer.safetensors")).values()
               if t.is_floating_point())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < losses[0] and all(map(math.isfinite, losses))


def test_fp16_scaler_skips_overflowing_updates_and_resumes_with_its_scale(tmp_path, monkeypatch):
    """A scale of 2^60 overflows fp16 gradients: those updates are skipped (weights unchanged) and the scale
    halves each time; the scale is saved in the checkpoint and a resume continues from it."""
    import tformer.training.loop as loop

    scaler_class = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device: scaler_class(device, init_scale=2.0**60))
    initial = {}
    real_build = loop.build_model

    def build(*args):
        model = real_build(*args)
        initial.update({k: v.clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(loop, "build_model", build)
    cfg = _with(tiny_config(), max_steps=3, log_every=1, precision="fp16")
    train(cfg, tmp_path / "run")
    ckpt = load_checkpoint(tmp_path / "run", which="latest")
    assert ckpt.trainer["grad_scaler"]["scale"] == 2.0**57  # three overflows
    saved = load_file(str(ckpt.path / "model.safetensors"))
    assert saved and all(torch.equal(saved[k], initial[k]) for k in saved)  # no update was applied
    train(_with(cfg, max_steps=4), tmp_path / "run", resume=True)
    again = load_checkpoint(tmp_path / "run", which="latest")
    assert again.trainer["step"] == 4 and again.trainer["grad_scaler"]["scale"] == 2.0**56


def test_teacher_forced_scores_in_row_chunks_equal_the_whole_logits(monkeypatch):
    """Evaluation builds the logits of a few positions at a time (memory: a 32k vocabulary's logits of a whole
    batch are hundreds of MiB); the sums equal label_smoothed_nll_loss and token_accuracy on whole logits."""
    from tformer import evaluation
    from tformer.metrics import token_accuracy
    from tformer.training.loss import label_smoothed_nll_loss

    cfg = tiny_config()
    model = build_model(cfg.model, 12, 12).eval()
    ex = [([4, 5, 6], [4, 5, 6, 7]), ([7, 8], [7, 8]), ([9, 10, 11, 4], [9, 10, 11, 4, 5]), ([5], [5])]
    b = collate(ex, range(4), Vocab.pad, Vocab.bos, Vocab.eos)
    with torch.no_grad():
        logits = model.generator(model(b.src, b.src_lengths, b.tgt_in, b.tgt_lengths).real())
    target = b.tgt_out[b.tgt_out != Vocab.pad]
    whole = label_smoothed_nll_loss(logits, target, cfg.train.label_smoothing, Vocab.pad)
    correct = token_accuracy(logits, target, Vocab.pad)[0]
    monkeypatch.setattr(evaluation, "EVAL_LOGITS", 12 * 3)  # 3 positions at a time
    got = evaluation.teacher_forced(model, ex, cfg)
    n = len(target)
    assert got["loss"] == pytest.approx(float(whole.loss) / n, rel=1e-5)
    assert got["nll"] == pytest.approx(float(whole.nll) / n, rel=1e-5)
    assert got["token_acc"] == correct / n


def test_reduced_precision_on_a_cpu_warns_only_without_its_units_and_names_them(caplog, monkeypatch):
    """bf16 needs AVX-512 BF16 or AMX-BF16, fp16 AVX-512 FP16 or AMX-FP16: a CPU with one of them runs
    autocast without a word; a CPU with none is warned, by flag name. Flags unreadable: no claim either way."""
    import logging

    import tformer.precision as policy
    import tformer.training.precision as precision

    assert precision.missing_cpu_units("bf16", {"avx2", "avx512f"}) == ("avx512_bf16", "amx_bf16")
    assert precision.missing_cpu_units("fp16", {"avx2", "avx512_bf16"}) == ("avx512_fp16", "amx_fp16")
    assert precision.missing_cpu_units("bf16", {"avx512_bf16"}) is None
    assert precision.missing_cpu_units("bf16", {"amx_bf16"}) is None
    assert precision.missing_cpu_units("fp16", {"amx_fp16"}) is None
    assert precision.missing_cpu_units("fp32", set()) is None
    monkeypatch.setattr(policy, "dispatch_cap", lambda p: None)  # kernels not capped (ATEN_CPU_CAPABILITY)
    for flags, warned in (({"avx2", "fma"}, True), ({"avx2", "avx512_bf16"}, False), (None, False)):
        monkeypatch.setattr(policy, "cpu_flags", lambda: flags)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tformer"):
            precision.Precision("bf16", torch.device("cpu"))
            precision.Precision("fp32", torch.device("cpu"))
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == warned, messages  # fp32 never warns
        want = "train.precision=bf16 on cpu: this CPU has no avx512_bf16 or amx_bf16 "
        assert all(m.startswith(want) for m in messages)


def test_a_run_stopped_by_a_limit_short_of_its_target_says_which_and_how_to_train_on(tmp_path, caplog):
    """3 updates cannot reach 100% exact: the result and the log name the limit, the validation score reached
    against the target, and the override that trains on."""
    cfg = _with(tiny_config(), max_steps=3, target_exact_match=1.0)
    with caplog.at_level("INFO", logger="tformer"):
        result = train(cfg, tmp_path / "run")
    assert result.step == 3 and not result.reached_target
    assert result.stopped_by == "train.max_steps=3"
    best = result.best["exact_match"]
    assert best < 1.0
    for words in ("train.max_steps=3 stopped the run at step 3", "short of train.target_exact_match=1",
                  f"best validation exact match {best:.4f}",
                  f"tformer.train(run_dir='{tmp_path / 'run'}', resume=True, overrides=['train.max_steps=6'])"):
        assert words in result.shortfall
    assert result.shortfall in [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    from tformer import train as train_api  # the advice, followed (in Python, as it is written), trains on

    assert train_api(None, tmp_path / "run", resume=True, overrides=["train.max_steps=6"]).step == 6


def test_a_run_without_a_target_stopped_by_a_limit_names_it_and_no_shortfall(tmp_path, caplog):
    with caplog.at_level("INFO", logger="tformer"):
        result = train(_with(tiny_config(), max_steps=4, max_hours=0.0), tmp_path / "run")
    assert (result.stopped_by, result.shortfall) == ("train.max_steps=4", "")
    assert any(m.startswith("train.max_steps=4 stopped the run at step 4") and "train.max_steps=8" in m
               for m in caplog.messages)


def test_the_time_estimate_counts_the_updates_to_the_limit_at_the_measured_speed():
    from tformer.training.limits import estimate

    t = TrainConfig(max_steps=2400, epochs=100, eval_every=200, target_exact_match=1.0)
    text = estimate(20, 2400, 38, 10.0, t, elapsed=5.0)  # 2,380 updates at 10/s: 238 s
    assert text.startswith("~2,380 updates to go (train.max_steps=2400), about 4 minutes at this machine's speed")
    assert "not included" in text and "train.target_exact_match=1" in text
    # 12 evaluations (at 200, 400, ..., 2400) of 30 s each: 598 s
    assert "about 10 minutes" in estimate(20, 2400, 38, 10.0, t, 5.0, eval_seconds=30.0)
    capped = estimate(20, 2400, 38, 10.0, dataclasses.replace(t, max_hours=0.01), elapsed=6.0)  # 30 s left
    assert capped.startswith("~300 updates to go (train.max_hours=0.01), about 30 seconds")


def test_the_time_estimate_is_told_once_after_the_first_updates(tmp_path, caplog, monkeypatch):
    from tformer.training.limits import Clock

    monkeypatch.setattr(Clock, "UPDATES", 3)
    with caplog.at_level("INFO", logger="tformer"):
        train(_with(tiny_config(), max_steps=12, max_hours=0.0), tmp_path / "run")
    told = [m for m in caplog.messages if "updates to go" in m]
    assert len(told) == 1 and told[0].startswith("~4 updates to go (train.max_steps=12)")  # after 5 + 3 updates


def test_the_copy_recipe_stops_by_updates_not_by_the_clock():
    """`tformer demo` trains the copy recipe: a slower or busier machine must get the same model, later. It
    stops at 100% validation exact or at train.max_steps, well above the updates a run needs (USUAL_UPDATES),
    and neither the clock nor the epochs stop it first."""
    from tformer.commands.demo import USUAL_UPDATES
    from tformer.config import Config
    from tformer.data import load_task
    from tformer.training.batches import Batches
    from tformer.training.distributed import Context

    cfg = Config.from_yaml("copy")
    t = cfg.train
    assert t.max_hours == 0 and t.target_exact_match == 1.0
    assert t.max_steps >= 1.5 * max(USUAL_UPDATES)
    examples = load_task(cfg.data, ("train",)).examples["train"]
    assert t.epochs * Batches(examples, cfg, Context()).per_epoch >= t.max_steps

