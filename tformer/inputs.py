"""Checking what callers hand the Translator, before anything is decoded: lists of sentences, chunk sizes,
batch types, the decoding flags `beam`/`nbest`/`batch_size` stand for, and phrase inputs (decode.PHRASE_INPUTS:
constraints, ...). Each refusal is a DataError or ConfigError naming the argument (and the list entry)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping, Sequence

from tformer.data.vocab import Vocab
from tformer.decode.phrases import PhraseInput
from tformer.errors import ConfigError, DataError


def decode_fields(beam: int | None = None, nbest: int | None = None, batch_size: int | None = None,
                  batch_tokens: int | None = None) -> dict[str, Any]:
    """The DecodeConfig fields that `beam` (1: greedy search, N: beam search of N), `nbest`, `batch_size` and
    `batch_tokens` stand for (those given). A batch_size alone asks for batches of sentences: batch_tokens 0."""
    out: dict[str, Any] = {}
    if beam is not None:
        out.update(strategy="greedy" if beam == 1 else "beam", beam_size=beam)
    if nbest is not None:
        out["nbest"] = nbest
    if batch_size is not None:
        out["batch_size"] = batch_size
    if batch_tokens is not None or batch_size is not None:
        out["batch_tokens"] = batch_tokens or 0
    return out


def check_decode_keys(settings: Mapping[str, Any]) -> None:
    """A ConfigError for a keyword that is neither `decode_fields`' nor a DecodeConfig field (translate(beem=5)),
    with the nearest name."""
    from tformer.config import DecodeConfig

    known = list(dict.fromkeys(["beam", "nbest", "batch_size", *(f.name for f in dataclasses.fields(DecodeConfig))]))
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(f"{key!r} is not a decoding setting" + (f"; did you mean {close[0]!r}?" if close else
                              f"; they are {', '.join(known)}"))


def check_list(value: Any, name: str) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        hint = f": wrap one sentence in a list, {name}=[...]" if isinstance(value, str) else ""
        raise DataError(f"{name} must be a list, got {type(value).__name__}{hint}")
    if not value:
        raise DataError(f"{name} is an empty list: nothing to do")


def check_chunk(chunk_size: Any) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise DataError(f"chunk_size must be a whole number >= 1, got {chunk_size!r}")


def check_batch_type(batch_type: Any) -> None:
    if batch_type not in ("examples", "tokens"):
        raise ConfigError(f"batch_type must be 'examples' (sentences per batch) or 'tokens' (padded source tokens "
                          f"per batch), got {batch_type!r}")


def check_per_source(value: Any, name: str, n: int, entry: str) -> None:
    """A list beside `n` sources, one `entry` per source (None for none)."""
    check_list(value, name)
    if len(value) != n:
        raise DataError(f"{name} has {len(value)} entries for {n} sources; give {entry} per source (None for none)")


def sentence_phrases(phrase: PhraseInput, value: Sequence[str] | None, where: str,
                     spell: Callable[[str, str], list[int]]) -> tuple[tuple[int, ...], ...] | None:
    """One sentence's phrases (a list of target strings, or None: none) as ids, by `spell(text, where)` (the
    target tokenizer, with its length check); refused, naming `where`, where a phrase is empty, holds a piece
    the vocabulary lacks (<unk>), or there are more than `phrase.max_phrases`."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        hint = f": wrap it, [{value!r}]" if isinstance(value, str) else ""
        raise DataError(f"{where} must be a list of target phrases (or None), got {type(value).__name__}{hint}")
    if len(value) > phrase.max_phrases:
        raise DataError(f"{where} has {len(value)} phrases; at most {phrase.max_phrases} per sentence")
    ids = []
    for j, text in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{at} must be a non-empty string, got {text!r}")
        spelt = spell(text, at)
        if Vocab.unk in spelt:
            raise DataError(f"{at} ({text!r}) holds {spelt.count(Vocab.unk)} piece(s) the target vocabulary "
                            "does not have (<unk>): the model cannot write it; spell it with known words or drop it")
        ids.append(tuple(spelt))
    return tuple(ids) or None


def check_strategy(phrase: PhraseInput, strategy: str, used: bool) -> None:
    """Refuse a phrase input some sentence `used` under a search that does not enforce it."""
    if used and strategy not in phrase.strategies:
        hint = "give beam=N (N >= 2), or " if "beam" in phrase.strategies else "set "
        searches = " or ".join(phrase.strategies)
        raise ConfigError(f"{phrase.name} are enforced by {searches} search; decoding is set to {strategy!r}: "
                          f"{hint}decode.strategy={phrase.strategies[0]}")
