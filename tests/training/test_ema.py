"""train.ema: the moving average against its formula written out, swapped in and out exactly, checkpointed
beside the raw weights, validated with them, loaded for inference, and continued exactly on resume."""

import dataclasses
import json
import logging

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.checkpoint import load_checkpoint, unique_state
from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.model import build_model
from tformer.training.ema import EMA
from tformer.training.loop import train
from tformer.training.state import TrainerState

from helpers.models import tiny_config


def _with(cfg, **train_fields):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_fields))


def test_the_average_follows_its_formula_with_the_ramp_and_swaps_in_and_out_exactly():
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=8, n_heads=2, d_ff=16, encoder_layers=1, decoder_layers=1), 7, 7)
    name = "generator.bias"
    start = model.state_dict()[name].clone()
    ema = EMA(model, decay=0.9)
    want = start.double()
    for n, value in enumerate([1.0, -2.0, 0.5, 3.0]):
        with torch.no_grad():
            model.generator.bias.fill_(value)
        d = min(0.9, (1 + n) / (10 + n))  # 0.1, 2/11, 0.25, 4/13: the ramp, below 0.9 throughout
        want = d * want + (1 - d) * value
        ema.update()
    assert ema.updates == 4
    torch.testing.assert_close(ema.tensors[name].double(), want, rtol=0, atol=1e-6)
    raw = {k: v.clone() for k, v in unique_state(model).items()}
    with ema.swapped_in(model):
        torch.testing.assert_close(model.generator.bias.detach(), ema.tensors[name], rtol=0, atol=0)
    for k, v in unique_state(model).items():
        torch.testing.assert_close(v, raw[k], rtol=0, atol=0, msg=k)
    assert EMA(model, 0.999, updates=10_000).rate() == 0.999  # past the ramp: the decay itself


def test_a_run_with_ema_validates_both_checkpoints_both_and_translates_with_the_average(tmp_path):
    cfg = _with(tiny_config(), epochs=2, ema=0.9)
    train(cfg, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert valid and all("exact_match" in r and "raw_exact_match" in r and "raw_loss" in r for r in valid)
    assert any(r["loss"] != r["raw_loss"] for r in valid)  # two sets of weights, two evaluations
    ckpt = load_checkpoint(tmp_path / "run", which="latest")
    assert ckpt.has_ema and TrainerState.of(ckpt).ema_updates == TrainerState.of(ckpt).step
    average, raw = ckpt.weights("ema"), ckpt.weights("raw")
    assert average.keys() == raw.keys() and any(not torch.equal(average[k], raw[k]) for k in raw)
    translator = tformer.load(tmp_path / "run", which="latest")  # inference: the average
    for k, v in unique_state(translator.model).items():
        torch.testing.assert_close(v, average[k], rtol=0, atol=0, msg=k)


def test_resume_continues_the_average_exactly(tmp_path):
    cfg = _with(tiny_config(dropout=0.1), epochs=2, ema=0.95, log_every=1)
    full = train(cfg, tmp_path / "full")
    train(_with(cfg, max_steps=7), tmp_path / "split")  # stops mid-epoch
    train(cfg, tmp_path / "split", resume=True)
    a = load_checkpoint(tmp_path / "full", which="latest")
    b = load_checkpoint(tmp_path / "split", which="latest")
    assert TrainerState.of(a).step == TrainerState.of(b).step == full.step and TrainerState.of(a).ema_updates == TrainerState.of(b).ema_updates
    for k, v in a.weights("ema").items():
        torch.testing.assert_close(b.weights("ema")[k], v, rtol=0, atol=0, msg=k)


def test_resuming_a_run_saved_without_an_average_starts_one_and_says_so(tmp_path, caplog):
    cfg = _with(tiny_config(), epochs=2)
    train(_with(cfg, max_steps=5), tmp_path / "run")
    assert not load_checkpoint(tmp_path / "run", which="latest").has_ema
    with caplog.at_level(logging.WARNING, logger="tformer"):
        train(_with(cfg, ema=0.9), tmp_path / "run", resume=True)
    assert "holds no moving average of the weights" in caplog.text
    ckpt = load_checkpoint(tmp_path / "run", which="latest")
    assert ckpt.has_ema and 0 < TrainerState.of(ckpt).ema_updates < TrainerState.of(ckpt).step


def test_bad_ema_settings_and_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="train.ema"):
        _with(tiny_config(), ema=1.0)
    cfg = _with(tiny_config(), epochs=1, ema=0.9)
    train(_with(cfg, max_steps=3), tmp_path / "run")
    ckpt = load_checkpoint(tmp_path / "run", which="latest")
    tensors = load_file(str(ckpt.weights_file("ema")))
    name = next(iter(tensors))
    tensors[name] = tensors[name][:1].clone()  # a tensor of the wrong shape
    from safetensors.torch import save_file

    save_file(tensors, str(ckpt.weights_file("ema")))
    with pytest.raises(tformer.TformerError, match="ema.safetensors: its tensors do not fit the model"):
        train(_with(cfg, max_steps=6), tmp_path / "run", resume=True)
    no_average = load_checkpoint(tmp_path / "run", which="latest")
    (no_average.path / "ema.safetensors").unlink()
    with pytest.raises(tformer.TformerError, match="holds no ema.safetensors"):
        no_average.weights("ema")


def test_averaging_checkpoints_of_an_ema_run_averages_their_moving_averages(tmp_path):
    from tformer.training.average import average_checkpoints

    cfg = _with(tiny_config(), epochs=2, ema=0.9, keep_last=5)
    train(cfg, tmp_path / "run")
    paths = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))[-2:]
    out = average_checkpoints(paths, tmp_path / "avg")
    got = load_checkpoint(out).weights()
    for k, v in got.items():
        want = sum(load_checkpoint(p).weights("ema")[k].double() for p in paths) / 2
        torch.testing.assert_close(v.double(), want, rtol=0, atol=1e-6, msg=k)
