"""What ends a training run, told to its user: how long the limits leave at this machine's speed (once, after
the first updates), and when a limit stopped the run, which one, what validation reached against the target,
and the override that trains on.

A limit is named as its setting, the way the loop's `_limit` names it: 'train.max_steps=2400',
'train.epochs=60', 'train.max_hours=0.5', 'train.patience=5', 'train.target_exact_match=1'.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tformer.config import TrainConfig
from tformer.errors import invocation
from tformer.training.state import TrainerState


def raised(limit: str, t: TrainConfig) -> str:
    """The override that lets a run stopped by `limit` train on: that limit doubled (patience: off)."""
    key = limit.split("=")[0]
    return {"train.max_steps": f"train.max_steps={2 * t.max_steps}", "train.epochs": f"train.epochs={2 * t.epochs}",
            "train.max_hours": f"train.max_hours={2 * t.max_hours:g}", "train.patience": "train.patience=0"}[key]


def train_on(limit: str, t: TrainConfig, run_dir: Path) -> str:
    return "To train on from here: " + invocation("train", [raised(limit, t)], run_dir=run_dir, resume=True)


def shortfall(limit: str, t: TrainConfig, state: TrainerState, run_dir: Path) -> str:
    """Why a run with train.target_exact_match ended short of it, and how to train on ('' when it reached the
    target or has none). `limit`: the setting that stopped it ('' for Ctrl-C)."""
    best = state.best or {}
    if not t.target_exact_match or state.reached_target or best.get("exact_match", 0) >= t.target_exact_match:
        return ""  # (a resumed session judges the target afresh: its best validation may have reached it)
    reached = (f"best validation exact match {best['exact_match']:.4f} (step {state.best_step})"
               if "exact_match" in best else "no validation score yet")
    target = f"train.target_exact_match={t.target_exact_match:g}"
    if not limit:
        return (f"interrupted at step {state.step}, short of {target}: {reached}. To train on: "
                + invocation("train", run_dir=run_dir, resume=True))
    return f"{limit} stopped the run at step {state.step}, short of {target}: {reached}. " + train_on(limit, t, run_dir)


def stopped(limit: str, t: TrainConfig, state: TrainerState, run_dir: Path) -> str:
    """The line a run without a target ends with when a limit stopped it."""
    best = state.best or {}
    score = (f"BLEU {best['bleu']:.2f}" if "bleu" in best else f"CER {best['cer']:.2f}%" if "cer" in best
             else f"exact match {best['exact_match']:.4f}" if "exact_match" in best else "")
    reached = f" (best validation {score} at step {state.best_step})" if score else ""
    return f"{limit} stopped the run at step {state.step}{reached}. " + train_on(limit, t, run_dir)


class Clock:
    """The time a session has left, told once: after its first updates (the first WARMUP of them, slower while
    memory is allocated and the batches start, not timed), the updates left to the run's limit and how long they
    take at the speed measured. Evaluations are left out of that speed and, when one ran in the meantime, added
    back at its measured cost."""

    WARMUP = 5
    UPDATES, SECONDS = 20, 30.0  # it speaks after this many timed updates or this many seconds, whichever first

    def __init__(self, step: int, total: int, per_epoch: int) -> None:
        self.total, self.per_epoch = total, per_epoch  # total: the step at which max_steps or epochs ends the run
        self.start_step = step + self.WARMUP  # timing starts when the session's warm-up updates have ended
        self.start = 0.0
        self.eval_seconds, self.evals = 0.0, 0
        self.told = False

    def evaluated(self, seconds: float) -> None:
        if self.start:
            self.eval_seconds += seconds
            self.evals += 1

    def updated(self, step: int, t: TrainConfig, elapsed: float) -> str:
        """The estimate, at the update where it is due ('' before and after). `elapsed`: the run's seconds."""
        now = time.perf_counter()
        if self.told or step < self.start_step:
            return ""
        if step == self.start_step:
            self.start = now
            return ""
        timed = step - self.start_step
        seconds = now - self.start - self.eval_seconds
        if timed < self.UPDATES and (seconds < self.SECONDS or timed < 2):
            return ""
        self.told = True
        return estimate(step, self.total, self.per_epoch, timed / seconds, t, elapsed,
                        self.eval_seconds / self.evals if self.evals else None)


def estimate(step: int, total: int, per_epoch: int, per_second: float, t: TrainConfig, elapsed: float,
             eval_seconds: float | None = None) -> str:
    """'~N updates to go, about M minutes at this machine's speed': the updates from `step` to `total` (where
    train.max_steps or train.epochs ends the run; `per_epoch` updates an epoch) at `per_second` updates a second,
    plus the evaluations among them at `eval_seconds` each when known; train.max_hours, when it comes first,
    ends it sooner. `elapsed`: the run's seconds so far."""
    left = max(total - step, 0)
    seconds = left / per_second
    if t.eval_every:
        evals = total // t.eval_every - step // t.eval_every
        evals_note = f"an evaluation every {t.eval_every} updates"
    else:
        evals = -(-total // per_epoch) - step // per_epoch
        evals_note = "an evaluation every epoch"
    if eval_seconds is not None:
        seconds += evals * eval_seconds
        evals_note += f" ({eval_seconds:.0f} s each) included"
    else:
        evals_note += " not included"
    limit = f"train.max_steps={t.max_steps}" if t.max_steps and t.max_steps <= total else f"train.epochs={t.epochs}"
    cap = t.max_hours * 3600 - elapsed if t.max_hours else math.inf
    if cap < seconds:
        left, seconds = min(left, int(max(cap, 0) * per_second)), max(cap, 0)
        limit = f"train.max_hours={t.max_hours:g}"
    text = (f"~{left:,} updates to go ({limit}), about {duration(seconds)} at this machine's speed "
            f"({per_second:.1f} updates/s; {evals_note})")
    if t.target_exact_match:
        text += f"; sooner if validation reaches train.target_exact_match={t.target_exact_match:g}"
    return text


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} seconds"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"
