"""`train.precision`: the forward pass under autocast in bf16 or fp16, with fp16's dynamic gradient scaler. The
formats and the device checks are the shared policy of tformer.precision (decoding refuses what training warns
about: a training run may want to test a configuration on a small machine)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from tformer.precision import CPU_UNITS, cpu_flags, missing_cpu_units, unsupported  # noqa: F401 (re-exported)

log = logging.getLogger("tformer")


class Precision:
    """`train.precision` on a device: the autocast context of the forward pass and, for fp16, the gradient
    scaler (the loss is multiplied by its scale before backward, the gradients divided by it before clipping;
    a step whose gradients overflowed is skipped and the scale lowered)."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.device = device
        self.dtype = dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        why = unsupported(precision, device) if precision in ("bf16", "fp16") else None
        if why:
            log.warning("train.precision=%s on %s: %s; autocast runs, but its %s matrix products are emulated, far "
                        "slower than fp32 (about 200x measured on an AVX2 CPU); use train.precision=fp32 here",
                        precision, device.type, why, precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def state(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
