"""An exponential moving average of the weights (`train.ema`), kept beside the raw weights.

After every update that is taken (a skipped NaN/inf update changes nothing), each floating-point tensor of
the model's state moves towards the new weights:

    ema = d * ema + (1 - d) * weights,     d = min(train.ema, (1 + n) / (10 + n))

n counting the updates averaged so far: the ramp (TensorFlow's ExponentialMovingAverage with num_updates)
keeps the first updates, when the average would otherwise still be the random initialisation, from
dominating it. The average is float32 whatever train.precision is, lives on the model's device, and is saved
in each checkpoint as ema.safetensors; validation scores it (and the raw weights), the best checkpoint is
chosen by it, and inference loads it (tformer.checkpoint.Checkpoint.load_model_state).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch
from torch import Tensor, nn

from tformer.checkpoint import Checkpoint, unique_state
from tformer.errors import CheckpointError
from tformer.training.state import TrainerState

log = logging.getLogger("tformer")


class EMA:
    def __init__(self, model: nn.Module, decay: float, tensors: dict[str, Tensor] | None = None,
                 updates: int = 0) -> None:
        """Start from `model`'s weights, or from `tensors` (a checkpoint's ema.safetensors) after `updates`."""
        self.decay, self.updates = decay, updates
        state = unique_state(model) if tensors is None else tensors
        device = next(model.parameters()).device
        self.tensors = {k: v.detach().to(device=device, copy=True) for k, v in state.items()}
        self._live = {k: v for k, v in model.state_dict(keep_vars=True).items() if k in self.tensors}

    @classmethod
    def resume(cls, model: nn.Module, decay: float, ckpt: Checkpoint | None) -> "EMA":
        """The average a resumed run's checkpoint saved (checked against `model`), else one started from
        `model`'s weights now (a fresh run, or a checkpoint written without train.ema)."""
        if ckpt is None or not ckpt.has_ema:
            if ckpt is not None:
                log.warning("%s holds no moving average of the weights: train.ema starts from its weights now",
                            ckpt.path)
            return cls(model, decay)
        tensors, expected = ckpt.weights("ema"), unique_state(model)
        if tensors.keys() != expected.keys() or any(tensors[k].shape != v.shape for k, v in expected.items()):
            raise CheckpointError(f"{ckpt.weights_file('ema')}: its tensors do not fit the model (a damaged or "
                                  "tampered file); resume from an earlier checkpoint")
        return cls(model, decay, tensors, TrainerState.of(ckpt).ema_updates)

    def rate(self) -> float:
        """The decay of the next update."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        d = self.rate()
        for name, avg in self.tensors.items():
            live = self._live[name]
            if avg.is_floating_point():
                avg.lerp_(live.detach().to(avg.dtype), 1.0 - d)  # avg + (1 - d) * (live - avg)
            else:
                avg.copy_(live)
        self.updates += 1

    def state(self) -> dict[str, Tensor]:
        """What a checkpoint saves (ema.safetensors): the averaged tensors, on the CPU."""
        return {k: v.cpu().contiguous() for k, v in self.tensors.items()}

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """`model` holds the averaged weights inside the block and its own weights again after it."""
        raw = {k: v.detach().clone() for k, v in self._live.items()}
        try:
            for k, v in self._live.items():
                v.copy_(self.tensors[k])
            yield
        finally:
            for k, v in self._live.items():
                v.copy_(raw[k])
