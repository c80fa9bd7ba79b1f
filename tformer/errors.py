"""The one family of exceptions tformer raises for bad input.

    TformerError            anything a user can fix: a file, a setting, a checkpoint, an argument, a request
      ConfigError           a configuration key, value or combination (the message names the key)
      DataError             a corpus, an input file or line, a sentence or a list passed to the API
      CheckpointError       a checkpoint that is missing, incomplete, foreign, damaged or does not fit
        NoCheckpointError   a run folder that holds no complete checkpoint (yet)
      TrainingError         training cannot go on (say, NaN/inf updates too many times in a row)

Every message says what is wrong, where (file, line, key, list index, request field) and what to do. The
command line and the servers catch this family only: any other exception is a bug in tformer and keeps its
traceback. TformerError derives from ValueError, so code written against earlier versions (`except
ValueError`) keeps working; catch TformerError to tell a user's mistake from a bug.

A message that tells the user to set an argument speaks the caller's language (`option`): `--resume` to the
command line (which runs under `spoken("command line")`), `resume=True` to Python.
"""

from __future__ import annotations

import contextlib
import contextvars
from pathlib import PurePath
from typing import Any, Iterator, Sequence

_SPOKEN = contextvars.ContextVar("tformer_spoken", default="python")


@contextlib.contextmanager
def spoken(language: str) -> Iterator[None]:
    """Messages within speak `language`: "command line" or "python" (the default)."""
    token = _SPOKEN.set(language)
    try:
        yield
    finally:
        _SPOKEN.reset(token)


def option(name: str, value: Any = None) -> str:
    """The argument `name` (a Python keyword such as run_dir) as the caller writes it: `--run-dir` or `run_dir`;
    with a value, `--resume` or `resume=True` (True is a flag), `--beam 4` or `beam=4`."""
    if _SPOKEN.get() == "command line":
        flag = "--" + name.replace("_", "-")
        return flag if value is None or value is True else f"{flag} {value}"
    return name if value is None else f"{name}={value!r}"


class TformerError(ValueError):
    """Bad input that the user can fix; the message names what and where."""


class ConfigError(TformerError):
    """A configuration key, value or combination that cannot work; the message names the key."""


class DataError(TformerError):
    """A corpus, input file, sentence or argument the library was given; the message names where."""


class CheckpointError(TformerError):
    """A checkpoint that is missing, incomplete, foreign, damaged or does not fit the model."""


class NoCheckpointError(CheckpointError):
    """A run folder that holds no complete checkpoint (yet)."""


class TrainingError(TformerError):
    """Training cannot go on (e.g. NaN/inf in too many updates in a row); the message says why and what to do."""


__all__ = ["CheckpointError", "ConfigError", "DataError", "NoCheckpointError", "TformerError", "TrainingError"]


def invocation(command: str, overrides: Sequence[str] = (), **arguments: Any) -> str:
    """A call to suggest, as the caller writes it: `tformer train --run-dir runs/a --resume train.max_steps=60`
    on the command line, `tformer.train(run_dir='runs/a', resume=True, overrides=['train.max_steps=60'])` in
    Python. Path values are written as strings."""
    arguments = {k: str(v) if isinstance(v, PurePath) else v for k, v in arguments.items()}
    if _SPOKEN.get() == "command line":
        return " ".join(["tformer", command, *(option(k, v) for k, v in arguments.items()), *overrides])
    given = [f"{k}={v!r}" for k, v in arguments.items()] + ([f"overrides={list(overrides)!r}"] if overrides else [])
    return f"tformer.{command}({', '.join(given)})"
