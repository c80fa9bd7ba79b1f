"""Cleaning a parallel corpus before training or distilling on it, as Moses' clean-corpus-n and the Bergamot /
OpusCleaner pipelines do: pairs are read, checked against the rules in order and either kept or dropped by the
first rule they fail, counted per rule. Streams: memory holds one 8-byte digest per kept pair (deduplication),
never the corpus.

    empty         a side is empty (after stripping whitespace)
    too long      a side has more than `max_words` whitespace words
    length ratio  the longer side has more than `max_ratio` times the words of the shorter
    copy          both sides are the same text (an untranslated pair)
    duplicate     the same pair (whitespace collapsed) came before
    language      with `languages`: a side that py3langid's bundled model (offline) finds likelier to be in the
                  other language of the pair (`identifier`)

    report = clean_files("train.en", "train.de", "clean/train.en", "clean/train.de", CleanRules(languages=("en", "de")))
    report.kept, report.dropped  # {"duplicate": 12, ...}
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tformer.data.corpus import iter_lines
from tformer.errors import ConfigError, DataError
from tformer.files import replace_atomically

REASONS = ("empty", "too long", "length ratio", "copy", "duplicate", "language")


@dataclass(frozen=True)
class CleanRules:
    max_words: int = 250
    max_ratio: float = 3.0
    dedup: bool = True
    copies: bool = True  # drop pairs whose sides are the same text
    languages: tuple[str, str] | None = None  # (source, target) ISO 639-1 codes: identify each side

    def __post_init__(self) -> None:
        if isinstance(self.max_words, bool) or not isinstance(self.max_words, int) or self.max_words < 1:
            raise ConfigError(f"max_words must be a whole number >= 1, got {self.max_words!r}")
        if not isinstance(self.max_ratio, (int, float)) or not self.max_ratio >= 1:
            raise ConfigError(f"max_ratio must be a number >= 1 (longer side / shorter side, in words), got "
                              f"{self.max_ratio!r}")


@dataclass
class CleanReport:
    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def identifier(languages: tuple[str, str]) -> Callable[[str], str]:
    """text -> which of the pair's two `languages` py3langid's bundled model finds likelier. Restricted to the
    pair: among all 97 languages, short captions go astray (27 of Multi30k's 29,000 training pairs read as
    Dutch, Tagalog or Luxembourgish, all wrongly), while a side in the other language of the pair (an
    untranslated or swapped pair, the common fault) is what this catches. Text in a third language is not
    caught."""
    rank = ranking(languages)
    return lambda text: rank(text)[0][0]


def ranking(languages: Sequence[str]) -> Callable[[str], list[tuple[str, float]]]:
    """text -> every one of `languages` with the probability py3langid's bundled model (offline) gives it among
    them, likeliest first. A code it does not know is a ConfigError naming it."""
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
    unknown = [code for code in languages if code not in ident.nb_classes]
    if unknown:
        raise ConfigError(f"language identification knows no {', '.join(map(repr, unknown))}; it knows "
                          f"{len(ident.nb_classes)} ISO 639-1 codes such as 'en', 'de', 'fr' (or leave it out)")
    ident.set_languages(list(languages))
    return lambda text: [(code, float(p)) for code, p in ident.rank(text) if code in languages]


def judge(rules: CleanRules) -> Callable[[str, str], str | None]:
    """A verdict for each (source, target) pair in turn: the first rule it fails (one of REASONS), or None to
    keep it (and remember it, for the duplicates that follow)."""
    seen: set[bytes] = set()
    identify = identifier(rules.languages) if rules.languages else None

    def verdict(src: str, tgt: str) -> str | None:
        a, b = src.split(), tgt.split()
        if not a or not b:
            return "empty"
        if max(len(a), len(b)) > rules.max_words:
            return "too long"
        if max(len(a), len(b)) > rules.max_ratio * min(len(a), len(b)):
            return "length ratio"
        if rules.copies and a == b:
            return "copy"
        digest = hashlib.blake2b(f"{' '.join(a)}\t{' '.join(b)}".encode(), digest_size=8).digest()
        if rules.dedup and digest in seen:
            return "duplicate"
        if identify is not None and (identify(src), identify(tgt)) != rules.languages:
            return "language"
        seen.add(digest)
        return None

    return verdict


def _pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """The files' lines side by side (line endings stripped); files of different lengths are a DataError."""
    for n, (a, b) in enumerate(itertools.zip_longest(iter_lines(src), iter_lines(tgt)), 1):
        if a is None or b is None:
            short, other = (src, tgt) if a is None else (tgt, src)
            raise DataError(f"{short} ends at line {n - 1} but {other} goes on; the two sides of a parallel corpus "
                            "must have one line per pair")
        yield a.rstrip("\r\n"), b.rstrip("\r\n")


def clean_files(src: str | Path, tgt: str | Path, out_src: str | Path, out_tgt: str | Path,
                rules: CleanRules = CleanRules(), progress: bool = False) -> CleanReport:
    """Clean a parallel corpus (two UTF-8 files, plain or gzip, line i of one the translation of line i of the
    other) into two plain files, written under temporary names and renamed when all is read: a bad line, an
    error or Ctrl-C midway leaves no output (and an earlier one as it was). Returns the counts."""
    src, tgt, out_src, out_tgt = map(Path, (src, tgt, out_src, out_tgt))
    if {out_src.resolve(), out_tgt.resolve()} & {src.resolve(), tgt.resolve()}:
        raise ConfigError(f"the outputs ({out_src}, {out_tgt}) must not be the inputs")
    report, tic = CleanReport(), time.perf_counter()
    pairs = _pairs(src, tgt)
    if progress:
        from tqdm import tqdm

        pairs = tqdm(pairs, unit=" pairs", desc="cleaning", mininterval=1.0)
    with replace_atomically(out_src) as fs, replace_atomically(out_tgt) as ft:
        verdict = judge(rules)
        for a, b in pairs:
            report.read += 1
            reason = verdict(a, b)
            if reason is None:
                fs.write(a + "\n")
                ft.write(b + "\n")
                report.kept += 1
            else:
                report.dropped[reason] += 1
    report.seconds = round(time.perf_counter() - tic, 2)
    return report
