"""Writing files so that a crash, a full disk or Ctrl-C never leaves half of one; where tformer keeps its caches."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Iterator

from tformer.errors import DataError


def cache_dir() -> Path:
    """$TFORMER_CACHE, else $XDG_CACHE_HOME/tformer, else ~/.cache/tformer."""
    if os.environ.get("TFORMER_CACHE"):
        return Path(os.environ["TFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tformer"


@contextlib.contextmanager
def replace_atomically(path: str | Path, fsync: bool = False, binary: bool = False) -> Iterator[IO]:
    """A UTF-8 text file (`binary`: a bytes file) opened under a temporary name beside `path`, renamed over
    `path` when the block ends without error (after an fsync when asked); on any error it is removed and `path`
    stays as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with (open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8")) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # gone (renamed), or never made
            tmp.unlink()


@contextlib.contextmanager
def writing(target: str | Path | IO[str], name: str = "the output") -> Iterator[IO[str]]:
    """An open text stream as it is, or a path written atomically (`replace_atomically`): an error or Ctrl-C
    midway leaves an existing file as it was. `name` names the target in the error for a folder."""
    if not isinstance(target, (str, Path)):
        yield target
        return
    if Path(target).is_dir():
        raise DataError(f"{name} {target} is a folder; give a file name")
    with replace_atomically(target) as f:
        yield f


def nearest(path: str | Path) -> str:
    """For a path that does not exist: ' (did you mean runs/m30q?)' naming the closest entry of its folder (its
    nearest existing ancestor's), or ''."""
    import difflib

    path = Path(path)
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        path, parent = parent, parent.parent
    if not parent.is_dir():
        return ""
    try:
        names = [p.name for p in parent.iterdir() if not p.name.startswith(".")]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f" (did you mean {parent / close[0] if str(parent) != '.' else close[0]}?)" if close else ""
