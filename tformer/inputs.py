"""Checking what callers hand the Translator, before anything is decoded: lists of sentences, chunk sizes,
batch types, the decoding flags `beam`/`nbest`/`batch_size` stand for, and lexical constraints. Each refusal is
a DataError or ConfigError naming the argument (and the list entry)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from tformer.data.vocab import Vocab
from tformer.decode.constraints import MAX_PHRASES
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


def phrase_ids(constraints: Sequence[Sequence[str] | None] | None, n: int, strategy: str,
               spell: Callable[[str, str], list[int]]) -> list[list[list[int]]] | None:
    """Constraints for `n` sources (one list of target phrases, or None, per source) as ids, by `spell(text,
    where)` (the target tokenizer, with its length check); refused, naming the entry, where a phrase is empty,
    holds a piece the vocabulary lacks (<unk>), a source has more than MAX_PHRASES, or `strategy` is not beam."""
    if constraints is None:
        return None
    check_list(constraints, "constraints")
    if len(constraints) != n:
        raise DataError(f"constraints has {len(constraints)} entries for {n} sources; give one list of phrases per "
                        "source (None for none)")
    out = []
    for i, phrases in enumerate(constraints):
        if phrases is None:
            out.append([])
            continue
        if isinstance(phrases, str) or not isinstance(phrases, Sequence):
            hint = f": wrap it, [{phrases!r}]" if isinstance(phrases, str) else ""
            raise DataError(f"constraints[{i}] must be a list of target phrases (or None), got "
                            f"{type(phrases).__name__}{hint}")
        if len(phrases) > MAX_PHRASES:
            raise DataError(f"constraints[{i}] has {len(phrases)} phrases; at most {MAX_PHRASES} per sentence")
        ids = []
        for j, phrase in enumerate(phrases):
            where = f"constraints[{i}][{j}]"
            if not isinstance(phrase, str) or not phrase.strip():
                raise DataError(f"{where} must be a non-empty string, got {phrase!r}")
            spelt = spell(phrase, where)
            if Vocab.unk in spelt:
                raise DataError(f"{where} ({phrase!r}) holds {spelt.count(Vocab.unk)} piece(s) the target vocabulary "
                                "does not have (<unk>): the model cannot write it; spell it with known words or drop it")
            ids.append(spelt)
        out.append(ids)
    if any(out) and strategy != "beam":
        raise ConfigError(f"constraints are enforced by beam search; decoding is set to {strategy!r}: give beam=N "
                          "(N >= 2), or decode.strategy=beam")
    return out
