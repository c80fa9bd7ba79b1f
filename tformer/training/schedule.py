"""Learning-rate schedules as pure functions of the optimizer update number `step` (1-based)."""

from __future__ import annotations

import math

from tformer.config import TrainConfig


def noam(step: int, d_model: int, factor: float, warmup: int) -> float:
    """factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up, peak at `warmup`,
    then decay with the inverse square root of the step (the paper, eq. 3)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` at `warmup`, then peak * sqrt(warmup / step) (fairseq's inverse_sqrt)."""
    step = max(step, 1)
    if step < warmup:
        return peak * step / warmup
    return peak * math.sqrt(max(warmup, 1) / step)


def learning_rate(step: int, cfg: TrainConfig, d_model: int) -> float:
    if cfg.schedule == "noam":
        return noam(step, d_model, cfg.lr, cfg.warmup)
    if cfg.schedule == "inverse_sqrt":
        return inverse_sqrt(step, cfg.lr, cfg.warmup)
    return cfg.lr
