"""The public face of tformer: load a trained model and translate, score and evaluate with it; train and build
models from Python. The command line, the HTTP service (tformer.serve), the explorer page and the exporters
are thin layers over this module.

    translator = tformer.load("runs/m30k")                 # a run folder (its best checkpoint) or a checkpoint
    translator.translate(["A dog runs on the beach ."])[0].text
    translator.translate(lines, beam=5, nbest=3)           # Translation.hypotheses: the n-best list, best first
    translator.translate(lines, prefix=["Ein Hund", None]) # force the start of an output
    translator.translate(lines, beam=5, constraints=[["Strand"], None])  # phrases each output must hold
    translator.translate(lines, alignment=True)[0].hypotheses[0].alignment   # [(source i, target j), ...]
    translator.translate_iterable(open("big.en"))          # streams: constant memory, input order
    translator.translate_file("in.en", "out.de")           # every line checked first; written atomically
    translator.translate_file("in.en", "out.de", prefix_file="in.prefix")    # one target prefix per line
    translator.score(sources, targets)                     # forced decoding: total and per-token log-probs
    translator.score_file("pairs.tsv", "scores.tsv")       # source<TAB>target lines, streamed like translate
    translator.evaluate("test")                            # BLEU/chrF, CER/WER or exact match on a split
    tformer.train(tformer.Config.from_yaml("copy"), "runs/copy")

Text in, text out: sources are raw sentences (normalised and tokenised here with the checkpoint's own
tokenizers), or for a speech model audio files, 16 kHz waveforms (samples,) or feature frames (frames,
model.feature_dim); outputs are detokenised. An empty sentence translates to an empty string without decoding.
Decoding settings are
DecodeConfig's fields (tformer.config), given to `load` as defaults or to each call; `beam=N` is short for
strategy beam with beam_size N (1: greedy). Bad input raises a tformer.errors.TformerError naming what and
where (the list index, the file and line, the setting).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from tformer.config import SPEECH_TASKS, Config, DecodeConfig, ModelConfig, check_inference_overrides, updated
from tformer.data.corpus import iter_lines, normalize
from tformer.inputs import check_batch_type as _check_batch_type
from tformer.inputs import check_chunk as _check_chunk
from tformer.inputs import check_list as _check_list
from tformer.inputs import decode_fields, phrase_ids  # noqa: F401  (decode_fields: the command line's)
from tformer.errors import ConfigError, DataError
from tformer.files import writing
from tformer.inference import BatchType, Source, batching, model_from, score_ids, translate_ids
from tformer.inspection import attention_maps, check_alignment, hard_alignments, token_labels
from tformer.model.ensemble import Ensemble
from tformer.shortlist import Shortlist
from tformer.results import (SCORE_FORMATS, Alignment, Evaluation, Hypothesis, Score, Translation, format_score,
                             format_translation, parse_pair)
from tformer.convert import open_checkpoint
from tformer.training.checkpoint import Checkpoint
from tformer.training.start import prepare, train, train_config  # noqa: F401  (the public API: tformer.train)

MAX_SOURCE_TOKENS = 1024  # default limit on a source's pieces: attention memory grows with its square
CHUNK = 10_000  # sentences read, sorted by length and decoded together by the streaming forms
EXTRAS = ("return_attention", "alignment", "alignment_layer", "alignment_heads")  # what outputs carry, on request
SCORE_OPTIONS = ("batch_size", "batch_tokens")  # the decoding settings scoring reads
_END = object()  # what next() gives at the end of a stream
log = logging.getLogger("tformer")


@dataclass(frozen=True)
class _Extras:
    """What each output carries besides its text and score, when asked for (checked against the model)."""

    attention: bool = False
    alignment: bool = False
    layer: int = -1  # the alignment's decoder layer (ACT step), negative from the last
    heads: tuple[int, ...] | None = None  # the heads its weights average; None: all


class Translator:
    """A trained model with its tokenizers and decoding defaults (`tformer.load` makes one)."""

    def __init__(self, checkpoint: Checkpoint, model: torch.nn.Module, max_source_tokens: int = MAX_SOURCE_TOKENS):
        self.checkpoint = checkpoint
        self.model = model
        self.source_tokenizer, self.target_tokenizer = checkpoint.tokenizers
        self.max_source_tokens = max_source_tokens  # 0: no limit

    @property
    def config(self) -> Config:
        return self.checkpoint.cfg

    @property
    def path(self) -> Path:
        return self.checkpoint.path

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def reads_frames(self) -> bool:
        return self.config.model.source == "features"

    def __repr__(self) -> str:
        m = self.config.model
        return (f"Translator({str(self.path)!r}, {m.kind} d_model={m.d_model} {m.encoder_layers}+{m.decoder_layers} "
                f"layers, vocabularies {len(self.source_tokenizer.vocab)}/{len(self.target_tokenizer.vocab)}, "
                f"device {self.device})")

    # ---------------------------------------------------------------------------------------- tokenizers

    def _tokenizer(self, side: str):
        if side not in ("source", "target"):
            raise DataError(f"side must be 'source' or 'target', got {side!r}")
        if side == "source" and self.reads_frames:
            raise DataError(f"{self.path} reads feature frames (model.source=features): its source has no text")
        return self.source_tokenizer if side == "source" else self.target_tokenizer

    def encode(self, text: str, side: str = "source") -> list[int]:
        """Raw text -> ids (normalised as in training; no <s>/</s>)."""
        return self._tokenizer(side).encode(normalize(text))

    def decode(self, ids: Iterable[int], side: str = "target") -> str:
        """Ids -> detokenised text (stops at </s>; <pad> and <s> are dropped)."""
        return self._tokenizer(side).decode(ids)

    def pieces(self, ids: Iterable[int], side: str = "target") -> list[str]:
        """The vocabulary entry of each id (SentencePiece pieces keep their '▁' word marks)."""
        return token_labels(self._tokenizer(side), list(ids))

    # ---------------------------------------------------------------------------------------- checks

    def decode_settings(self, *, beam: int | None = None, nbest: int | None = None, batch_size: int | None = None,
                        **settings: Any) -> DecodeConfig:
        """The loaded defaults with these settings (DecodeConfig fields) on top, checked. `quantize` and
        `precision` are chosen when the model is loaded (its weights change), so a call may only repeat them."""
        for key in ("quantize", "precision"):
            loaded = getattr(self.config.decode, key)
            if settings.get(key, loaded) != loaded:
                raise ConfigError(f"config key 'decode.{key}': the model was loaded with {key}={loaded!r}; it is "
                                  f"chosen when loading (tformer.load(..., {key}={settings[key]!r})), not per call")
        fields = decode_fields(beam, nbest, batch_size, settings.pop("batch_tokens", None))
        return updated(self.config.decode, "decode", {**settings, **fields})

    def shortlist(self, cfg: DecodeConfig | None = None) -> Shortlist | None:
        """The lexical shortlist `cfg` (default: the loaded settings) names in decode.shortlist, loaded once and
        checked against this model's vocabularies; None when it names none."""
        path = (cfg or self.config.decode).shortlist
        return Shortlist.open(path).check(self) if path else None

    @property
    def ensemble(self) -> bool:
        """True when several checkpoints decode together (`tformer.load([...])`)."""
        return isinstance(self.model, Ensemble)

    def _one_model(self, what: str) -> None:
        if self.ensemble:
            raise ConfigError(f"{what} come from one model's forward pass; this Translator is an ensemble of "
                              f"{len(self.model.models)} checkpoints, which only decodes: load one checkpoint")

    def _extras(self, return_attention: bool = False, alignment: bool = False, alignment_layer: int = -1,
                alignment_heads: Sequence[int] | None = None) -> _Extras:
        if return_attention or alignment:
            self._one_model("attention maps and alignments")
        heads = None if self.ensemble else check_alignment(self.model, alignment_layer, alignment_heads)
        return _Extras(bool(return_attention), bool(alignment), alignment_layer, heads)

    def _source(self, source: Any, where: str) -> Source | None:
        """One source, checked: ids of a sentence, frames (S, F), or None for an empty sentence."""
        if self.reads_frames:
            from tformer.data.audio import FbankOptions, check_waveform, fbank
            from tformer.data.speech import FEATURE_SUFFIXES, check_frames, utterance_features

            dim = self.config.model.feature_dim
            if isinstance(source, (str, Path)) and Path(source).suffix.lower() in FEATURE_SUFFIXES:
                return torch.from_numpy(utterance_features(Path(source), dim))  # audio, or .npy frames
            if isinstance(source, str) or not hasattr(source, "shape"):
                raise DataError(f"{where}: this model reads speech: an audio file (.wav, .flac, .ogg), a .npy file, "
                                f"a 16 kHz waveform (samples,) or feature frames (frames, {dim}); got "
                                f"{type(source).__name__}")
            array = source.detach().cpu().numpy() if isinstance(source, Tensor) else np.asarray(source)
            if array.ndim == 1:  # a waveform: its filterbanks
                problem = check_waveform(array)
                if problem:
                    raise DataError(f"{where}: the waveform {problem}")
                return torch.from_numpy(fbank(array, FbankOptions(num_mel_bins=dim)))
            problem = check_frames(array, dim)
            if problem:
                raise DataError(f"{where}: {problem}")
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        return self._text(source, "source", where) or None

    def _text(self, text: Any, side: str, where: str) -> list[int]:
        """The ids of one sentence of `side`, checked: a string, at most max_source_tokens pieces."""
        if not isinstance(text, str):
            raise DataError(f"{where}: a sentence must be a string, got {type(text).__name__}")
        ids = self.encode(text, side)
        limit = self.max_source_tokens
        if limit and len(ids) > limit:
            chars = len(text.rstrip("\r\n"))  # a line read from a file keeps its ending
            raise DataError(f"{where}: {len(ids)} {side} pieces ({chars:,} characters), more than "
                            f"max_source_tokens={limit} (--max-source-tokens {limit}); split it into sentences, or "
                            "raise the limit")
        return ids

    def _sources(self, sources: Sequence[Any], where) -> list[Source | None]:
        return [self._source(s, where(i)) for i, s in enumerate(sources)]

    def _prefix(self, prefix: Any, where: str) -> list[int]:
        """A target prefix's ids (None or '': none); the sources' length limit holds for it too."""
        if prefix is None:
            return []
        if not isinstance(prefix, str):
            raise DataError(f"{where}: a prefix must be a string or None, got {type(prefix).__name__}")
        return self._text(prefix, "target", where)

    def _prefixes(self, prefix: Sequence[str | None] | None, n: int) -> list[list[int]] | None:
        if prefix is None:
            return None
        _check_list(prefix, "prefix")
        if len(prefix) != n:
            raise DataError(f"prefix has {len(prefix)} entries for {n} sources; give one per source (None for none)")
        return [self._prefix(p, f"prefix[{i}]") for i, p in enumerate(prefix)]

    def constraint_ids(self, constraints: Sequence[Sequence[str] | None] | None, n: int, cfg: DecodeConfig
                       ) -> list[list[list[int]]] | None:
        """`translate`'s constraints for `n` sources as ids, checked (strings the target vocabulary can spell,
        at most MAX_PHRASES a source, beam search in `cfg`): a DataError or ConfigError names the entry."""
        return phrase_ids(constraints, n, cfg.strategy, lambda text, where: self._text(text, "target", where))

    def _pair(self, source: Any, target: Any, where_source: str, where_target: str) -> tuple[Source, list[int]]:
        """A (source, target) pair to score, checked: a source that is not empty, a target (maybe empty)."""
        checked = self._source(source, where_source)
        if checked is None:
            raise DataError(f"{where_source} is empty: there is nothing to score a translation against")
        return checked, self._text(target, "target", where_target)

    # ---------------------------------------------------------------------------------------- translate

    def translate(self, sources: Sequence[Any], *, beam: int | None = None, nbest: int | None = None,
                  prefix: Sequence[str | None] | None = None, batch_size: int | None = None,
                  batch_type: BatchType = "examples", return_attention: bool = False, alignment: bool = False,
                  alignment_layer: int = -1, alignment_heads: Sequence[int] | None = None,
                  cancelled: Callable[[int], bool] | None = None,
                  constraints: Sequence[Sequence[str] | None] | None = None, **settings: Any) -> list[Translation]:
        """Translate every source (raw sentences, or frame arrays for a frame encoder); one Translation per
        source, in order. Every source is checked before any is decoded. `prefix`: one string (or None) per
        source that its outputs must begin with. `batch_size` sentences per batch, or with batch_type
        'tokens' a budget of padded source tokens (or batch_tokens=N); outputs never depend on it.
        `alignment`: each hypothesis gets its hard alignment, for every target piece (not </s>) the source
        piece (not </s>) its cross-attention weighs most, averaged over `alignment_heads` (None: all) of
        decoder layer `alignment_layer` (-1: the last; a universal transformer's ACT step), as pairs
        (source index, target index) over `source_tokens` (a frame encoder: its model frames) and the
        hypothesis' `tokens` (fairseq's --print-alignment; tformer.inspection.hard_alignments).
        `cancelled(i)`, asked before every batch and decoding step, True once source i's translation is no
        longer wanted: it leaves its batch at once (the others decode as they would have) and its entry is None
        (tformer serve gives up on a request past its time limit this way). `constraints`: one list of target
        phrases (or None) per source that each of its outputs must hold, enforced by lexically constrained beam
        search (tformer.decode.constraints; beam search only, at most 8 phrases a sentence; a length limit too
        short for them is raised). `settings`: more DecodeConfig
        fields (strategy, len_penalty, min_len, max_len_a, max_len_b, no_repeat_ngram, repetition_penalty,
        temperature, top_k, top_p, seed, batch_tokens; `quantize` is chosen by `tformer.load`)."""
        _check_list(sources, "sources")
        _check_batch_type(batch_type)
        cfg = self.decode_settings(beam=beam, nbest=nbest, batch_size=batch_size, **settings)
        extras = self._extras(return_attention, alignment, alignment_layer, alignment_heads)
        prefixes = self._prefixes(prefix, len(sources))
        phrases = self.constraint_ids(constraints, len(sources), cfg)
        checked = self._sources(sources, lambda i: f"sources[{i}]")
        return self._translate(checked, cfg, prefixes, batch_type, extras, cancelled, phrases)

    def translate_iterable(self, sources: Iterable[Any], *, prefix: Iterable[str | None] | None = None,
                           chunk_size: int = CHUNK, name: str = "the input", prefix_name: str = "the prefixes",
                           first_line: int = 1, **options: Any) -> Iterator[Translation]:
        """Translations of a stream of sources, in input order, reading `chunk_size` at a time: memory does not
        grow with the input. `prefix`: a stream of target prefixes beside it, one per source (None or '':
        none); streams of different lengths are an error. A bad source stops the stream with an error naming
        `name` (a bad prefix `prefix_name`) and its line (the first source is line `first_line`). `options`:
        as `translate` (beam, nbest, batch_size, batch_type, return_attention, alignment, alignment_layer,
        alignment_heads, DecodeConfig fields)."""
        for value, what in ((sources, "sentences"), (prefix, "prefixes")):
            if isinstance(value, (str, bytes)):
                raise DataError(f"translate_iterable takes an iterable of {what} (a list, an open file), got a "
                                f"{type(value).__name__}")
        _check_chunk(chunk_size)
        names = (f"{name}, line {{}}", f"{prefix_name}, line {{}}", name, prefix_name)
        return self._stream(iter(sources), None if prefix is None else iter(prefix), chunk_size, names, first_line,
                            *self._options(options))

    def translate_file(self, source: str | Path | IO[bytes], output: str | Path | IO[str], *,
                       prefix_file: str | Path | IO[bytes] | None = None, name: str | None = None,
                       prefix_name: str | None = None, chunk_size: int = CHUNK, **options: Any) -> int:
        """Translate a UTF-8 text file (plain or gzip), one sentence per line, into `output` (a path, written
        under a temporary name and renamed when complete, or an open text stream): one line per input line,
        or with nbest > 1 'index ||| translation ||| score' lines (Moses n-best); with alignment=True each
        line ends in ' ||| ' and the alignment, 'source-target' index pairs ('0-0 1-2 2-1', Marian's
        format). `prefix_file`: one target prefix per input line (an empty line: none), as many lines as
        the input. Every line is checked first (UTF-8, length, the line counts), so a bad line stops it
        before anything is written; reading and decoding then stream in constant memory. Returns the number
        of lines. `name` / `prefix_name` name the files in messages. `options`: as `translate`."""
        name = name or str(source)
        settings = self._options(options)
        _check_chunk(chunk_size)
        count = 0
        for count, line in enumerate(iter_lines(source, name), 1):
            self._source(line, f"{name}, line {count}")
        if not count:
            raise DataError(f"{name} is empty: nothing to translate")
        prefixes = None
        if prefix_file is not None:
            prefix_name = prefix_name or str(prefix_file)
            n = 0
            for n, line in enumerate(iter_lines(prefix_file, prefix_name), 1):
                self._prefix(line, f"{prefix_name}, line {n}")
            if n != count:
                raise DataError(f"{name} has {count} lines but {prefix_name} has {n}; give one prefix per input "
                                "line (an empty line for none)")
        names = (f"{name}, line {{}}", f"{prefix_name}, line {{}}", name, prefix_name)
        with writing(output) as out:
            lines = iter_lines(source, name)
            if prefix_file is not None:
                prefixes = iter_lines(prefix_file, prefix_name)
            for index, translation in enumerate(self._stream(lines, prefixes, chunk_size, names, 1, *settings)):
                out.write(format_translation(translation, index, settings[0].nbest > 1, settings[2].alignment))
        return count

    def _options(self, options: dict[str, Any], only: tuple[str, ...] | None = None
                 ) -> tuple[DecodeConfig, BatchType, _Extras]:
        """Keyword options -> (decoding settings, batch type, what outputs carry), checked; `only`: the
        DecodeConfig fields allowed (None: all)."""
        options = dict(options)
        batch_type = options.pop("batch_type", "examples")
        _check_batch_type(batch_type)
        extras = self._extras(**{k: options.pop(k) for k in EXTRAS if k in options})
        unknown = sorted(set(options) - set(only)) if only is not None else []
        if unknown:
            raise ConfigError(f"scoring takes no option {', '.join(map(repr, unknown))}; it takes batch_type, "
                              f"{', '.join(only + EXTRAS)}")
        return self.decode_settings(**options), batch_type, extras

    def _stream(self, stream: Iterator[Any], prefixes: Iterator[Any] | None, chunk_size: int,
                names: tuple[str, str, str, str | None], first: int, cfg: DecodeConfig, batch_type: BatchType,
                extras: _Extras) -> Iterator[Translation]:
        """Chunks of `stream` (and of `prefixes` beside it), checked and translated in turn. `names`: formats of
        a source's and a prefix's line for messages, then the names of both streams."""
        where, prefix_where, name, prefix_name = names
        done = first
        while chunk := list(itertools.islice(stream, chunk_size)):
            checked = self._sources(chunk, lambda i: where.format(done + i))
            ids = None
            if prefixes is not None:
                part = list(itertools.islice(prefixes, len(chunk)))
                if len(part) < len(chunk):
                    raise DataError(f"{name}: more lines than {prefix_name}, whose last is line "
                                    f"{done + len(part) - 1}; give one prefix per input line (an empty one: none)")
                ids = [self._prefix(p, prefix_where.format(done + i)) for i, p in enumerate(part)]
            yield from self._translate(checked, cfg, ids, batch_type, extras)
            done += len(chunk)
        if prefixes is not None and next(prefixes, _END) is not _END:
            raise DataError(f"{prefix_name}: more lines than {name}, whose last is line {done - 1}; give one prefix "
                            "per input line")

    def _translate(self, checked: list[Source | None], cfg: DecodeConfig, prefixes: list[list[int]] | None,
                   batch_type: BatchType, extras: _Extras, cancelled: Callable[[int], bool] | None = None,
                   constraints: list[list[list[int]]] | None = None) -> list[Translation]:
        self.shortlist(cfg)  # checked against the vocabularies (translate_ids opens it)
        live = [i for i, s in enumerate(checked) if s is not None]
        gone = None if cancelled is None else (lambda j: cancelled(live[j]))
        nbest = translate_ids(self.model, [checked[i] for i in live], cfg,
                              None if prefixes is None else [prefixes[i] for i in live], batch_type,
                              gone, None if constraints is None else
                              {"constraints": [constraints[i] for i in live]}) if live else None
        kept = [(j, i) for j, i in enumerate(live) if nbest.tokens[j] is not None]
        aligned = iter(self._align([(checked[i], h) for j, i in kept for h in nbest.tokens[j]], cfg,
                                   batch_type, extras) if kept and extras.alignment else ())
        empty = [] if extras.alignment else None
        out = [Translation([], [Hypothesis("", [], 0.0, None, empty)]) for _ in checked]  # empty sources
        for j, i in enumerate(live):
            if nbest.tokens[j] is None:
                out[i] = None  # cancelled
                continue
            src, hyps = checked[i], nbest.tokens[j]
            src_pieces = [] if isinstance(src, Tensor) else self.pieces(src, "source")
            if not hyps:  # every path was ruled out (e.g. no_repeat_ngram against a constraint): say so, empty
                log.warning("source %d: no output satisfies the decoding rules (no_repeat_ngram, constraints); its "
                            "translation is empty with score -inf", i)
                out[i] = Translation(src_pieces, [Hypothesis("", [], float("-inf"), None, empty)])
                continue
            maps = [None] * len(hyps)
            if extras.attention:
                maps = attention_maps(self.model, [(src, h) for h in hyps], None if isinstance(src, Tensor) else
                                      [src_pieces] * len(hyps), [self.pieces(h) for h in hyps])
            out[i] = Translation(src_pieces, [Hypothesis(self.decode(h), self.pieces(h), float(s), m,
                                                         next(aligned) if extras.alignment else None)
                                              for h, s, m in zip(hyps, nbest.scores[j], maps)])
        return out

    def _align(self, pairs: list[tuple[Source, list[int]]], cfg: DecodeConfig, batch_type: BatchType,
               extras: _Extras) -> list[Alignment]:
        """Hard alignments of (source, target ids) pairs, in batches as decoding makes them."""
        return hard_alignments(self.model, pairs, extras.layer, extras.heads, *batching(cfg, batch_type))

    # ---------------------------------------------------------------------------------------- score, evaluate

    def score(self, sources: Sequence[Any], targets: Sequence[str], *, batch_size: int | None = None,
              batch_type: BatchType = "examples", batch_tokens: int | None = None, return_attention: bool = False,
              alignment: bool = False, alignment_layer: int = -1, alignment_heads: Sequence[int] | None = None,
              cancelled: Callable[[int], bool] | None = None) -> list[Score]:
        """Forced decoding (fairseq's score, CTranslate2's score_batch): the log-probability of each target
        given its source, token by token, </s> included. A target may be empty (</s> alone); a source may
        not. `alignment`: as `translate`, over the target's pieces. `cancelled`: as `translate` (asked
        before every batch)."""
        _check_list(sources, "sources")
        _check_list(targets, "targets")
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets; give one target per source")
        _check_batch_type(batch_type)
        cfg = self.decode_settings(batch_size=batch_size, batch_tokens=batch_tokens)
        extras = self._extras(return_attention, alignment, alignment_layer, alignment_heads)
        pairs = [self._pair(s, t, f"sources[{i}]", f"targets[{i}]") for i, (s, t) in enumerate(zip(sources, targets))]
        return self._score(pairs, cfg, batch_type, extras, cancelled)

    def score_iterable(self, pairs: Iterable[tuple[Any, str]], *, chunk_size: int = CHUNK, name: str = "the input",
                       first_line: int = 1, **options: Any) -> Iterator[Score]:
        """Scores of a stream of (source, target) pairs, in input order, `chunk_size` pairs at a time: memory
        does not grow with the input. A bad pair stops the stream with an error naming `name` and its line
        (the first pair is line `first_line`). `options`: as `score` (batch_size, batch_type, batch_tokens,
        return_attention, alignment, alignment_layer, alignment_heads)."""
        if isinstance(pairs, (str, bytes)):
            raise DataError(f"score_iterable takes an iterable of (source, target) pairs, got a "
                            f"{type(pairs).__name__}")
        _check_chunk(chunk_size)
        cfg, batch_type, extras = self._options(options, SCORE_OPTIONS)
        return self._score_stream(iter(pairs), chunk_size, name, first_line, cfg, batch_type, extras)

    def score_file(self, pairs: str | Path | IO[bytes], output: str | Path | IO[str], *, name: str | None = None,
                   format: str = "tsv", pieces: bool = False, chunk_size: int = CHUNK, **options: Any) -> int:
        """Score a UTF-8 text file (plain or gzip) of 'source<TAB>target' lines into `output` (a path, written
        under a temporary name and renamed when complete, or an open text stream), one line per pair
        (`format_score`): 'tsv' (the total log-probability, a tab, the per-token log-probabilities, </s> last;
        with `pieces` a tab and the target pieces; with alignment=True a tab and the alignment) or 'jsonl'.
        Every line is checked first (one tab, a source, UTF-8, lengths), so a bad line stops it before
        anything is written; scoring then streams in constant memory. Returns the number of lines. `name`
        names the input in messages; `options`: as `score`."""
        if format not in SCORE_FORMATS:
            raise ConfigError(f"format must be one of {', '.join(SCORE_FORMATS)}; got {format!r}")
        name = name or str(pairs)
        cfg, batch_type, extras = self._options(options, SCORE_OPTIONS)
        _check_chunk(chunk_size)
        count = 0
        for count, line in enumerate(iter_lines(pairs, name), 1):
            where = f"{name}, line {count}"
            self._pair(*parse_pair(line, where), f"{where} (source)", f"{where} (target)")
        if not count:
            raise DataError(f"{name} is empty: nothing to score")
        with writing(output) as out:
            lines = (parse_pair(line, "") for line in iter_lines(pairs, name))
            for score in self._score_stream(lines, chunk_size, name, 1, cfg, batch_type, extras):
                out.write(format_score(score, format, pieces))
        return count

    def _score_stream(self, stream: Iterator[Any], chunk_size: int, name: str, first: int, cfg: DecodeConfig,
                      batch_type: BatchType, extras: _Extras) -> Iterator[Score]:
        done = first
        while chunk := list(itertools.islice(stream, chunk_size)):
            checked = []
            for i, pair in enumerate(chunk):
                where = f"{name}, line {done + i}"
                if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                    raise DataError(f"{where}: a pair (source, target) is needed, got {type(pair).__name__}")
                checked.append(self._pair(*pair, f"{where} (source)", f"{where} (target)"))
            yield from self._score(checked, cfg, batch_type, extras)
            done += len(chunk)

    def _score(self, pairs: list[tuple[Source, list[int]]], cfg: DecodeConfig, batch_type: BatchType,
               extras: _Extras, cancelled: Callable[[int], bool] | None = None) -> list[Score]:
        self._one_model("forced-decoding scores")
        logps = score_ids(self.model, [s for s, _ in pairs], [t for _, t in pairs], *batching(cfg, batch_type),
                          cancelled=cancelled)
        kept = [i for i, logp in enumerate(logps) if logp is not None]
        aligned: list[Alignment | None] = [None] * len(pairs)
        if extras.alignment and kept:
            for i, alignment in zip(kept, self._align([pairs[i] for i in kept], cfg, batch_type, extras)):
                aligned[i] = alignment
        out = []
        for (src, tgt), logp, alignment in zip(pairs, logps, aligned):
            if logp is None:
                out.append(None)  # cancelled
                continue
            maps = None
            if extras.attention:
                labels = None if isinstance(src, Tensor) else [self.pieces(src, "source")]
                maps = attention_maps(self.model, [(src, tgt)], labels, [self.pieces(tgt)])[0]
            out.append(Score(sum(logp), self.pieces(tgt) + ["</s>"], logp, maps, alignment))
        return out

    def load_split(self, split: str = "test"):
        """A split of the data the model was trained on (its config's data section), as texts and ids
        (tformer.data.TaskData), read with the checkpoint's tokenizers."""
        from tformer.data import load_task

        return load_task(self.config.data, (split,), tokenizers=self.checkpoint.tokenizers,
                         feature_dim=self.config.model.feature_dim)

    def evaluate(self, split: str = "test", **options: Any) -> Evaluation:
        """Teacher-forced loss and token accuracy, then free-running decoding of the split scored by sacreBLEU,
        chrF and tokenized BLEU (translation; into German also with compounds split, as WMT en-de papers
        report it), CER and WER (speech) or exact match (synthetic tasks).
        `options`: beam, batch_size and DecodeConfig fields."""
        from tformer.evaluation import evaluate
        from tformer.metrics import translation_scores

        cfg = self.config
        decode = self.decode_settings(**options)
        self.shortlist(decode)  # checked against the vocabularies
        data = self.load_split(split)
        sources, refs = data.texts[split]
        speech = cfg.data.task in SPEECH_TASKS
        tic = time.perf_counter()
        metrics, hyps = evaluate(self.model, data.examples[split], cfg, decode=decode,
                                 references=refs if speech else None, tokenizer=self.target_tokenizer,
                                 forced=not self.ensemble)
        seconds = time.perf_counter() - tic
        outputs = [self.decode(h) for h in hyps]
        scores = (translation_scores(outputs, refs, cfg.data.tgt_lang, compound_split=cfg.data.tgt_lang == "de")
                  if cfg.data.task == "translation" else None)
        if scores:
            metrics.update(scores.as_dict())
        return Evaluation(split, metrics, sources, refs, outputs, decode, seconds, scores)


