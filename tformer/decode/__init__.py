"""Decoding sees a step function and a cache, never the model class.

    step(tokens (N,), cache) -> (logits (N, V), cache)

The cache is a dict of tensors with the batch first. Entries named "hyp.*" have one row per hypothesis,
the others one row per sentence, shared by that sentence's hypotheses (see `common.HYP_PREFIX`).
"""

from __future__ import annotations

from torch import Tensor

from tformer.config import DecodeConfig
from tformer.data.vocab import Vocab
from tformer.decode.beam import beam_search, length_penalty
from tformer.decode.common import (HYP_PREFIX, Cache, Hypotheses, NBest, StepFn, forbid, max_lengths,
                                   select_hyps, select_rows)
from tformer.decode.greedy import greedy_search
from tformer.decode.sampling import filter_logits, sample

__all__ = ["HYP_PREFIX", "Cache", "Hypotheses", "NBest", "StepFn", "beam_search", "filter_logits", "forbid",
           "greedy_search", "length_penalty", "max_lengths", "sample", "search", "select_hyps", "select_rows"]


def search(step: StepFn, cache: Cache, max_len: Tensor, cfg: DecodeConfig, ids: list[int] | None = None) -> NBest:
    """The search `cfg.strategy` names, over one batch; `ids` (sentence indices in the input) seed sampling."""
    bos, eos = Vocab.bos, Vocab.eos
    if cfg.strategy == "beam":
        return beam_search(step, cache, bos, eos, max_len, cfg.beam_size, cfg.len_penalty, cfg.min_len,
                           cfg.nbest, cfg.no_repeat_ngram)
    if cfg.strategy == "sample":
        return sample(step, cache, bos, eos, max_len, ids if ids is not None else list(range(len(max_len))),
                      cfg.nbest, cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, cfg.min_len,
                      cfg.no_repeat_ngram)
    hyp = greedy_search(step, cache, bos, eos, max_len, cfg.min_len, cfg.no_repeat_ngram)
    return NBest([[t] for t in hyp.tokens], [[s] for s in hyp.scores])
