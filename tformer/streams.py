"""The streaming forms of translate and score (Translator.translate_iterable/_file, score_iterable/_file): the
input read in chunks, each chunk made into one plan (tformer.plan) and run, so memory does not grow with the
input. Files are read twice: once to check every line (nothing is written if one is bad), once to decode.

Inputs beside the sources (a prefix, a phrase input of decode.PHRASE_INPUTS) are streams in step with them,
one value per source; a stream of another length is an error naming both.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from tformer.data.corpus import iter_lines
from tformer.errors import DataError
from tformer.files import writing
from tformer.inputs import check_chunk, check_strategy, sentence_phrases
from tformer.languages import Tags
from tformer.plan import (PHRASE_NAMES, Decoding, make_plan, pair_ids, phrase_input, phrase_lines, prefix_ids,
                          source_input, spelling)
from tformer.results import Score, Translation, format_score, format_translation, parse_pair

if TYPE_CHECKING:
    from tformer.api import Translator

CHUNK = 10_000  # sentences read, sorted by length and decoded together by the streaming forms
_END = object()  # what next() gives at the end of a stream
File = str | Path | IO[bytes]


@dataclass(frozen=True)
class Stream:
    """What `translations` reads: sources and, in step with them, the inputs beside them."""

    sources: Iterator[Any]
    beside: Mapping[str, Iterator[Any]]  # 'prefix' or a phrase input's name -> one value per source
    names: Mapping[str, str]  # 'sources' and each of `beside` -> the stream's name in messages
    decoding: Decoding
    chunk_size: int = CHUNK
    first: int = 1  # the first source's line number
    tags: Tags | None = None  # a multilingual model's language tokens (Translator.language_tags)


def _what(kind: str) -> str:
    return "prefix" if kind == "prefix" else f"line of {kind}"


def translations(t: Translator, stream: Stream) -> Iterator[Translation]:
    """Chunks of the stream, each checked, planned and run in turn."""
    names, done = stream.names, stream.first
    while chunk := list(itertools.islice(stream.sources, stream.chunk_size)):
        beside = {}
        for kind, values in stream.beside.items():
            part = list(itertools.islice(values, len(chunk)))
            if len(part) < len(chunk):
                raise DataError(f"{names['sources']}: more lines than {names[kind]}, whose last is line "
                                f"{done + len(part) - 1}; give one {_what(kind)} per input line (an empty one: none)")
            beside[kind] = part
        phrases = {k: v for k, v in beside.items() if k != "prefix"}
        plan = make_plan(t, stream.decoding, chunk, beside.get("prefix"), phrases,
                         lambda what, i, done=done: f"{names[what]}, line {done + i}", stream.tags)
        yield from t.run([plan])[0]
        done += len(chunk)
    for kind, values in stream.beside.items():
        if next(values, _END) is not _END:
            raise DataError(f"{names[kind]}: more lines than {names['sources']}, whose last is line {done - 1}; give "
                            f"one {_what(kind)} per input line")


def translate_iterable(t: Translator, sources: Any, prefix: Any, chunk_size: int, name: str, prefix_name: str,
                       first_line: int, options: dict[str, Any]) -> Iterator[Translation]:
    beside = {k: options.pop(k) for k in PHRASE_NAMES if options.get(k) is not None}
    for value, what in ((sources, "sentences"), (prefix, "prefixes"), *((v, k) for k, v in beside.items())):
        if isinstance(value, (str, bytes)):
            raise DataError(f"translate_iterable takes an iterable of {what} (a list, an open file), got a "
                            f"{type(value).__name__}")
    check_chunk(chunk_size)
    tags = t.language_tags(options.pop("target", None), options.pop("source", None))
    decoding = t._options(options)
    if prefix is not None:
        beside = {"prefix": prefix, **beside}
    names = {"sources": name, "prefix": prefix_name, **{k: f"the {k}" for k in beside if k != "prefix"}}
    return translations(t, Stream(iter(sources), {k: iter(v) for k, v in beside.items()}, names, decoding,
                                  chunk_size, first_line, tags))


def translate_file(t: Translator, source: File, output: str | Path | IO[str], prefix_file: File | None,
                   phrase_files: Mapping[str, File] | None, name: str | None, prefix_name: str | None,
                   chunk_size: int, options: dict[str, Any]) -> int:
    name = name or str(source)
    tags = t.language_tags(options.pop("target", None), options.pop("source", None))
    decoding = t._options(options)
    check_chunk(chunk_size)
    files = {k: v for k, v in (phrase_files or {}).items() if v is not None}
    unknown = sorted(set(files) - set(PHRASE_NAMES))
    if unknown:
        raise DataError(f"phrase_files names {', '.join(map(repr, unknown))}; the phrase inputs are "
                        f"{', '.join(PHRASE_NAMES)}")
    if prefix_file is not None:
        files = {"prefix": prefix_file, **files}
    names = {"sources": name, **{k: str(v) for k, v in files.items()}}
    if prefix_file is not None and prefix_name:
        names["prefix"] = prefix_name
    count = 0
    for count, line in enumerate(iter_lines(source, name), 1):
        source_input(t, line, f"{name}, line {count}")
    if not count:
        raise DataError(f"{name} is empty: nothing to translate")
    for kind, file in files.items():
        n, used = 0, False
        for n, line in enumerate(iter_lines(file, names[kind]), 1):
            where = f"{names[kind]}, line {n}"
            if kind == "prefix":
                prefix_ids(t, line, where)
            else:
                used |= sentence_phrases(phrase_input(kind), phrase_lines(line), where, spelling(t)) is not None
        if n != count:
            raise DataError(f"{name} has {count} lines but {names[kind]} has {n}; give one {_what(kind)} per input "
                            "line (an empty line for none)")
        if kind != "prefix":
            check_strategy(phrase_input(kind), decoding.cfg.strategy, used)
    with writing(output) as out:
        beside = {k: _values(k, iter_lines(f, names[k])) for k, f in files.items()}
        stream = Stream(iter_lines(source, name), beside, names, decoding, chunk_size, tags=tags)
        for index, translation in enumerate(translations(t, stream)):
            out.write(format_translation(translation, index, decoding.cfg.nbest > 1, decoding.extras.alignment))
    return count


def _values(kind: str, lines: Iterator[str]) -> Iterator[Any]:
    """A file's lines as the values of an input beside the sources: a prefix as it is, phrases split."""
    return lines if kind == "prefix" else map(phrase_lines, lines)


