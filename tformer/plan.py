"""A request to translate, made once: its decoding settings resolved and checked, its texts checked and tokenised
once, ready for the search. `Translator.prepare` makes a Plan, `Translator.run` decodes plans; `translate`,
the streaming forms, tformer serve and the explorer all go through the two.

    Decoding(cfg, extras, batch_type)   how a batch is decoded: one object, compared whole
    Plan(decoding, sources, prefixes, phrases, widths)   one caller's sentences; .key: which plans may share a call
    join(plans) -> Plan                 plans of one key as one (run decodes their sentences together)
    make_plan(translator, decoding, sources, prefixes, phrases, where, tags)   the checks, each text tokenised once

Phrase inputs (per-sentence lists of target phrases: constraints, ...) are read from
tformer.decode.PHRASE_INPUTS: a new one needs no change here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from torch import Tensor

from tformer.config import DecodeConfig
from tformer.decode.phrases import PHRASE_INPUTS, phrase_input
from tformer.errors import DataError
from tformer.inputs import check_list, check_per_source, check_strategy, sentence_phrases
from tformer.languages import Tags

if TYPE_CHECKING:
    from tformer.api import Translator

Where = Callable[[str, int], str]  # (what: 'sources', 'prefix' or a phrase input's name, index) -> its name in messages
PhraseIds = tuple[tuple[int, ...], ...] | None  # one sentence's phrases as ids, or None: none
PHRASE_NAMES = tuple(p.name for p in PHRASE_INPUTS)


@dataclass(frozen=True)
class Extras:
    """What each output carries besides its text and score, when asked for (checked against the model)."""

    attention: bool = False
    alignment: bool = False
    layer: int = -1  # the alignment's decoder layer (ACT step), negative from the last
    heads: tuple[int, ...] | None = None  # the heads its weights average; None: all


@dataclass(frozen=True)
class Decoding:
    """Everything that decides how a batch is decoded: plans with equal Decodings may share a model call."""

    cfg: DecodeConfig  # the loaded defaults with the caller's settings on top, checked
    extras: Extras
    batch_type: str  # "examples" | "tokens"


@dataclass(frozen=True, eq=False)
class Plan:
    """One caller's sentences, checked and tokenised once, ready for the search."""

    decoding: Decoding
    sources: tuple  # per sentence: ids (no specials), frames (S, F) for a frame encoder, or None: empty
    prefixes: tuple[tuple[int, ...], ...] | None  # per sentence: target prefix ids (() for none); None: no prefixes
    phrases: Mapping[str, tuple[PhraseIds, ...]]  # a PHRASE_INPUTS name given -> per sentence, its phrases
    widths: tuple[int, ...]  # per sentence: model source tokens (+ </s>): what a token budget counts

    @property
    def key(self) -> Decoding | None:
        """Plans with equal keys may be decoded in one call; None: alone (sampling seeds each sentence by its
        index in the call)."""
        return None if self.decoding.cfg.strategy == "sample" else self.decoding

    def __len__(self) -> int:
        return len(self.sources)


def join(plans: Sequence[Plan]) -> Plan:
    """The sentences of `plans` as one plan, in order; a ValueError where their keys differ (naming the
    setting), or where a plan that decodes alone (sampling) is joined to others."""
    if not plans:
        raise ValueError("no plans to run")
    first = plans[0]
    if len(plans) == 1:
        return first
    for p in plans[1:]:
        if first.key is None or p.key is None:
            raise ValueError("a sampling plan decodes alone (its sentences are seeded by their index in the call): "
                             "run it by itself")
        if p.key != first.key:
            raise ValueError(f"plans decode differently ({difference(first.decoding, p.decoding)}); run them apart")
    prefixes = None
    if any(p.prefixes is not None for p in plans):
        prefixes = tuple(x for p in plans for x in (p.prefixes or ((),) * len(p)))
    names = [n for n in PHRASE_NAMES if any(n in p.phrases for p in plans)]
    phrases = {n: tuple(x for p in plans for x in p.phrases.get(n, (None,) * len(p))) for n in names}
    return Plan(first.decoding, tuple(s for p in plans for s in p.sources), prefixes, phrases,
                tuple(w for p in plans for w in p.widths))


def difference(a: Decoding, b: Decoding) -> str:
    """The first setting in which two Decodings differ, named as the caller gives it."""
    for f in dataclasses.fields(DecodeConfig):
        x, y = getattr(a.cfg, f.name), getattr(b.cfg, f.name)
        if x != y:
            return f"decode.{f.name}: {x!r} and {y!r}"
    keywords = {"attention": "return_attention", "alignment": "alignment", "layer": "alignment_layer",
                "heads": "alignment_heads"}
    for f in dataclasses.fields(Extras):
        x, y = getattr(a.extras, f.name), getattr(b.extras, f.name)
        if x != y:
            return f"{keywords[f.name]}: {x!r} and {y!r}"
    return f"batch_type: {a.batch_type!r} and {b.batch_type!r}"


# ---------------------------------------------------------------------------------------- checks


