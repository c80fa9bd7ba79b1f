"""Decoding sees a step function and a cache, never the model class.

    step(tokens (N,), cache) -> (logits (N, V), cache)

The cache is the model's (tformer.model.cache.DecoderCache; `common.TensorCache` for other step functions): a
search only reorders it, `cache.reorder(hyp_rows, sentence_rows)`. Hypothesis-level entries have one row
per hypothesis, sentence-level ones one row per sentence, shared by that sentence's hypotheses.

Beam search also takes lexical constraints, phrases every output must hold (decode.constraints): one more
rule on the step's scores, beside the prefix's.

Every search takes an optional target prefix, one id list per sentence (no <s>/</s>; empty or None: none).
Each output of sentence i then begins with exactly prefix[i], and the search goes on from there as it would
have from that state. The prefix tokens count in the scores, at the log-probability the search scores with
(greedy, beam: log_softmax of the logits; sampling: of logits / temperature, unfiltered), so a greedy score
or a raw beam score is still the teacher-forced log-probability of the whole output. The rules (min_len,
no_repeat_ngram, never <pad>/<s>) never forbid a prefix token; min_len and the limits count the whole
output, and a limit shorter than its prefix is raised to it (the output is then the prefix, without </s>).
A sentence without a prefix decodes exactly as with prefix=None, and no sentence's output depends on the
others in its batch or their prefixes.
"""

from __future__ import annotations

from torch import Tensor

from tformer.config import DecodeConfig
from tformer.data.vocab import Vocab
from tformer.decode.beam import beam_search, length_penalty
from tformer.decode.common import (Cache, Hypotheses, NBest, StepFn, Stop, TensorCache, forbid, force, forced_scores,
                                   log_probs, max_lengths, penalize_repeats, prefix_table, select_rows, stopped)
from tformer.decode.greedy import greedy_search
from tformer.decode.phrases import PHRASE_INPUTS, PhraseInput, Phrases
from tformer.decode.sampling import filter_logits, sample

__all__ = ["Cache", "Hypotheses", "NBest", "PHRASE_INPUTS", "PhraseInput", "Phrases", "StepFn", "Stop", "TensorCache", "beam_search", "filter_logits", "forbid",
           "force", "forced_scores", "greedy_search", "length_penalty", "log_probs", "max_lengths",
           "penalize_repeats", "prefix_table", "sample", "search", "select_rows", "stopped"]


def search(step: StepFn, cache: Cache, max_len: Tensor, cfg: DecodeConfig, ids: list[int] | None = None,
           prefix: list[list[int]] | None = None, stop: Stop | None = None, phrases: Phrases | None = None) -> NBest:
    """The search `cfg.strategy` names, over one batch; `ids` (sentence indices in the input) seed sampling;
    `prefix` (one id list per sentence, or None) forces the start of every output (see above); `stop` takes
    sentences out before any step (common.stopped); `phrases`: the rules' per-sentence phrase inputs by name
    (decode.phrases.PHRASE_INPUTS; "constraints": phrases every output must hold, beam search only)."""
    unknown = set(phrases or ()) - {p.name for p in PHRASE_INPUTS}
    if unknown:
        raise ValueError(f"no phrase input {sorted(unknown)}; there are {[p.name for p in PHRASE_INPUTS]}")
    constraints = (phrases or {}).get("constraints")
    bos, eos = Vocab.bos, Vocab.eos
    if cfg.strategy == "beam":
        return beam_search(step, cache, bos, eos, max_len, cfg.beam_size, cfg.len_penalty, cfg.min_len,
                           cfg.nbest, cfg.no_repeat_ngram, prefix, cfg.beam_finish, stop, cfg.len_penalty_rule,
                           cfg.repetition_penalty, constraints)
    if constraints is not None and any(constraints):
        raise ValueError(f"constraints are enforced by beam search; decode.strategy is {cfg.strategy!r}: use "
                         "strategy 'beam' (beam=N)")
    if cfg.strategy == "sample":
        return sample(step, cache, bos, eos, max_len, ids if ids is not None else list(range(len(max_len))),
                      cfg.nbest, cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, cfg.min_len,
                      cfg.no_repeat_ngram, prefix, stop, cfg.repetition_penalty)
    hyp = greedy_search(step, cache, bos, eos, max_len, cfg.min_len, cfg.no_repeat_ngram, prefix, stop,
                        cfg.repetition_penalty)
    return NBest([[t] for t in hyp.tokens], [[s] for s in hyp.scores])
