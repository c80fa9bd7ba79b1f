"""Glossaries: a TSV file of (source term, target term) pairs. A term found in a source sentence makes its
target term one of that sentence's phrases of the phrase input `Glossary.INPUT` ("constraints": tformer.decode.
PHRASE_INPUTS, enforced by tformer.decode.constraints), so the output holds it. A glossary only finds the terms:
they reach the search as any caller's constraints do (Translator.prepare), with no path of their own.

    # comment lines and blank lines are skipped
    source term<TAB>target term

Matching: whole words (a term never matches inside a longer word), ignoring case, longest term first where
terms overlap, each occurrence once. A malformed line is a DataError naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tformer.decode.phrases import phrase_input
from tformer.errors import DataError


@dataclass(frozen=True)
class Glossary:
    """Source term -> target term, matched on source sentences (`match`)."""

    INPUT: ClassVar[str] = "constraints"  # the phrase input (decode.PHRASE_INPUTS) a glossary's terms feed

    entries: tuple[tuple[str, str], ...]
    _pattern: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _targets: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        targets = {source.casefold(): target for source, target in self.entries}
        terms = sorted(targets, key=len, reverse=True)  # the longest first where terms overlap
        pattern = (re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, terms)) + r")(?!\w)", re.IGNORECASE)
                   if terms else None)
        object.__setattr__(self, "_pattern", pattern)
        object.__setattr__(self, "_targets", targets)

    @classmethod
    def read(cls, path: str | Path) -> "Glossary":
        """A glossary file: UTF-8, one 'source<TAB>target' pair per line; '#' lines and blank lines skipped."""
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as e:
            raise DataError(f"cannot read the glossary {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            line = path.read_bytes()[: e.start].count(b"\n") + 1
            raise DataError(f"{path}, line {line}: not UTF-8 (byte {e.start}); save the glossary as UTF-8") from None
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, name: str = "the glossary") -> "Glossary":
        """A glossary from its text (`read`'s format); `name` names it in messages."""
        entries, seen = [], {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split("\t")
            where = f"{name}, line {number}"
            if len(fields) != 2:
                raise DataError(f"{where}: {len(fields) - 1} tabs; a glossary line is 'source term<TAB>target term' "
                                f"(got {line[:60]!r})")
            source, target = (f.strip() for f in fields)
            if not source or not target:
                raise DataError(f"{where}: the {'source' if not source else 'target'} term is empty; a glossary "
                                "line is 'source term<TAB>target term'")
            key = source.casefold()
            if key in seen and seen[key][1] != target:
                raise DataError(f"{where}: {source!r} is already in line {seen[key][0]} with another target term "
                                f"({seen[key][1]!r}, here {target!r}); keep one")
            if key not in seen:
                seen[key] = (number, target)
                entries.append((source, target))
        return cls(tuple(entries))

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, sentence: str) -> list[str]:
        """The target terms of the source terms in `sentence`, in the order they occur, each once; at most the
        phrase input's max_phrases (the first ones), as the search takes no more."""
        if self._pattern is None:
            return []
        out: list[str] = []
        for m in self._pattern.finditer(sentence):
            target = self._targets[m.group(0).casefold()]
            if target not in out:
                out.append(target)
        return out[:phrase_input(self.INPUT).max_phrases]