# ---------------------------------------------------------------------------------------- score


def score_pair(t: Translator, pair: Any, where: str) -> tuple[Any, list[int]]:
    """A (source, target) pair to score, checked: a source that is not empty, a target (maybe empty)."""
    if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
        raise DataError(f"{where}: a pair (source, target) is needed, got {type(pair).__name__}")
    return pair_ids(t, pair[0], pair[1], f"{where} (source)", f"{where} (target)")


def score_iterable(t: Translator, pairs: Any, chunk_size: int, name: str, first: int,
                   decoding: Decoding) -> Iterator[Score]:
    if isinstance(pairs, (str, bytes)):
        raise DataError(f"score_iterable takes an iterable of (source, target) pairs, got a {type(pairs).__name__}")
    check_chunk(chunk_size)
    return scores(t, iter(pairs), chunk_size, name, first, decoding)


def scores(t: Translator, stream: Iterator[Any], chunk_size: int, name: str, first: int,
           decoding: Decoding) -> Iterator[Score]:
    done = first
    while chunk := list(itertools.islice(stream, chunk_size)):
        checked = [score_pair(t, pair, f"{name}, line {done + i}") for i, pair in enumerate(chunk)]
        yield from t._score(checked, decoding)
        done += len(chunk)


def score_file(t: Translator, pairs: File, output: str | Path | IO[str], name: str | None, format: str,
               pieces: bool, chunk_size: int, decoding: Decoding) -> int:
    name = name or str(pairs)
    check_chunk(chunk_size)
    count = 0
    for count, line in enumerate(iter_lines(pairs, name), 1):
        where = f"{name}, line {count}"
        pair_ids(t, *parse_pair(line, where), f"{where} (source)", f"{where} (target)")
    if not count:
        raise DataError(f"{name} is empty: nothing to score")
    with writing(output) as out:
        lines = (parse_pair(line, "") for line in iter_lines(pairs, name))
        for score in scores(t, lines, chunk_size, name, 1, decoding):
            out.write(format_score(score, format, pieces))
    return count