def _device(device: str | torch.device | None) -> torch.device:
    """None or 'auto': the GPU when PyTorch sees one, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device {device!r} is not a device; use 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for, but PyTorch sees no CUDA device here; use 'cpu'")
    return out


# ---------------------------------------------------------------------------------------- load, train, build


def load(path: str | Path | Sequence[str | Path], which: str = "best", *, device: str | torch.device | None = None,
         threads: int | None = None, max_source_tokens: int = MAX_SOURCE_TOKENS, attention: str | None = None,
         overrides: Sequence[str] = (), **decode: Any) -> Translator:
    """A Translator for a run folder (its `which` checkpoint: 'best' or 'latest') or a checkpoint folder; given
    a list of them, an ensemble (tformer.model.ensemble: the models' log-probabilities averaged at every step)
    that translates and evaluates (not score, attention or alignments), with the first one's tokenizers and
    settings (the others must have the same vocabularies).

    device: 'cpu', 'cuda', 'cuda:N'; default the GPU when there is one. threads: torch's intra-op threads
    (process-wide). max_source_tokens: longer sources are refused (0: no limit). attention: the kernel
    ('sdpa', 'dense', 'graph'). decode: decoding defaults, DecodeConfig fields (beam_size=5, len_penalty=1.0,
    ...); two of them fix how the weights are held, for the Translator's life: precision='bf16' (or 'fp16';
    tformer.precision) and quantize='int8'. overrides: the same as dotted strings ('decode.beam_size=5');
    like the command line, only decode.* and model.attention may change after training."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be a whole number >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    if isinstance(max_source_tokens, bool) or not isinstance(max_source_tokens, int) or max_source_tokens < 0:
        raise ConfigError(f"max_source_tokens must be a whole number >= 0 (0: no limit), got {max_source_tokens!r}")
    target = _device(device)
    check_inference_overrides(list(overrides))
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise ConfigError("load needs a checkpoint or run folder (a list: at least one)")
    ckpts = []
    for p in paths:
        ckpt = open_checkpoint(p, which=which, overrides=list(overrides))
        cfg = ckpt.cfg
        if attention is not None:
            cfg = dataclasses.replace(cfg, model=updated(cfg.model, "model", {"attention": attention}))
        ckpts.append(dataclasses.replace(ckpt, cfg=dataclasses.replace(cfg, decode=updated(cfg.decode, "decode",
                                                                                           decode))))
    first = ckpts[0]
    for c in ckpts[1:]:
        if any(a.fingerprint() != b.fingerprint() for a, b in zip(c.tokenizers, first.tokenizers)):
            raise ConfigError(f"{c.path} and {first.path} have different vocabularies; an ensemble's checkpoints "
                              "must share their tokenizers (runs of one recipe on one corpus)")
        if c.cfg.model.source != first.cfg.model.source:
            raise ConfigError(f"{c.path} and {first.path} read different inputs (model.source)")
    models = [model_from(c, target) for c in ckpts]
    translator = Translator(first, models[0] if len(models) == 1 else Ensemble(models), max_source_tokens)
    translator.shortlist()  # a missing or mismatched shortlist is refused now, not at the first translation
    return translator


def build_model(config: Config | ModelConfig, src_vocab_size: int, tgt_vocab_size: int | None = None):
    """A freshly initialised model of `config` (or of its model section) for vocabularies of these sizes (the
    target's defaults to the source's)."""
    from tformer.model import build_model as build

    cfg = config.model if isinstance(config, Config) else config
    return build(cfg, src_vocab_size, tgt_vocab_size or src_vocab_size)
