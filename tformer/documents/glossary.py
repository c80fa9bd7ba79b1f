"""Glossaries: a TSV file of (source term, target term) pairs. A term found in a source sentence makes its
target term one of that sentence's phrases of a phrase input (tformer.decode.PHRASE_INPUTS): by default
"constraints", so the output holds it (tformer.decode.constraints); a target term that begins with a mark of
`Glossary.MARKS` feeds the input the mark names instead. A glossary only finds the terms: they reach the search
as any caller's phrases do (Translator.prepare), with no path of their own.

    # comment lines and blank lines are skipped
    source term<TAB>target term
    source term<TAB>!a rendering never to write ("avoid": tformer.decode.rules.Avoid)

Matching: whole words (a term never matches inside a longer word), ignoring case, longest term first where
terms overlap, each occurrence once. A source term has one target term for an input its outputs must write
(PhraseInput.written: the constraints), any number for the others. A malformed line is a DataError naming the
file and the line.
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
    """Source term -> its target terms by phrase input, matched on source sentences (`phrases`)."""

    MARKS: ClassVar[dict[str, str]] = {"": "constraints", "!": "avoid"}  # a target term's first characters -> the
    # input it feeds: "!" a rendering outputs must not hold

    entries: tuple[tuple[str, str, str], ...]  # (source term, target term, phrase input), in file order
    _pattern: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)
    _targets: dict[str, list[tuple[str, str]]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        targets: dict[str, list[tuple[str, str]]] = {}
        for source, target, name in self.entries:
            targets.setdefault(source.casefold(), []).append((name, target))
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
    def _marked(cls, target: str) -> tuple[str, str]:
        """(phrase input, target term without its mark): the longest mark of MARKS it begins with."""
        mark = max((m for m in cls.MARKS if target.startswith(m)), key=len)
        return cls.MARKS[mark], target[len(mark):].strip()

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
            source = fields[0].strip()
            feeds, target = cls._marked(fields[1].strip())
            if not source or not target:
                raise DataError(f"{where}: the {'source' if not source else 'target'} term is empty; a glossary "
                                "line is 'source term<TAB>target term'")
            key = (source.casefold(), feeds)
            if key in seen and seen[key][1] != target and phrase_input(feeds).written:
                raise DataError(f"{where}: {source!r} is already in line {seen[key][0]} with another target term "
                                f"({seen[key][1]!r}, here {target!r}); keep one")
            if key not in seen or seen[key][1] != target:
                seen.setdefault(key, (number, target))
                entries.append((source, target, feeds))
        return cls(tuple(entries))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def inputs(self) -> set[str]:
        """The phrase inputs its terms feed."""
        return {feeds for _, _, feeds in self.entries}

    def phrases(self, sentence: str) -> dict[str, list[str]]:
        """The target terms of the source terms in `sentence` by the phrase input they feed, in the order they
        occur, each once; at most the input's max_phrases (the first ones), as the search takes no more. An
        input no term of the sentence feeds is left out."""
        out: dict[str, list[str]] = {}
        for m in self._pattern.finditer(sentence) if self._pattern is not None else ():
            for feeds, target in self._targets[m.group(0).casefold()]:
                terms = out.setdefault(feeds, [])
                if target not in terms:
                    terms.append(target)
        return {feeds: terms[: phrase_input(feeds).max_phrases] for feeds, terms in out.items()}
