"""`train.precision`: the forward pass under autocast in bf16 or fp16, with fp16's dynamic gradient scaler."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

log = logging.getLogger("tformer")


class Precision:
    """`train.precision` on a device: the autocast context of the forward pass and, for fp16, the gradient
    scaler (the loss is multiplied by its scale before backward, the gradients divided by it before clipping;
    a step whose gradients overflowed is skipped and the scale lowered)."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.device = device
        self.dtype = dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        if dtype is not None and device.type == "cpu":
            log.warning("train.precision=%s on a CPU: autocast runs, but CPUs without %s units compute it "
                        "far slower than fp32 (measured ~200x on AVX2); meant for GPUs", precision, precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def state(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
