"""Batched greedy decoding with a key/value cache, optionally from a forced target prefix."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.decode.common import Cache, Hypotheses, StepFn, forbid, force, prefix_table, select_rows


def greedy_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, min_len: int = 0,
                  no_repeat_ngram: int = 0, prefix: list[list[int]] | None = None) -> Hypotheses:
    """Pick the most probable allowed token at each step until </s> or `max_len` (B,) tokens.

    `prefix` (one id list per sentence, or None) forces the first tokens of each output: they are taken
    whatever the rules say and scored at their log-probability, then the search goes on from there; a
    limit shorter than a prefix is raised to its length. A finished sentence leaves the batch (its cache
    rows are dropped), so the work shrinks as the batch finishes and no sentence's result depends on the
    others in its batch.
    """
    B = max_len.shape[0]
    device = max_len.device
    prefix, max_len = prefix_table(prefix, max_len, bos, eos)  # (B, P), (B,)
    tokens: list[list[int]] = [[] for _ in range(B)]
    scores = [0.0] * B
    active = torch.arange(B, device=device)  # original row of each live row
    prev = torch.full((B,), bos, dtype=torch.long, device=device)  # (B_live,)
    history = torch.empty((B, 0), dtype=torch.long, device=device)  # (B_live, t)
    t = 0
    while active.numel():
        logits, cache = step(prev, cache)  # (B_live, V)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B_live, V)
        forcing = t < prefix.shape[1]  # some sentence may still be inside its prefix
        allowed = forbid(logp.clone() if forcing else logp, history, t, eos, min_len, no_repeat_ngram)
        logp = force(logp, allowed, prefix[active, t]) if forcing else allowed
        best = logp.argmax(dim=-1)  # (B_live,)
        best_logp = logp.gather(1, best[:, None])[:, 0]
        t += 1
        done = (best == eos) | (t >= max_len[active])  # (B_live,)
        for row, tok, lp in zip(active.tolist(), best.tolist(), best_logp.tolist()):
            scores[row] += lp
            if tok != eos:
                tokens[row].append(tok)
        history = torch.cat([history, best[:, None]], dim=1)
        if done.any():
            keep = (~done).nonzero()[:, 0]
            active, best, history = active[keep], best[keep], history[keep]
            cache = select_rows(cache, keep)
        prev = best
    return Hypotheses(tokens, scores)