def text_ids(t: Translator, text: Any, side: str, where: str) -> list[int]:
    """The ids of one sentence of `side`, checked: a string, at most t.max_source_tokens pieces."""
    if not isinstance(text, str):
        raise DataError(f"{where}: a sentence must be a string, got {type(text).__name__}")
    ids = t.encode(text, side)
    limit = t.max_source_tokens
    if limit and len(ids) > limit:
        chars = len(text.rstrip("\r\n"))  # a line read from a file keeps its ending
        raise DataError(f"{where}: {len(ids)} {side} pieces ({chars:,} characters), more than "
                        f"max_source_tokens={limit} (--max-source-tokens {limit}); split it into sentences, or "
                        "raise the limit")
    return ids


def source_input(t: Translator, source: Any, where: str) -> tuple[int, ...] | Tensor | None:
    """One source, checked: the ids of a sentence, frames (S, F) for a frame encoder (tformer.data.speech
    reads audio, waveforms and arrays), or None for an empty sentence."""
    if t.reads_frames:
        from tformer.data.speech import source_frames

        return source_frames(source, t.config.model.feature_dim, where)
    return tuple(text_ids(t, source, "source", where)) or None


def prefix_ids(t: Translator, prefix: Any, where: str) -> tuple[int, ...]:
    """A target prefix's ids (None or '': none); the sources' length limit holds for it too."""
    if prefix is None:
        return ()
    if not isinstance(prefix, str):
        raise DataError(f"{where}: a prefix must be a string or None, got {type(prefix).__name__}")
    return tuple(text_ids(t, prefix, "target", where)) if prefix else ()


def pair_ids(t: Translator, source: Any, target: Any, where_source: str, where_target: str, tags: Tags | None = None
             ) -> tuple[list[int] | Tensor, list[int]]:
    """A (source, target) pair to score, checked: a source that is not empty, a target (maybe empty); `tags`:
    as make_plan's (the output's language token is scored as part of the target)."""
    checked = source_input(t, source, where_source)
    if checked is None:
        raise DataError(f"{where_source} is empty: there is nothing to score a translation against")
    lead, first = (tags.source, tags.target) if tags is not None else (None, None)
    if lead is not None:
        checked = (lead, *checked)
    ids = text_ids(t, target, "target", where_target)
    return list(checked) if isinstance(checked, tuple) else checked, ids if first is None else [first, *ids]


def spelling(t: Translator) -> Callable[[str, str], list[int]]:
    """A phrase's ids by the target tokenizer, with the length check."""
    return lambda text, where: text_ids(t, text, "target", where)


def make_plan(t: Translator, decoding: Decoding, sources: Sequence[Any], prefixes: Sequence[Any] | None,
              phrases: Mapping[str, Sequence[Any]], where: Where, tags: Tags | None = None) -> Plan:
    """A Plan of sentences whose lists are known to be in step (one prefix, one phrase list per source):
    every entry checked, each text tokenised once. `phrases`: PHRASE_INPUTS names -> one list of target
    phrases (or None) per source. `tags`: a multilingual model's language tokens (`Translator.language_tags`):
    one every (non-empty) source starts with, one every output starts with (a prefix); plans for different
    languages still decode together."""
    targets = None if prefixes is None else tuple(prefix_ids(t, p, where("prefix", i)) for i, p in enumerate(prefixes))
    spell = spelling(t)
    checked = {}
    for name, per in phrases.items():
        phrase = phrase_input(name)
        checked[name] = tuple(sentence_phrases(phrase, v, where(name, i), spell) for i, v in enumerate(per))
        check_strategy(phrase, decoding.cfg.strategy, any(checked[name]))
    sources_ = tuple(source_input(t, s, where("sources", i)) for i, s in enumerate(sources))
    if tags is not None and tags.source is not None:
        sources_ = tuple(None if s is None else (tags.source, *s) for s in sources_)
    if tags is not None and tags.target is not None:
        targets = tuple((tags.target, *p) for p in (targets or ((),) * len(sources_)))
    return Plan(decoding, sources_, targets, checked, tuple(width(s) for s in sources_))


def width(source: tuple[int, ...] | Tensor | None) -> int:
    """What a token budget counts of a source: its ids and </s>, or its frames (0: an empty sentence)."""
    if source is None:
        return 0
    return len(source) + (0 if isinstance(source, Tensor) else 1)


def prepare(t: Translator, decoding: Decoding, sources: Sequence[Any], prefix: Sequence[Any] | None,
            phrases: Mapping[str, Sequence[Any] | None], tags: Tags | None = None) -> Plan:
    """`Translator.prepare`'s checks of its lists (one entry per source), then `make_plan`."""
    check_list(sources, "sources")
    if prefix is not None:
        check_per_source(prefix, "prefix", len(sources), "one")
    given = {name: per for name, per in phrases.items() if per is not None}
    for name, per in given.items():
        check_per_source(per, name, len(sources), "one list of phrases")
    return make_plan(t, decoding, sources, prefix, given, lambda what, i: f"{what}[{i}]", tags)


def phrase_lines(line: str) -> list[str] | None:
    """A line of a phrase file: target phrases separated by tabs; an empty (or blank) line: none."""
    text = line.rstrip("\r\n")
    return text.split("\t") if text.strip() else None
