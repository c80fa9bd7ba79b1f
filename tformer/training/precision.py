"""`train.precision`: the forward pass under autocast in bf16 or fp16, with fp16's dynamic gradient scaler."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

log = logging.getLogger("tformer")


# CPU instruction sets with native matrix products in each reduced precision (any one suffices), as
# /proc/cpuinfo names them: AVX-512 BF16 (Intel Cooper Lake and later, AMD Zen 4 and later) or AMX;
# AVX-512 FP16 or AMX-FP16 (Intel Sapphire Rapids and later, Granite Rapids)
CPU_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags from /proc/cpuinfo (Linux); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_cpu_units(precision: str, flags: set[str] | None = None) -> tuple[str, ...] | None:
    """The CPU flags `precision` ("bf16"/"fp16") would need, when this CPU has none of them; None when it has
    one, when the precision needs none, or when the flags cannot be read (then nothing is claimed)."""
    flags = cpu_flags() if flags is None else flags
    units = CPU_UNITS.get(precision)
    if units is None or flags is None or any(u in flags for u in units):
        return None
    return units


class Precision:
    """`train.precision` on a device: the autocast context of the forward pass and, for fp16, the gradient
    scaler (the loss is multiplied by its scale before backward, the gradients divided by it before clipping;
    a step whose gradients overflowed is skipped and the scale lowered)."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.device = device
        self.dtype = dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        missing = missing_cpu_units(precision) if device.type == "cpu" else None
        if missing:
            log.warning("train.precision=%s on a CPU without %s: autocast runs, but its %s matrix products are "
                        "computed without native units, far slower than fp32 (about 200x measured on an AVX2 CPU); "
                        "use train.precision=fp32 here", precision,
                        " or ".join(missing), precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def state(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
