"""Attention recorded over training equals the attention of the checkpoint of that step; GIFs have a frame per
recording; curves and TensorBoard hold exactly the logged numbers; resume drops what it will redo."""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from tformer.cli import main
from tformer.data import load_task
from tformer.inference import load_model
from tformer.training.loop import train
from tformer.viz.attention import KINDS, attention_maps
from tformer.viz.curves import plot_curves
from tformer.viz.record import animate_attention, animate_head_grid, animate_steps, load_recording

from helpers.models import tiny_config


def _with(cfg, **train):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rec") / "run"
    cfg = _with(tiny_config(), attention_examples=2, eval_every=20, max_steps=60, epochs=20, keep_last=10, tensorboard=True,
                log_every=10)
    train(cfg, run_dir)
    return run_dir, cfg


def test_recorded_attention_is_the_attention_of_that_steps_checkpoint(run):
    run_dir, cfg = run
    rec = load_recording(run_dir)
    assert rec.steps == [0, 20, 40, 60] and rec.n_examples == 2
    valid = load_task(cfg.data, ("valid",)).examples["valid"][:2]
    for step, frame in zip(rec.steps[1:], rec.maps[1:]):
        _, model = load_model(str(run_dir / "checkpoints" / f"step_{step:07d}"))
        want = attention_maps(model, valid)
        for got, ref in zip(frame, want):
            for kind in KINDS:
                np.testing.assert_allclose(got.weights[kind], ref.weights[kind], atol=2e-3)  # stored as float16
    first, last = rec.maps[0][0].weights["cross"], rec.maps[-1][0].weights["cross"]
    assert not np.allclose(first, last, atol=1e-2)  # training changed what the decoder looks at
    src, tgt = valid[0]
    assert rec.maps[0][0].source[-1] == "</s>" and len(rec.maps[0][0].source) == len(src) + 1
    assert rec.maps[0][0].target_out == rec.maps[-1][0].target_out and len(rec.maps[0][0].target_out) == len(tgt) + 1


def test_gifs_have_one_frame_per_recorded_step(run, tmp_path):
    run_dir, _ = run
    rec = load_recording(run_dir)
    one = Image.open(animate_attention(rec, 1, "cross", 1, 2, tmp_path / "one.gif", ms_per_frame=100))
    grid = Image.open(animate_head_grid(rec, 0, "encoder", 0, tmp_path / "grid.gif"))
    for gif in (one, grid):
        assert gif.n_frames == len(rec.steps) and gif.info["loop"] == 0
    one.seek(0)
    a = np.asarray(one.convert("RGB"))
    one.seek(one.n_frames - 1)
    assert not np.array_equal(a, np.asarray(one.convert("RGB")))
    with pytest.raises(ValueError, match="4 heads"):
        animate_attention(rec, 0, "cross", 0, 4, tmp_path / "x.gif")
    with pytest.raises(ValueError, match="2 examples"):
        animate_attention(rec, 5, "cross", 0, 0, tmp_path / "x.gif")
    with pytest.raises(ValueError, match="not a universal transformer"):
        animate_steps(rec, 0, tmp_path / "x.gif")


def test_universal_transformer_records_step_counts(tmp_path):
    cfg = _with(tiny_config(kind="universal", max_steps=3), attention_examples=1, eval_every=15, max_steps=30, epochs=20)
    train(cfg, tmp_path / "ut")
    rec = load_recording(tmp_path / "ut")
    _, model = load_model(str(tmp_path / "ut" / "checkpoints" / "step_0000030"))
    valid = load_task(cfg.data, ("valid",)).examples["valid"][:1]
    assert rec.maps[-1][0].steps == attention_maps(model, valid)[0].steps
    assert rec.maps[-1][0].layer_name == "step"
    gif = Image.open(animate_steps(rec, 0, tmp_path / "steps.gif"))
    assert gif.n_frames == len(rec.steps) == 3


def test_curves_are_drawn_from_the_metrics_log(run, tmp_path):
    run_dir, _ = run
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fig, panels = plot_curves(run_dir, tmp_path / "c")
    train_rows = [r for r in records if r["kind"] == "train"]
    valid_rows = [r for r in records if r["kind"] == "valid"]
    assert panels["learning rate"]["lr"] == ([r["step"] for r in train_rows], [r["lr"] for r in train_rows])
    assert panels["loss (label-smoothed, per token)"]["validation"][1] == [r["loss"] for r in valid_rows]
    assert panels["validation score"]["exact match"][1] == [r["exact_match"] for r in valid_rows]
    drawn = fig.axes[0].get_lines()[0].get_ydata().tolist()
    assert drawn == [r["loss"] for r in train_rows]
    assert (tmp_path / "c.png").exists() and (tmp_path / "c.svg").exists()


def test_tensorboard_events_hold_the_logged_numbers(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/loss")
    want = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    assert [e.step for e in events] == [s for s, _ in want]
    np.testing.assert_allclose([e.value for e in events], [v for _, v in want], rtol=1e-6)
    assert [e.step for e in acc.Scalars("valid/exact_match")] == [20, 40, 60]


def test_resume_drops_recordings_after_its_checkpoint(tmp_path):
    cfg = _with(tiny_config(), attention_examples=1, eval_every=20, max_steps=40, epochs=20, keep_last=10)
    train(cfg, tmp_path / "r")
    stray = tmp_path / "r" / "attention" / "step_0000050.safetensors"  # as if a crash came after recording
    stray.write_bytes((tmp_path / "r" / "attention" / "step_0000040.safetensors").read_bytes())
    train(_with(cfg, max_steps=60), tmp_path / "r", resume=True)
    assert load_recording(tmp_path / "r").steps == [0, 20, 40, 60]


def test_commands_write_pictures_and_explain_missing_recordings(run, tmp_path, capsys):
    run_dir, _ = run
    assert main(["animate", str(run_dir), "--kind", "cross", "--head", "0", "--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["ex0_cross_layer0_head0.gif",
                                                                "ex0_cross_layer1_head0.gif"]
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "curves.png").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    capsys.readouterr()
    assert main(["animate", str(empty)]) == 2
    assert "train.attention_examples" in capsys.readouterr().err
    assert main(["plot", str(empty)]) == 2
    (empty / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 2.0}\nnot json\n{"kind": "tr')
    assert main(["plot", str(empty)]) == 2
    assert "metrics.jsonl:2: not a JSON record" in capsys.readouterr().err
