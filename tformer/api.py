"""The public face of tformer: load a trained model and translate, score and evaluate with it; train and build
models from Python. The command line, the HTTP service (tformer.serve), the explorer page and the exporters
are thin layers over this module.

    translator = tformer.load("runs/m30k")                 # a run folder (its best checkpoint) or a checkpoint
    translator.translate(["A dog runs on the beach ."])[0].text
    translator.translate(lines, beam=5, nbest=3)           # Translation.hypotheses: the n-best list, best first
    translator.translate(lines, target="fr")               # a multilingual model: which language to write
    translator.translate(lines, prefix=["Ein Hund", None]) # force the start of an output
    translator.translate(lines, beam=5, constraints=[["Strand"], None])  # phrases each output must hold
    translator.translate(lines, alignment=True)[0].hypotheses[0].alignment   # [(source i, target j), ...]
    plan = translator.prepare(lines, beam=5)              # checked and tokenised once (tformer.plan.Plan)
    translator.run([plan, other_plan])                     # plans of one key decoded together, split per plan
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
Decoding settings are DecodeConfig's fields (tformer.config): the checkpoint's decode section (what its recipe
named) unless `load` or a call overrides them; `beam=N` is short for strategy beam with beam_size N (1:
greedy). Bad input raises a tformer.errors.TformerError naming what and
where (the list index, the file and line, the setting).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from tformer.config import Config, DecodeConfig, ModelConfig, check_inference_overrides, updated
from tformer.data.corpus import normalize
from tformer.decode.phrases import PHRASE_INPUTS
from tformer.inputs import check_batch_type as _check_batch_type
from tformer.inputs import check_list as _check_list
from tformer.inputs import check_decode_keys, decode_fields  # noqa: F401  (decode_fields: the command line's)
from tformer.errors import ConfigError, DataError
from tformer.languages import Languages, Tags, language_tags
from tformer import plan as plans_
from tformer import streams
from tformer.plan import Decoding, Extras, Plan
from tformer.inference import WARM_UP, BatchType, Source, batching, model_from, score_ids, translate_ids, warm_up
from tformer.inspection import attention_maps, check_alignment, hard_alignments, token_labels
from tformer.model.ensemble import Ensemble
from tformer.shortlist import Shortlist
from tformer.results import (SCORE_FORMATS, Alignment, Evaluation, Hypothesis, Score, Translation,  # noqa: F401
                             format_score, format_translation)
from tformer.convert import open_checkpoint
from tformer.checkpoint import Checkpoint

MAX_SOURCE_TOKENS = 1024  # default limit on a source's pieces: attention memory grows with its square
CHUNK = streams.CHUNK  # sentences read, sorted by length and decoded together by the streaming forms
EXTRAS = ("return_attention", "alignment", "alignment_layer", "alignment_heads")  # what outputs carry, on request
SCORE_OPTIONS = ("batch_size", "batch_tokens")  # the decoding settings scoring reads
log = logging.getLogger("tformer")


@dataclass
class _Found:
    """One decoded sentence of a plan, while its Translation is made."""

    index: int  # in the plan
    source: Source
    tokens: list[list[int]] | None  # the n-best ids, best first (empty: every path ruled out; None: cancelled)
    scores: list[float]
    alignments: list[Alignment | None]


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

    @property
    def languages(self) -> Languages | None:
        """The directions of a multilingual model (tformer.languages; None: one pair, config.data's)."""
        return Languages.of(self.config.data)

    def language_tags(self, target: str | None = None, source: str | None = None) -> Tags | None:
        """The ids a multilingual model's sources and outputs start with for `target` (tformer.languages)."""
        return language_tags(self.config.data, self.source_tokenizer.vocab, target, source, self.path)

    # ---------------------------------------------------------------------------------------- checks

    def decode_settings(self, *, beam: int | None = None, nbest: int | None = None, batch_size: int | None = None,
                        **settings: Any) -> DecodeConfig:
        """The loaded defaults with these settings (DecodeConfig fields) on top, checked. `quantize` and
        `precision` are chosen when the model is loaded (its weights change), and `compile` then too, so a call may
        only repeat them."""
        for key in ("quantize", "precision", "compile"):
            loaded = getattr(self.config.decode, key)
            if settings.get(key, loaded) != loaded:
                raise ConfigError(f"config key 'decode.{key}': the model was loaded with {key}={loaded!r}; it is "
                                  f"chosen when loading (tformer.load(..., {key}={settings[key]!r})), not per call")
        check_decode_keys(settings)
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
                alignment_heads: Sequence[int] | None = None) -> Extras:
        if return_attention or alignment:
            self._one_model("attention maps and alignments")
        heads = None if self.ensemble else check_alignment(self.model, alignment_layer, alignment_heads)
        return Extras(bool(return_attention), bool(alignment), alignment_layer, heads)

    def decoding(self, *, beam: int | None = None, nbest: int | None = None, batch_size: int | None = None,
                 batch_type: BatchType = "examples", return_attention: bool = False, alignment: bool = False,
                 alignment_layer: int = -1, alignment_heads: Sequence[int] | None = None,
                 **settings: Any) -> Decoding:
        """How a call decodes (tformer.plan.Decoding), checked: `decode_settings` and what outputs carry."""
        _check_batch_type(batch_type)
        cfg = self.decode_settings(beam=beam, nbest=nbest, batch_size=batch_size, **settings)
        return Decoding(cfg, self._extras(return_attention, alignment, alignment_layer, alignment_heads), batch_type)

    # ---------------------------------------------------------------------------------------- translate

    def translate(self, sources: Sequence[Any], *, target: str | None = None, source: str | None = None,
                  beam: int | None = None, nbest: int | None = None, prefix: Sequence[str | None] | None = None,
                  batch_size: int | None = None, batch_type: BatchType = "examples", return_attention: bool = False,
                  alignment: bool = False, alignment_layer: int = -1, alignment_heads: Sequence[int] | None = None,
                  cancelled: Callable[[int], bool] | None = None, **settings: Any) -> list[Translation]:
        """Translate every source (raw sentences, or frame arrays for a frame encoder); one Translation per
        source, in order. Every source is checked before any is decoded. `target` (and `source`): languages, which a
        multilingual model needs (its `languages`). `prefix`: one string (or None) per source that its outputs
        must begin with. `batch_size` sentences per batch, or with batch_type 'tokens' a budget of padded source
        tokens (or batch_tokens=N); outputs never depend on it.
        `alignment`: each hypothesis gets its hard alignment, for every target piece (not </s>) the source
        piece (not </s>) its cross-attention weighs most, averaged over `alignment_heads` (None: all) of
        decoder layer `alignment_layer` (-1: the last; a universal transformer's ACT step), as pairs
        (source index, target index) over `source_tokens` (a frame encoder: its model frames) and the
        hypothesis' `tokens` (fairseq's --print-alignment; tformer.inspection.hard_alignments).
        `cancelled(i)`, asked before every batch and decoding step, True once source i's translation is no
        longer wanted: it leaves its batch at once (the others decode as they would have) and its entry is None
        (tformer serve gives up on a request past its time limit this way). Phrase inputs (decode.PHRASE_INPUTS),
        one list of target phrases (or None) per source: `constraints`, phrases each of its outputs must hold,
        enforced by lexically constrained beam search (tformer.decode.constraints; beam search only, at most 8
        phrases a sentence; a length limit too short for them is raised). `settings`: more DecodeConfig
        fields (strategy, len_penalty, min_len, max_len_a, max_len_b, no_repeat_ngram, repetition_penalty,
        temperature, top_k, top_p, seed, batch_tokens; `quantize` is chosen by `tformer.load`)."""
        return self.run([self.prepare(sources, target=target, source=source, beam=beam, nbest=nbest, prefix=prefix,
                                      batch_size=batch_size, batch_type=batch_type, return_attention=return_attention,
                                      alignment=alignment, alignment_layer=alignment_layer,
                                      alignment_heads=alignment_heads, **settings)], cancelled)[0]

    def warm_up(self, sentences: Sequence[int] = WARM_UP) -> dict[int, float]:
        """Decode a made-up batch of each size, so the first request pays nothing once per shape; seconds per size
        (tformer.inference.warm_up)."""
        return warm_up(self.model, self.config.decode, sentences)

    def prepare(self, sources: Sequence[Any], *, target: str | None = None, source: str | None = None,
                prefix: Sequence[str | None] | None = None, beam: int | None = None,
                nbest: int | None = None, batch_size: int | None = None, batch_type: BatchType = "examples",
                return_attention: bool = False, alignment: bool = False, alignment_layer: int = -1,
                alignment_heads: Sequence[int] | None = None, **inputs_and_settings: Any) -> Plan:
        """`translate`'s sources and options as a Plan (tformer.plan): every check `translate` makes, each text
        (source, prefix, phrase) tokenised once. Keywords named in decode.PHRASE_INPUTS are phrase inputs
        (constraints), the others DecodeConfig fields."""
        phrases = {p.name: inputs_and_settings.pop(p.name) for p in PHRASE_INPUTS if p.name in inputs_and_settings}
        _check_list(sources, "sources")
        tags = self.language_tags(target, source)
        decoding = self.decoding(beam=beam, nbest=nbest, batch_size=batch_size, batch_type=batch_type,
                                 return_attention=return_attention, alignment=alignment,
                                 alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                 **inputs_and_settings)
        return plans_.prepare(self, decoding, sources, prefix, phrases, tags)

    def run(self, plans: Sequence[Plan], cancelled: Callable[[int], bool] | None = None
            ) -> list[list[Translation | None]]:
        """Decode plans of one key (Plan.key; else a ValueError naming the setting that differs) as one list of
        sentences; `cancelled(i)` (as `translate`) indexes that list. The Translations come back per plan."""
        out = self._translate(plans_.join(plans), cancelled)
        sizes = list(itertools.accumulate(len(p) for p in plans))
        return [out[end - len(p) : end] for p, end in zip(plans, sizes)]

    def translate_iterable(self, sources: Iterable[Any], *, prefix: Iterable[str | None] | None = None,
                           chunk_size: int = CHUNK, name: str = "the input", prefix_name: str = "the prefixes",
                           first_line: int = 1, **options: Any) -> Iterator[Translation]:
        """Translations of a stream of sources, in input order, reading `chunk_size` at a time: memory does not
        grow with the input. `prefix`: a stream of target prefixes beside it, one per source (None or '':
        none); streams of different lengths are an error. A bad source stops the stream with an error naming
        `name` (a bad prefix `prefix_name`) and its line (the first source is line `first_line`). `options`:
        as `translate` (beam, nbest, batch_size, batch_type, return_attention, alignment, alignment_layer,
        alignment_heads, DecodeConfig fields); a phrase input (constraints=...) is a stream beside the
        sources too, one list of phrases (or None) per source."""
        return streams.translate_iterable(self, sources, prefix, chunk_size, name, prefix_name, first_line,
                                          dict(options))

    def translate_file(self, source: str | Path | IO[bytes], output: str | Path | IO[str], /, *,
                       prefix_file: str | Path | IO[bytes] | None = None,
                       phrase_files: dict[str, str | Path | IO[bytes]] | None = None, name: str | None = None,
                       prefix_name: str | None = None, chunk_size: int = CHUNK, **options: Any) -> int:
        """Translate a UTF-8 text file (plain or gzip), one sentence per line, into `output` (a path, written
        under a temporary name and renamed when complete, or an open text stream): one line per input line,
        or with nbest > 1 'index ||| translation ||| score' lines (Moses n-best); with alignment=True each
        line ends in ' ||| ' and the alignment, 'source-target' index pairs ('0-0 1-2 2-1', Marian's
        format). `prefix_file`: one target prefix per input line (an empty line: none), as many lines as
        the input; `phrase_files`: a phrase input's name (decode.PHRASE_INPUTS: constraints, ...) -> a file of
        one line per input line, its phrases separated by tabs (an empty line: none). Every line is checked
        first (UTF-8, length, the line counts), so a bad line stops it before anything is written; reading and
        decoding then stream in constant memory. Returns the number of lines. `name` / `prefix_name` name the
        files in messages. `options`: as `translate`."""
        return streams.translate_file(self, source, output, prefix_file, phrase_files, name, prefix_name,
                                      chunk_size, dict(options))

    def _options(self, options: dict[str, Any], only: tuple[str, ...] | None = None) -> Decoding:
        """Keyword options (beam, batch_type, the alignment options, DecodeConfig fields) as a Decoding, checked;
        `only`: the DecodeConfig fields allowed (None: all)."""
        unknown = sorted(set(options) - {"batch_type", *EXTRAS, *only}) if only is not None else []
        if unknown:
            raise ConfigError(f"scoring takes no option {', '.join(map(repr, unknown))}; it takes batch_type, "
                              f"{', '.join(only + EXTRAS)}")
        return self.decoding(**options)

    def _translate(self, plan: Plan, cancelled: Callable[[int], bool] | None = None) -> list[Translation | None]:
        """Decode a plan's sentences (empty ones are not decoded); None for a cancelled one."""
        cfg, extras = plan.decoding.cfg, plan.decoding.extras
        self.shortlist(cfg)  # checked against the vocabularies (translate_ids opens it)
        live = [i for i, s in enumerate(plan.sources) if s is not None]
        ids = [list(s) if isinstance(s, tuple) else s for s in (plan.sources[i] for i in live)]
        prefixes = None if plan.prefixes is None else [list(plan.prefixes[i]) for i in live]
        phrases = {name: [None if per[i] is None else [list(p) for p in per[i]] for i in live]
                   for name, per in plan.phrases.items()}
        gone = None if cancelled is None else (lambda j: cancelled(live[j]))
        nbest = translate_ids(self.model, ids, cfg, prefixes, plan.decoding.batch_type, gone, phrases) if live else None
        found = {i: _Found(i, src, toks, scores, []) for i, src, toks, scores in
                 zip(live, ids, nbest.tokens, nbest.scores)} if live else {}
        kept = [f for f in found.values() if f.tokens is not None]  # not cancelled
        if extras.alignment and kept:
            aligned = iter(self._align([(f.source, h) for f in kept for h in f.tokens], cfg, plan.decoding.batch_type,
                                       extras))
            for f in kept:
                f.alignments = [next(aligned) for _ in f.tokens]
        empty = [] if extras.alignment else None
        return [Translation([], [Hypothesis("", [], 0.0, None, empty)]) if i not in found  # an empty source
                else None if found[i].tokens is None else self._translation(found[i], extras)  # None: cancelled
                for i in range(len(plan))]

    def _translation(self, found: _Found, extras: Extras) -> Translation:
        src, hyps = found.source, found.tokens
        src_pieces = [] if isinstance(src, Tensor) else self.pieces(src, "source")
        if not hyps:  # every path was ruled out (e.g. no_repeat_ngram against a constraint): say so, empty
            log.warning("source %d: no output satisfies the decoding rules (no_repeat_ngram, constraints); its "
                        "translation is empty with score -inf", found.index)
            return Translation(src_pieces, [Hypothesis("", [], float("-inf"), None, [] if extras.alignment else None)])
        maps = [None] * len(hyps)
        if extras.attention:
            maps = attention_maps(self.model, [(src, h) for h in hyps], None if isinstance(src, Tensor) else
                                  [src_pieces] * len(hyps), [self.pieces(h) for h in hyps])
        alignments = found.alignments or [None] * len(hyps)
        return Translation(src_pieces, [Hypothesis(self.decode(h), self.pieces(h), float(s), m, a)
                                        for h, s, m, a in zip(hyps, found.scores, maps, alignments)])

    def _align(self, pairs: list[tuple[Source, list[int]]], cfg: DecodeConfig, batch_type: BatchType,
               extras: Extras) -> list[Alignment]:
        """Hard alignments of (source, target ids) pairs, in batches as decoding makes them."""
        return hard_alignments(self.model, pairs, extras.layer, extras.heads, *batching(cfg, batch_type))

    # ---------------------------------------------------------------------------------------- score, evaluate

    def score(self, sources: Sequence[Any], targets: Sequence[str], *, target: str | None = None,
              source: str | None = None, batch_size: int | None = None,
              batch_type: BatchType = "examples", batch_tokens: int | None = None, return_attention: bool = False,
              alignment: bool = False, alignment_layer: int = -1, alignment_heads: Sequence[int] | None = None,
              cancelled: Callable[[int], bool] | None = None) -> list[Score]:
        """Forced decoding (fairseq's score, CTranslate2's score_batch): the log-probability of each target
        given its source, token by token, </s> included. A target may be empty (</s> alone); a source may
        not. `target`, `source`: the languages, as `translate`. `alignment`: as `translate`, over the target's
        pieces. `cancelled`: as `translate` (asked before every batch)."""
        _check_list(sources, "sources")
        _check_list(targets, "targets")
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets; give one target per source")
        decoding = self.decoding(batch_size=batch_size, batch_tokens=batch_tokens, batch_type=batch_type,
                                 return_attention=return_attention, alignment=alignment,
                                 alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        tags = self.language_tags(target, source)
        pairs = [plans_.pair_ids(self, s, t, f"sources[{i}]", f"targets[{i}]", tags)
                 for i, (s, t) in enumerate(zip(sources, targets))]
        return self._score(pairs, decoding, cancelled)

    def score_iterable(self, pairs: Iterable[tuple[Any, str]], *, chunk_size: int = CHUNK, name: str = "the input",
                       first_line: int = 1, **options: Any) -> Iterator[Score]:
        """Scores of a stream of (source, target) pairs, in input order, `chunk_size` pairs at a time: memory
        does not grow with the input. A bad pair stops the stream with an error naming `name` and its line
        (the first pair is line `first_line`). `options`: as `score` (batch_size, batch_type, batch_tokens,
        return_attention, alignment, alignment_layer, alignment_heads)."""
        return streams.score_iterable(self, pairs, chunk_size, name, first_line, self._options(options, SCORE_OPTIONS))

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
        return streams.score_file(self, pairs, output, name, format, pieces, chunk_size,
                                  self._options(options, SCORE_OPTIONS))

    def _score(self, pairs: list[tuple[Source, list[int]]], decoding: Decoding,
               cancelled: Callable[[int], bool] | None = None) -> list[Score]:
        cfg, batch_type, extras = decoding.cfg, decoding.batch_type, decoding.extras
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

    def load_split(self, split: str = "test", pairs: Sequence[str] | None = None):
        """A split of the data the model was trained on (its config's data section; a multilingual model's
        directions may be other `pairs` of its languages), as texts and ids (tformer.data.TaskData), read with
        the checkpoint's tokenizers."""
        from tformer.data import load_task

        data = self.config.data if pairs is None else updated(self.config.data, "data", {"pairs": list(pairs)})
        return load_task(data, (split,), tokenizers=self.checkpoint.tokenizers, feature_dim=self.config.model.feature_dim)

    def evaluate(self, split: str = "test", pairs: Sequence[str] | None = None, **options: Any) -> Evaluation:
        """Teacher-forced loss and token accuracy, then free-running decoding of the split scored by sacreBLEU,
        chrF and tokenized BLEU (translation; into German also with compounds split, as WMT en-de papers
        report it; a multilingual model per direction, and their mean), CER and WER (speech) or exact match
        (synthetic tasks). `pairs`: a multilingual model's directions to score (default: its data.pairs; any
        pair of the languages it knows, zero-shot ones too). `options`: beam, batch_size and DecodeConfig fields."""
        from tformer.evaluation import evaluate_split

        return evaluate_split(self, split, self.decode_settings(**options), pairs)


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
    ...); three of them fix how the weights are held, for the Translator's life: precision='bf16' (or 'fp16';
    tformer.precision), quantize='int8', and compile=True (the decoding step compiled ahead of time:
    tformer.model.compiled). overrides: the same as dotted strings ('decode.beam_size=5');
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
    if len(ckpts) > 1 and first.cfg.decode.compile:
        raise ConfigError("decode.compile: an ensemble decodes eagerly (each model's step is compiled on its own); "
                          "load one checkpoint to compile its step, or leave compile off")
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
