"""Many languages in one model: its directions, and the target-language token that chooses what it writes.

A multilingual model is trained on `data.pairs`, directions such as en-de, en-fr, de-en. As Johnson et al. (2017)
do, each source sentence starts with a token naming the target language, `<2de>`: one encoder and one decoder
then serve every direction, and the source language needs no tag. The tags are user-defined symbols of the
shared SentencePiece model, so the tag of a text is one piece whatever the tokenizer would make of its letters.

    Languages.of(data_cfg)           the directions of a config (None: a one-pair model)
    .sources, .targets               the languages a model reads and writes
    .tag(lang) -> '<2de>'            the token that names `lang` (data.language_tag: M2M-100's is __de__)
    .choose(target, source)          the tokens a request asks for, or a DataError naming the languages known
    language_tags(data, vocab, target, source) -> Tags   their ids: before the source, first in the output
    parse_pairs(['en-de', ...])      the pairs as (source, target) tuples, checked
    Directions, sampled(...)         which direction each example is; an epoch's examples under a temperature

M2M-100 (tformer.convert.hf_m2m100) puts tokens on both sides (data.tag_sides both): the source's before the
source, the target's first in the output (a forced prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from tformer.config_checks import check
from tformer.errors import CheckpointError, ConfigError, DataError

if TYPE_CHECKING:
    from tformer.config import DataConfig
    from tformer.data.vocab import Vocab

LANGUAGE = re.compile(r"[a-z]{2,3}(_[A-Za-z0-9]+)?$")  # ISO 639-1/-3 codes, maybe with a script or region (zh_Hant)


def parse_pairs(pairs: Iterable[str], key: str = "data.pairs") -> tuple[tuple[str, str], ...]:
    """'en-de' strings as (source, target) pairs: each two different language codes, no pair twice."""
    out: list[tuple[str, str]] = []
    for p in pairs:
        src, dash, tgt = str(p).partition("-")
        if not dash or not LANGUAGE.match(src) or not LANGUAGE.match(tgt):
            raise ConfigError(f"config key '{key}': {p!r} is not a direction 'SRC-TGT' of two language codes "
                              "(the corpus files' suffixes, such as en-de)")
        if src == tgt:
            raise ConfigError(f"config key '{key}': {p!r} translates a language into itself")
        if (src, tgt) in out:
            raise ConfigError(f"config key '{key}': {p!r} is listed twice")
        out.append((src, tgt))
    return tuple(out)


def check_languages(data: "DataConfig") -> None:
    """DataConfig's multilingual settings, checked (a ConfigError names the key)."""
    check(data.temperature > 0, "data.temperature", f"must be > 0, got {data.temperature}")
    check(data.language_tag.count("{}") == 1, "data.language_tag",
          f"must hold {{}} once, where the language code goes (<2{{}}>), got {data.language_tag!r}")
    check(not (data.pairs and data.languages), "data.languages", "give data.pairs or data.languages, not both")
    if data.pairs:
        parse_pairs(data.pairs)
        check(data.task == "translation" and data.format == "files", "data.pairs",
              "lists the directions of a translation corpus in files (data.task=translation, data.format=files)")
        check(data.joint_vocab, "data.pairs", "a multilingual model shares one vocabulary across its languages: "
              "set data.joint_vocab=true")


def direction(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


@dataclass(frozen=True)
class Languages:
    """The directions of a multilingual model, and how its tokens ask for them."""

    pairs: tuple[tuple[str, str], ...]
    tag_format: str = "<2{}>"  # data.language_tag
    tag_sides: str = "source"  # data.tag_sides: 'source' (Johnson et al.) or 'both' (M2M-100, NLLB)

    @classmethod
    def of(cls, data: "DataConfig") -> "Languages | None":
        if data.pairs:
            pairs = parse_pairs(data.pairs)
        elif data.languages:
            pairs = tuple((a, b) for a in data.languages for b in data.languages if a != b)
        else:
            return None
        return cls(pairs, data.language_tag, data.tag_sides)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for s, _ in self.pairs))

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for _, t in self.pairs))

    def tag(self, lang: str) -> str:
        return self.tag_format.format(lang)

    @property
    def tags(self) -> tuple[str, ...]:
        """The tokens of the languages a tag names: the targets (and with tags on both sides the sources too)."""
        named = self.targets if self.tag_sides == "source" else tuple(dict.fromkeys(self.sources + self.targets))
        return tuple(self.tag(x) for x in named)

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(direction(p) for p in self.pairs)

    def choose(self, target: str | None, source: str | None = None) -> tuple[str | None, str]:
        """The tokens a request for `target` (from `source`) needs: the one its sources start with (None: none)
        and the target's, which starts the sources (tag_sides 'source') or the output ('both'). A model with
        one target (or source) needs it unnamed; a language it never wrote (or read) is an error naming those it
        knows. A pair it never saw, whose languages it knows, is allowed (zero-shot)."""
        if source is not None and source not in self.sources:
            raise DataError(f"source language {source!r}: this model reads {', '.join(self.sources)}")
        if target is None:
            if len(self.targets) > 1:
                raise DataError(f"this model writes {', '.join(self.targets)}: name the target language "
                                "(target='fr', --target fr)")
            target = self.targets[0]
        if target not in self.targets:
            raise DataError(f"target language {target!r}: this model writes {', '.join(self.targets)}")
        if self.tag_sides == "source":
            return None, self.tag(target)
        if source is None:
            if len(self.sources) > 1:
                raise DataError(f"this model reads {', '.join(self.sources)} and starts each source with its "
                                "language's token: name the source language (source='en', --source en)")
            source = self.sources[0]
        return self.tag(source), self.tag(target)


