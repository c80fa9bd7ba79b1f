"""Checkpoint averaging by validation rank: each checkpoint records its own validation, train.keep_best keeps
the best ones besides the last, and `tformer average --best N` averages exactly the N best (oracle: the run's
metrics.jsonl ranked by the same rule)."""

import dataclasses
import json

import pytest
import torch

from tformer.checkpoint import list_checkpoints, load_checkpoint, validation_key
from tformer.cli import main
from tformer.training.average import best_checkpoints
from tformer.training.loop import train

from helpers.models import tiny_config


def test_keep_best_keeps_the_best_validated_and_average_best_takes_them(tmp_path, capsys):
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=3, eval_every=4, keep_last=1,
                                                             keep_best=3))
    train(cfg, tmp_path / "run")
    valid = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open()) if r["kind"] == "valid"]
    assert len(valid) >= 6
    oracle = sorted(valid, key=lambda r: (validation_key(r), -r["step"]), reverse=True)[:3]  # earlier step wins ties
    want = sorted(f"step_{r['step']:07d}" for r in oracle)
    kept = {p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")}
    assert set(want) <= kept and len(kept) <= 3 + 2  # the best 3, the last, the best pointer (one of the 3)
    assert [p.name for p in best_checkpoints(tmp_path / "run", 3)] == want
    for name in want:  # each checkpoint carries its own validation
        assert load_checkpoint(tmp_path / "run" / "checkpoints" / name).trainer["valid"]["loss"] == pytest.approx(
            next(r["loss"] for r in valid if f"step_{r['step']:07d}" == name), abs=1e-6)
    assert main(["average", "--run-dir", str(tmp_path / "run"), "--best", "3", "--out", str(tmp_path / "avg")]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in want)
    got = load_checkpoint(tmp_path / "avg").weights()
    for k, v in got.items():
        mean = sum(load_checkpoint(tmp_path / "run" / "checkpoints" / n).weights()[k].double() for n in want) / 3
        torch.testing.assert_close(v.double(), mean, rtol=0, atol=1e-6, msg=k)
    assert main(["average", "--run-dir", str(tmp_path / "run"), "--best", "9", "--out", str(tmp_path / "x")]) == 2
    assert "fewer than the 9 asked for" in capsys.readouterr().err
    assert main(["average", "--run-dir", str(tmp_path / "run"), "--best", "2", "--last", "2",
                 "--out", str(tmp_path / "y")]) == 2
