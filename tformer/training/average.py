"""Checkpoint averaging (`tformer average`): the element-wise mean of several checkpoints' weights, written
as a new checkpoint folder that `evaluate` and `translate` read like any other (it has no optimizer
state, so it cannot be resumed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from tformer.checkpoint import (FORMAT, FORMAT_VERSION, CheckpointError, list_checkpoints, load_checkpoint,
                                ranked_checkpoints, resolve_checkpoint)
from tformer.model.transformer import upgrade_state


def _checkpoints_folder(run_dir: str | Path) -> Path:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        raise CheckpointError(f"{run_dir} is not a run folder (no checkpoints/ inside)")
    return root


def best_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The `n` best-validated checkpoints of a run (`ranked_checkpoints`), in step order."""
    root = _checkpoints_folder(run_dir)
    ranked = ranked_checkpoints(root)
    if len(ranked) < n:
        raise CheckpointError(f"{root} holds {len(ranked)} validated checkpoints, fewer than the {n} asked for "
                              "(train.keep_best keeps the best ones besides the last train.keep_last)")
    return sorted(ranked[:n])


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    root = _checkpoints_folder(run_dir)
    found = list_checkpoints(root)
    if len(found) < n:
        raise CheckpointError(f"{root} holds {len(found)} complete checkpoints, fewer than the {n} asked for "
                              "(train.keep_last decides how many a run keeps)")
    return found[-n:]


def average_checkpoints(paths: list[str | Path], out: str | Path) -> Path:
    """Average the weights of `paths` (checkpoint folders of one model) into the new folder `out`: the weights
    inference would load from each, i.e. its moving average (ema.safetensors, train.ema) where it has one."""
    if len(paths) < 1:
        raise CheckpointError("nothing to average: give at least one checkpoint")
    ckpts = [load_checkpoint(resolve_checkpoint(p)) for p in paths]
    first = ckpts[0]
    total: dict[str, torch.Tensor] = {}
    for c in ckpts:
        if c.cfg.model != first.cfg.model or c.tokenizers[0].fingerprint() != first.tokenizers[0].fingerprint() \
                or c.tokenizers[1].fingerprint() != first.tokenizers[1].fingerprint():
            raise CheckpointError(f"{c.path} and {first.path} are different models (model settings or "
                                  "vocabularies differ); only checkpoints of one run can be averaged")
        tensors = upgrade_state(c.weights())  # what inference loads: the moving average where there is one
        if total and set(tensors) != set(total):
            raise CheckpointError(f"{c.path} holds different tensors than {first.path}")
        for k, v in tensors.items():
            total[k] = total[k] + v.double() if k in total else v.double()
    mean = {k: (v / len(ckpts)).to(torch.float32).contiguous() for k, v in total.items()}
    out = Path(out)
    if out.exists():
        raise CheckpointError(f"{out} already exists; choose a new output folder")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(mean, str(tmp / "model.safetensors"), metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
    for f in first.path.iterdir():
        if f.name in ("config.yaml",) or f.name.startswith(("vocab.", "spm.")):
            shutil.copy2(f, tmp / f.name)
    info = {"format": FORMAT, "version": FORMAT_VERSION, "step": max(c.trainer["step"] for c in ckpts),
            "averaged_from": [str(c.path) for c in ckpts]}
    (tmp / "trainer.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    os.rename(tmp, out)
    return out
