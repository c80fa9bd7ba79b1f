"""What a training run reports as it goes: RUN_DIR/metrics.jsonl, one JSON record per line (what `tformer plot`
reads), the same numbers as TensorBoard events (train.tensorboard), and the progress bar or the log.

    {"kind": "train", "step": 100, "epoch": 0, "lr": ..., "loss": ..., "nll": ..., "token_acc": ...,
     "tok_per_s": ..., "elapsed": ...}                 every train.log_every updates: averages since the last
    {"kind": "valid", "step": 500, "loss": ..., "bleu": ..., ...}     every validation (tformer.training.validation)

Only the first process of a torchrun job writes. A resumed run first drops the records written after the
checkpoint it starts from: those steps run again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

from tqdm import tqdm  # the text bar: tqdm.auto warns in a notebook without ipywidgets

from tformer.errors import ConfigError, TrainingError, option

log = logging.getLogger("tformer")


class Window:
    """Sums over the updates since the last log line (tformer.training.step.take_update adds to them)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = self.seconds = self.ponder = 0.0
        self.correct = self.src = self.tgt = self.positions = self.skipped = 0

    def flush(self) -> dict[str, float]:
        """The averages since the last flush over the updates taken (skipped ones count only in 'skipped');
        then start a new window."""
        out = {"loss": self.loss / self.tgt, "nll": self.nll / self.tgt, "token_acc": self.correct / self.tgt,
               "tok_per_s": (self.src + self.tgt) / self.seconds}
        if self.positions:
            out["ponder"] = self.ponder / self.positions  # mean ACT steps per position
        if self.skipped:
            out["skipped"] = self.skipped  # updates skipped for a NaN/inf loss or gradient
        self.reset()
        return out


class RunLog:
    """metrics.jsonl (and TensorBoard's events with `tensorboard`) of one session of a run, opened for appending
    by `with`. `main`: this process writes (the first of a torchrun job); the others' `write` does nothing.
    `resumed_step`: the step a resumed (or restarted) run starts from; what was recorded after it is dropped."""

    def __init__(self, run_dir: Path, main: bool, tensorboard: bool, resumed_step: int | None) -> None:
        self.path, self.main = run_dir / "metrics.jsonl", main
        self.board_dir = run_dir / "tensorboard" if tensorboard and main else None
        self.resumed_step = resumed_step
        self.file = self.board = None
        if main and resumed_step is not None:
            truncate_metrics(self.path, resumed_step)

    def __enter__(self) -> "RunLog":
        if self.board_dir is not None:  # a resume drops the events after its checkpoint
            purge_step = None if self.resumed_step is None else self.resumed_step + 1
            self.board = summary_writer_class()(str(self.board_dir), purge_step=purge_step)
        if self.main:
            self.file = open(self.path, "a", encoding="utf-8")
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()

    def write(self, record: dict[str, Any]) -> None:
        """One record (its 'kind' and 'step' name the TensorBoard series and the x value of its numbers)."""
        if not self.main:
            return
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as e:
            raise TrainingError(f"could not write {self.path} at step {record['step']} ({e.strerror or e}); the "
                                f"last checkpoint is intact: free space and continue with {option('resume', True)}"
                                ) from None
        if self.board is not None:
            for key, value in record.items():
                if key not in ("kind", "step") and isinstance(value, (int, float)):
                    self.board.add_scalar(f"{record['kind']}/{key}", value, record["step"])
            self.board.flush()


def show(record: dict[str, Any], bar: tqdm, to_log: bool) -> None:
    """A train record on the progress bar and, `to_log` (no bar to read it on), as a log line."""
    ponder = {"ponder": f"{record['ponder']:.2f}"} if "ponder" in record else {}
    bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['token_acc']:.3f}", lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tok_per_s']:.0f}", **ponder, refresh=False)
    if to_log:
        steps = f"  ponder {record['ponder']:.2f} steps" if "ponder" in record else ""
        log.info("step %d  epoch %d  loss %.4f  token acc %.4f  lr %.2e  %.0f tok/s%s", record["step"],
                 record["epoch"], record["loss"], record["token_acc"], record["lr"], record["tok_per_s"], steps)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records written after the checkpoint a resume starts from: those steps will run again."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a record cut short by a crash mid-write
            continue
        if record.get("step", 0) <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(path)


def summary_writer_class():
    """TensorBoard's SummaryWriter; a ConfigError saying what to install when the package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.tensorboard=true needs the tensorboard package: pip install tensorboard "
                          "(or leave it off: metrics.jsonl and `tformer plot RUN_DIR` need nothing more)") from None
    return SummaryWriter


def bar(progress: bool | None) -> bool:
    """A progress bar or log lines: `progress` when given, else as the command line chooses (a bar when stderr
    is a terminal), or in a notebook (which shows tqdm's bar)."""
    if progress is not None:
        return progress
    return sys.stderr.isatty() or "ipykernel" in sys.modules


@contextlib.contextmanager
def reporting() -> Iterator[None]:
    """The log lines a run writes, shown on stderr as the command line shows them, while the block runs, when
    nothing else shows them (no logging handler configured: a script or a notebook that never set logging up)."""
    if logging.getLogger().handlers or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    level = log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
