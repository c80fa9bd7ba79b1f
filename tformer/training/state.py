"""What a training run has done so far, in one place: the loop advances it, a checkpoint's trainer.json holds
it field for field (the weights, the optimizer's moments and every process's random state travel beside it
in the checkpoint's safetensors files), and `--resume` starts from it.

The data cursor is (epoch, cursor): the batch order of an epoch is a function of (seed, epoch), so the
updates already taken in it are all a resume needs to continue with the next batch. The kinds of trainer.json's
values, and how validations rank (`validation_key`), are the run-folder format's own (tformer.checkpoint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.checkpoint import Checkpoint, check_fields

LEGACY_NAMES = {"update_in_epoch": "cursor"}  # trainer.json keys of earlier versions -> field


@dataclass
class TrainerState:
    step: int = 0  # optimizer updates taken (skipped ones included)
    epoch: int = 0
    cursor: int = 0  # updates taken in this epoch: the next one is batch group `cursor` of the epoch's order
    elapsed: float = 0.0  # wall seconds over every session of the run, evaluations included
    best: dict[str, Any] | None = None  # validation metrics of the best checkpoint
    best_step: int | None = None
    reached_target: bool = False  # judged afresh by each session (not restored)
    bad_evals: int = 0  # evaluations in a row without a better validation score (train.patience)
    bad_updates: int = 0  # NaN/inf updates in a row (train.max_bad_updates)
    skipped_updates: int = 0  # NaN/inf updates in all
    grad_scaler: dict[str, Any] | None = None  # fp16's loss scale
    ema_updates: int = 0  # updates averaged into the weights' moving average (train.ema; it sets the ramp)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def advance(self, updates_per_epoch: int) -> None:
        """One update taken: the step and the cursor move; the epoch turns when the cursor reaches its end."""
        self.step += 1
        self.cursor += 1
        if self.cursor >= updates_per_epoch:
            self.epoch += 1
            self.cursor = 0

    @classmethod
    def of(cls, ckpt: Checkpoint) -> "TrainerState":
        """Where the run stood when `ckpt` was written (its trainer.json)."""
        return cls.from_json(ckpt.trainer, ckpt.path / "trainer.json")

    @classmethod
    def from_json(cls, info: dict[str, Any], file: Path | str = "trainer.json") -> "TrainerState":
        """The state a trainer.json records (earlier versions' key names too); a value of the wrong kind is a
        CheckpointError naming the key as written in `file`."""
        check_fields(info, file)
        values = {LEGACY_NAMES.get(k, k): v for k, v in info.items()}
        state = cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
        state.reached_target = False
        return state