@dataclass(frozen=True)
class Tags:
    """The ids a request's languages add: `source` before every source, `target` first in every output (its
    prefix); None where the model has no such token."""

    source: int | None = None
    target: int | None = None


@dataclass(frozen=True, eq=False)
class Directions:
    """Which direction each example of a multilingual split belongs to."""

    names: tuple[str, ...]
    of: np.ndarray  # (n,) an index into names per example

    def members(self, name: str) -> np.ndarray:
        """The indices of the examples of direction `name`, in order."""
        return np.flatnonzero(self.of == self.names.index(name))

    def sizes(self) -> dict[str, int]:
        return dict(zip(self.names, np.bincount(self.of, minlength=len(self.names)).tolist()))


def language_tags(data: "DataConfig", vocab: "Vocab", target: str | None, source: str | None,
                  where: object = "the model") -> Tags | None:
    """The ids a request for `target` (from `source`) adds to a multilingual model's sources and outputs
    (`Languages.choose`); None for a one-pair model (no data.pairs or data.languages), which accepts its own
    languages only."""
    for what, lang in (("target", target), ("source", source)):
        if lang is not None and not isinstance(lang, str):
            raise DataError(f"{what} must be a language code such as 'fr', got {type(lang).__name__}")
    languages = Languages.of(data)
    if languages is None:
        for what, lang, own in (("target", target, data.tgt_lang), ("source", source, data.src_lang)):
            if lang is not None and lang != own:
                raise DataError(f"{what} language {lang!r}: this model translates {data.src_lang} -> "
                                f"{data.tgt_lang} only")
        return None
    lead, first = languages.choose(target, source)
    ids = {}
    for piece in filter(None, (lead, first)):
        ids[piece] = vocab.encode([piece])[0]
        if ids[piece] == vocab.unk:
            raise CheckpointError(f"{where}: its vocabulary has no entry {piece} although its config names the "
                                  "language; the folder is damaged")
    if languages.tag_sides == "source":
        return Tags(source=ids[first])
    return Tags(source=ids[lead], target=ids[first])


def sampled(directions: Directions, temperature: float, seed: int) -> np.ndarray | None:
    """The training examples of an epoch when directions are drawn with a temperature (fairseq's multilingual
    sampling, M2M-100): direction d gets a share p_d ~ (n_d / N) ** (1 / temperature). Nothing is dropped: the
    epoch grows until the largest n_d / p_d fits, and smaller directions are repeated, whole copies and then a
    subset drawn with `seed`. None: every example once (temperature 1, or one direction)."""
    sizes = np.bincount(directions.of, minlength=len(directions.names)).astype(np.float64)
    p = (sizes / sizes.sum()) ** (1.0 / temperature)
    p /= p.sum()
    scale = (sizes[p > 0] / p[p > 0]).max()  # the epoch in which no direction falls below its size
    want = np.maximum(np.round(scale * p).astype(np.int64), sizes.astype(np.int64))
    if (want == sizes).all():
        return None
    rng = np.random.default_rng([seed, 1])
    parts = []
    for d, m in enumerate(want.tolist()):
        members = np.flatnonzero(directions.of == d)
        if not len(members):
            continue
        whole, extra = divmod(m, len(members))
        parts.extend([members] * whole)
        parts.append(np.sort(rng.choice(members, extra, replace=False)))
    return np.concatenate(parts)
