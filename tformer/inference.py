"""Glue between a model and the searches in tformer.decode: batches of ids in, n-best ids or log-probabilities
out. Text never appears here (tformer.api turns text into ids and back).

    translate_ids(model, sources, decode, prefixes=None)   -> NBest, in input order
    score_ids(model, sources, targets)                     -> per-token log-probabilities (</s> included)
    ... cancelled=f                                        f(i) True: sentence i is no longer wanted (None)
    load_model(path, which, overrides, device)             -> (Checkpoint, model in eval mode)

Sources are id lists without specials (</s> is added here), or float frames (S, F) for a frame encoder.
Batches take sentences longest first: `batch_size` sentences each (batch_type "examples"), or as many as
fit `batch_size` tokens counted as sentences x longest source, padded (batch_type "tokens"); with
decode.batch_tokens > 0, batches of that many tokens unless a caller asks for "tokens" itself (`batching`).
No sentence's result depends on the batch it lands in (the searches drop finished sentences; tests compare
batch 1 and 7), and so a sentence can leave its batch when its caller gives up on it: `cancelled(i)`, asked
before every batch and every decoding step, True once sentence i's result is no longer wanted; its entry in
the result is then None, and the other sentences' results stay what they would have been.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import time
from typing import Callable, Literal, Sequence

import torch
from torch import Tensor

from tformer.config import DecodeConfig, check_inference_overrides
from tformer.data.batching import pad_frames, pad_sequences
from tformer.data.vocab import Vocab
from tformer.decode import NBest, max_lengths, search
from tformer.decode.phrases import Phrases, phrase_input
from tformer.model import Transformer, build_model
from tformer.shortlist import Shortlist, restrict
from tformer.convert import open_checkpoint
from tformer.checkpoint import Checkpoint

Source = list[int] | Tensor  # ids without specials, or frames (S, F)
BatchType = Literal["examples", "tokens"]
Cancelled = Callable[[int], bool]  # a sentence's index in the input -> True once its result is not wanted


def decode_batches(lengths: Sequence[int], batch_size: int, batch_type: BatchType = "examples") -> list[list[int]]:
    """Indices longest first, cut into batches of `batch_size` sentences, or of at most `batch_size` padded
    tokens (sentences x longest; a sentence longer than the budget goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if batch_type == "examples":
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if batch_type != "tokens":
        raise ValueError(f"batch_type must be 'examples' or 'tokens', got {batch_type!r}")
    out: list[list[int]] = []
    for i in order:  # longest first: the first sentence of a batch fixes its padded width
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= batch_size:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def batching(cfg: DecodeConfig, batch_type: BatchType = "examples") -> tuple[int, BatchType]:
    """(budget, batch type) for decode_batches: a caller's batch_type 'tokens' counts cfg.batch_size tokens;
    otherwise decode.batch_tokens > 0 asks for batches of that many padded source tokens, else batch_size
    sentences."""
    if batch_type == "tokens":
        return cfg.batch_size, "tokens"
    return (cfg.batch_tokens, "tokens") if cfg.batch_tokens > 0 else (cfg.batch_size, "examples")


def _source_batch(model: Transformer, sources: list[Source]) -> tuple[Tensor, Tensor]:
    """Padded ids with </s> (B, S), or padded frames (B, S, F); lengths (B,)."""
    device = next(model.parameters()).device
    if isinstance(sources[0], Tensor):
        return pad_frames(sources).to(device), torch.tensor([len(s) for s in sources], device=device)
    src = pad_sequences(sources, Vocab.pad, last=Vocab.eos)[0].to(device)  # (B, S)
    return src, torch.tensor([len(s) + 1 for s in sources], device=device)


def _lengths(sources: list[Source]) -> list[int]:
    return [len(s) + (0 if isinstance(s, Tensor) else 1) for s in sources]


@torch.inference_mode()
def translate_ids(model: Transformer, sources: list[Source], cfg: DecodeConfig,
                  prefixes: list[list[int]] | None = None, batch_type: BatchType = "examples",
                  cancelled: Cancelled | None = None, phrases: Phrases | None = None) -> NBest:
    """Decode every source with the search `cfg` describes; results in input order. `prefixes` (one id list
    per source, possibly empty) force the start of each output; `phrases`: the rules' phrase inputs by name
    (decode.PHRASE_INPUTS), each one list of phrases (id lists) or None per source; "constraints" are held by
    every output (beam search; decode.constraints). The length limit is a * (model source
    length) + b: tokens, or model frames after stacking. `cancelled`: see the module docstring (a cancelled
    sentence's tokens and scores are None). With cfg.shortlist, each sentence outputs only the target ids its
    lexical shortlist allows (and its prefix's and constraints' tokens), the output projection computed for the
    batch's lists only (tformer.shortlist)."""
    shortlist = Shortlist.open(cfg.shortlist) if cfg.shortlist else None
    was_training = model.training
    model.eval()
    tokens: list[list[list[int]] | None] = [[] for _ in sources]
    scores: list[list[float] | None] = [[] for _ in sources]
    try:
        for rows in decode_batches(_lengths(sources), *batching(cfg, batch_type)):
            stop = None
            if cancelled is not None:
                rows = [i for i in rows if not cancelled(i)]
                if not rows:
                    continue
                stop = _stop(cancelled, rows)
            src, src_lengths = _source_batch(model, [sources[i] for i in rows])
            enc = model.encode(src, src_lengths)
            cache = model.init_cache(enc)
            n_src = enc.mask.sum(1) - (0 if src.is_floating_point() else 1)  # (B,) without </s>
            limit = max_lengths(n_src, cfg.max_len_a, cfg.max_len_b)  # (B,)
            prefix = [prefixes[i] for i in rows] if prefixes is not None else None
            batch = {name: [per[i] for i in rows] for name, per in (phrases or {}).items() if per is not None}
            compiled = getattr(model, "compiled_step", None)  # decode.compile (tformer.model.compiled)
            if shortlist is None and compiled is not None and compiled.wins(len(rows) * _rows_per_sentence(cfg)):
                hyp = search(compiled, compiled.start(cache), limit, cfg, ids=rows, prefix=prefix, stop=stop,
                             phrases=batch)
            elif shortlist is None:
                hyp = search(model.decode_step, cache, limit, cfg, ids=rows, prefix=prefix, stop=stop, phrases=batch)
            else:  # the search runs in the columns of the batch's lists
                allowed = [shortlist.allowed(sources[i], _forced(prefix, batch, j)) for j, i in enumerate(rows)]
                r = restrict(model, cache, allowed, model.generator.out_features)
                hyp = r.tokens(search(r.step, r.cache, limit, cfg, ids=rows, prefix=r.columns(prefix), stop=stop,
                                      phrases={name: r.columns(per) if phrase_input(name).written else
                                               r.reachable(per) for name, per in batch.items()}))
            for i, toks, score in zip(rows, hyp.tokens, hyp.scores):
                tokens[i], scores[i] = toks, score
    finally:
        model.train(was_training)
    for i in _gone(cancelled, len(sources)):
        tokens[i] = scores[i] = None
    return NBest(tokens, scores)


def _rows_per_sentence(cfg: DecodeConfig) -> int:
    """The hypotheses a search decodes per sentence: beam K, sampling's draws, greedy's one."""
    return cfg.beam_size if cfg.strategy == "beam" else cfg.nbest if cfg.strategy == "sample" else 1


def _forced(prefix: list[list[int]] | None, phrases: Phrases, j: int) -> list[int]:
    """The target ids sentence j of a batch must be able to output whatever its shortlist: its prefix's and the
    tokens of its phrase inputs that outputs write (PhraseInput.written: the constraints')."""
    ids = list(prefix[j]) if prefix is not None else []
    for name, per in phrases.items():
        if phrase_input(name).written:
            for phrase in per[j] or []:
                ids += phrase
    return ids


def _stop(cancelled: Cancelled, rows: list[int]):
    """The searches' stop function (tformer.decode.Stop) for a batch of input sentences `rows`."""
    return lambda live: [cancelled(rows[r]) for r in live]


def _gone(cancelled: Cancelled | None, n: int) -> list[int]:
    return [] if cancelled is None else [i for i in range(n) if cancelled(i)]


@torch.inference_mode()
def score_ids(model: Transformer, sources: list[Source], targets: list[list[int]], batch_size: int = 250,
              batch_type: BatchType = "examples", cancelled: Cancelled | None = None) -> list[list[float] | None]:
    """Forced decoding: the log-probability of every target token and of the closing </s> under the model
    (len(target) + 1 values per pair), by one teacher-forced forward pass per batch. `cancelled`: see the
    module docstring (asked before every batch)."""
    was_training = model.training
    model.eval()
    out: list[list[float] | None] = [[] for _ in sources]
    lengths = [max(a, len(t) + 1) for a, t in zip(_lengths(sources), targets)]
    try:
        for rows in decode_batches(lengths, batch_size, batch_type):
            if cancelled is not None:
                rows = [i for i in rows if not cancelled(i)]
                if not rows:
                    continue
            src, src_lengths = _source_batch(model, [sources[i] for i in rows])
            device = src.device
            tgt_in = pad_sequences([targets[i] for i in rows], Vocab.pad, first=Vocab.bos)[0].to(device)  # (B, T)
            gold = torch.tensor([t for i in rows for t in targets[i] + [Vocab.eos]], device=device)  # (Nt,)
            tgt_lengths = torch.tensor([len(targets[i]) + 1 for i in rows], device=device)  # (B,)
            hidden = model(src, src_lengths, tgt_in, tgt_lengths).real()  # (Nt, D), sentence after sentence
            logp = torch.log_softmax(model.generator(hidden).float(), -1)  # (Nt, V)
            picked = logp.gather(1, gold[:, None])[:, 0].tolist()  # (Nt,)
            start = 0
            for i in rows:
                n = len(targets[i]) + 1
                out[i], start = picked[start : start + n], start + n
    finally:
        model.train(was_training)
    for i in _gone(cancelled, len(sources)):
        out[i] = None
    return out


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the system (a
    process-wide setting; True when it took). Decoding allocates logits and caches of a few MB at every step;
    by default each such block is mapped fresh and every page of it faults on first touch (about 70,000
    faults and 5-8% of the time of a beam-5 run over 128 sentences, benchmarks/RESULTS.md). Blocks above 32 MiB
    (glibc's largest mmap threshold; a 64 x 4 beam's logits over a 58k vocabulary are 59 MB) would still be
    mapped fresh, so mmap is turned off altogether: every block comes from the heap, which keeps what is freed
    (measured: a 256 x 58k log-softmax 37 ms with 305,000 page faults, 16 ms with none). Memory then stays at
    its high-water mark, as with any caching allocator. TFORMER_KEEP_FREED_MEMORY=0 leaves malloc alone."""
    if os.environ.get("TFORMER_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
        libc.malloc_trim(0)  # first hand back what is free now (a model's loading leaves much behind)
        return (bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
                and bool(libc.mallopt(M_MMAP_MAX, 0)))
    except (OSError, AttributeError):  # not glibc
        return False


def model_from(ckpt: Checkpoint, device: str | torch.device | None = None) -> Transformer:
    """The checkpoint's model with its weights, in eval mode on `device` (default: the CPU), in the format
    decode.precision and decode.quantize ask for (tformer.precision.for_inference: bf16/fp16 weights, or int8
    linear layers; a device that cannot run it is a ConfigError). Decoding's freed memory is kept for reuse from
    here on (`keep_freed_memory`)."""
    from tformer.precision import check_decode, for_inference

    decode = ckpt.cfg.decode
    check_decode(decode.precision, decode.quantize, torch.device(device or "cpu"))  # before building anything
    model = build_model(ckpt.cfg.model, *(len(t.vocab) for t in ckpt.tokenizers))
    ckpt.load_model_state(model)
    model = for_inference(model.to(device or "cpu").eval(), decode.precision, decode.quantize)
    if decode.compile:
        from tformer.model.compiled import compile_step

        model.compiled_step = compile_step(model)
    keep_freed_memory()  # after loading: what loading freed (a random initialisation, fp32 copies) goes back
    return model


def load_model(path: str, which: str = "best", overrides: Sequence[str] = (),
               device: str | torch.device | None = None) -> tuple[Checkpoint, Transformer]:
    """A run folder's `which` checkpoint (or a checkpoint folder) and its model (see `model_from`).
    `overrides` may change only what inference may (decode.*, model.attention)."""
    check_inference_overrides(list(overrides))
    ckpt = open_checkpoint(path, which=which, overrides=list(overrides))
    return ckpt, model_from(ckpt, device)


def warm_up_sizes(largest: int) -> list[int]:
    """The batch sizes a warm-up decodes: 1, 2, 4, .. up to `largest` (and it); none for 0."""
    sizes = [n for n in (1 << i for i in range(largest.bit_length())) if n < largest]
    return sizes + [largest] if largest else []


WARM_UP = tuple(warm_up_sizes(64))  # the batch sizes a server warms by default


def warm_up(model: Transformer, cfg: DecodeConfig, sentences: Sequence[int] = WARM_UP) -> dict[int, float]:
    """Decode a short made-up batch of each size in `sentences`, a few positions, with the search `cfg` describes,
    so that what a model does once per shape (oneDNN's products plan each row count at its first call) is done
    before the first real request; the seconds each size took. A server calls it before it answers."""
    frames = model.cfg.source == "features"
    source: Source = torch.zeros(8, model.cfg.feature_dim) if frames else list(range(4, 12))
    short = dataclasses.replace(cfg, max_len_a=0.0, max_len_b=4, min_len=0, batch_tokens=0, shortlist=None)
    seconds = {}
    for n in sentences:
        tic = time.perf_counter()
        translate_ids(model, [source] * n, dataclasses.replace(short, batch_size=n))
        seconds[n] = time.perf_counter() - tic
    return seconds
