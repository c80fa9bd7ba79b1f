"""Batched greedy decoding with a key/value cache, optionally from a forced target prefix."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.decode.common import (Cache, Hypotheses, StepFn, Stop, forbid, force, forced_scores, log_probs,
                                   penalize_repeats, prefix_table, row_max, select_rows, stopped)


def greedy_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, min_len: int = 0,
                  no_repeat_ngram: int = 0, prefix: list[list[int]] | None = None, stop: Stop | None = None,
                  repetition_penalty: float = 1.0) -> Hypotheses:
    """Pick the most probable allowed token at each step until </s> or `max_len` (B,) tokens.

    `prefix` (one id list per sentence, or None) forces the first tokens of each output: they are taken
    whatever the rules say and scored at their log-probability, then the search goes on from there; a
    limit shorter than a prefix is raised to its length. A finished sentence leaves the batch (its cache
    rows are dropped), so the work shrinks as the batch finishes and no sentence's result depends on the
    others in its batch. Rows leave in groups (when an eighth of the rows have finished): each departure copies
    the whole cache, and a few finished rows cost less carried along than copied out. `stop` (common.stopped),
    asked before every step, takes sentences out at once; their tokens are what they had.
    `repetition_penalty` (common.penalize_repeats) changes the logits of the tokens a row has output so far,
    its prefix's included, before each choice.
    """
    B = max_len.shape[0]
    device = max_len.device
    prefix, max_len = prefix_table(prefix, max_len, bos, eos)  # (B, P), (B,)
    out = torch.full((B, int(max_len.max())), eos, dtype=torch.long, device=device)  # tokens, </s> after the end
    scores = torch.zeros(B, dtype=torch.float64, device=device)  # summed as the Python floats they become
    active = torch.arange(B, device=device)  # original row of each row still in the batch
    running = torch.ones(B, dtype=torch.bool, device=device)  # (B_rows,) False: finished, carried until it leaves
    prev = torch.full((B,), bos, dtype=torch.long, device=device)  # (B_live,)
    t = 0
    while active.numel():
        gone = stopped(stop, active)  # (B_rows,) or None
        if gone is not None:
            keep = (~gone).nonzero()[:, 0]
            active, prev, running = active[keep], prev[keep], running[keep]
            if not active.numel():
                break
            cache = select_rows(cache, keep)
        logits, cache = step(prev, cache)  # (B_rows, V)
        reads = no_repeat_ngram or repetition_penalty != 1.0  # the rules that read the tokens so far
        history = out[active, :t] if reads else out[:0, :t]  # (B_rows, t)
        logp = log_probs(penalize_repeats(logits, history, repetition_penalty))  # (B_rows, V), over the logits
        forcing = t < prefix.shape[1]  # some sentence may still be inside its prefix
        if forcing:
            forced = prefix[active, t]  # (B_rows,) the prefix token due, -1 past the prefix
            kept = forced_scores(logp, forced)  # (B_rows,) before the rules
        allowed = forbid(logp, history, t, eos, min_len, no_repeat_ngram)  # in place
        if forcing:  # the prefix token keeps its own log-probability; every row is computed alike
            allowed = force(allowed, forced, kept)  # in place
        best_logp, best = row_max(allowed)  # (B_rows,)
        best = torch.where(running, best, eos)  # a finished row carried along writes nothing
        scores.index_add_(0, active, torch.where(running, best_logp, 0.0).double())
        out[active, t] = best
        t += 1
        running &= (best != eos) & (t < max_len[active])  # (B_rows,)
        n_done = int(running.numel() - running.sum())
        if n_done and (n_done * 8 >= running.numel() or n_done == running.numel()):
            keep = running.nonzero()[:, 0]
            active, best, running = active[keep], best[keep], running[keep]
            cache = select_rows(cache, keep)
        prev = best
    tokens = [row[: row.index(eos)] if eos in row else row for row in out.tolist()]
    return Hypotheses(tokens, scores.tolist())
