"""`train.precision`: the forward pass under autocast in bf16 or fp16, with fp16's dynamic gradient scaler. The
formats and the device checks are the shared policy of tformer.precision (decoding refuses what training warns
about: a training run may want to test a configuration on a small machine)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from tformer import precision as policy
from tformer.precision import (CPU_UNITS, EMULATED, cpu_flags, missing_cpu_units,  # noqa: F401 (re-exported)
                               unsupported)

log = logging.getLogger("tformer")


def cpu_choice(precision: str, flags: set[str] | None = None) -> str:
    """What training on this CPU does in `precision`, and whether the CPU has bf16 units (for the log)."""
    flags = policy.cpu_flags() if flags is None else flags
    if flags is None:
        return f"{'fp32 throughout' if precision == 'fp32' else 'autocast'} (this CPU's flags cannot be read)"
    has = [u for u in CPU_UNITS["bf16"] if u in flags]
    if precision == "fp32":
        return ("fp32 throughout; this CPU has bf16 units (" + ", ".join(has) + "): train.precision=bf16 would "
                "run the products in bf16" if has else
                f"fp32 throughout; this CPU has no bf16 units ({' or '.join(CPU_UNITS['bf16'])})")
    units = [u for u in CPU_UNITS[precision] if u in flags]
    return (f"the forward under autocast in {precision} on this CPU's {', '.join(units)} units; weights, gradients "
            "and the optimizer in fp32, the loss in fp32")


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
                        "slower than fp32 (%s); use train.precision=fp32 here", precision, device.type, why,
                        precision, EMULATED)
        elif device.type == "cpu":
            log.info("train.precision=%s: %s", precision, cpu_choice(precision))

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def state(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
