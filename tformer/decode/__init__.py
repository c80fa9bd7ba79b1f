"""Decoding sees a step function and a cache, never the model class.

    step(tokens (N,), cache) -> (logits (N, V), cache)

The cache is the model's (tformer.model.cache.DecoderCache; `common.TensorCache` for other step functions): a
search only reorders it, `cache.reorder(hyp_rows, sentence_rows)`. Hypothesis-level entries have one row
per hypothesis, sentence-level ones one row per sentence, shared by that sentence's hypotheses.

Three parts, each in one place:

    rules.py     the rules as objects (common.Rule: minimum length, n-gram blocking, repetition and <unk>
                 penalties, never <pad>/<s>, phrases to avoid, constraints, forced prefix), built once per batch from the DecodeConfig and the
                 per-sentence data by `rules_for`, in one order (`rules.ORDER`); `Rules.scores` is the one chain
                 that turns a step's logits into the scores a search chooses by
    batch.py     the live batch (`Batch`): rows take their tokens, follow their parents, leave when stopped or
                 done, and the cache and the rules' state go with them
    greedy.py, beam.py, sampling.py     each only its own choice of the next tokens

`search` builds the rules and runs the search `cfg.strategy` names; a rule that reads a per-sentence phrase
input declares it (`PHRASE_INPUTS`, read by every entry point). To add a rule: rules.py (module docstring).

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
from tformer.decode.batch import Batch
from tformer.decode.beam import beam_search, length_penalty
from tformer.decode.common import (Cache, Hypotheses, NBest, PhraseInput, Phrases, Rule, StepFn, Stop, TensorCache,
                                   force, forced_scores, log_probs, max_lengths, penalize_repeats, prefix_table,
                                   select_rows, stopped)
from tformer.decode.greedy import greedy_search
from tformer.decode.rules import PHRASE_INPUTS, Rules, rules_for
from tformer.decode.sampling import filter_logits, sample, top_p_mask

__all__ = ["Batch", "Cache", "Hypotheses", "NBest", "PHRASE_INPUTS", "PhraseInput", "Phrases", "Rule", "Rules",
           "StepFn", "Stop", "TensorCache", "beam_search", "filter_logits", "force", "forced_scores",
           "greedy_search", "length_penalty", "log_probs", "max_lengths", "penalize_repeats", "prefix_table",
           "rules_for", "sample", "search", "select_rows", "stopped", "top_p_mask"]


def search(step: StepFn, cache: Cache, max_len: Tensor, cfg: DecodeConfig, ids: list[int] | None = None,
           prefix: list[list[int]] | None = None, stop: Stop | None = None, phrases: Phrases | None = None) -> NBest:
    """The search `cfg.strategy` names, over one batch, under the rules `cfg` and the sentences' data ask for
    (rules_for); `ids` (sentence indices in the input) seed sampling; `prefix` (one id list per sentence, or
    None) forces the start of every output (see above); `stop` takes sentences out before any step
    (common.stopped); `phrases`: the rules' per-sentence phrase inputs by name (PHRASE_INPUTS; "constraints":
    phrases every output must hold, beam search only; "avoid": phrases no output may hold)."""
    rules, max_len = rules_for(cfg, max_len, prefix, phrases)
    if cfg.strategy == "beam":
        return beam_search(step, cache, max_len, rules, beam=cfg.beam_size, alpha=cfg.len_penalty, nbest=cfg.nbest,
                           finish=cfg.beam_finish, penalty_rule=cfg.len_penalty_rule, stop=stop)
    if cfg.strategy == "sample":
        return sample(step, cache, max_len, rules, ids if ids is not None else list(range(len(max_len))),
                      n=cfg.nbest, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed,
                      stop=stop)
    hyp = greedy_search(step, cache, max_len, rules, stop=stop)
    return NBest([[t] for t in hyp.tokens], [[s] for s in hyp.scores])
