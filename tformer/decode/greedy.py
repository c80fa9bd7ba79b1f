"""Batched greedy decoding with a key/value cache. Notation: B batch, V vocabulary."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

Cache = dict[str, Tensor]
StepFn = Callable[[Tensor, Cache], "tuple[Tensor, Cache]"]


class Hypotheses(NamedTuple):
    tokens: list[list[int]]  # per sentence, without <s> and </s>
    scores: list[float]  # sum of log-probabilities of the tokens chosen, </s> included when reached


def max_lengths(src_lengths: Tensor, a: float, b: int) -> Tensor:
    """The output limit a * source_length + b (at least 1), per sentence: (B,) -> (B,)."""
    return (src_lengths.double() * a + b).floor().long().clamp(min=1)


def select_rows(cache: Cache, rows: Tensor) -> Cache:
    """Keep (or reorder, or repeat) the batch rows `rows` of every cached tensor."""
    return {k: v.index_select(0, rows) for k, v in cache.items()}


def greedy_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor) -> Hypotheses:
    """Pick the most probable token at each step until </s> or `max_len` (B,) tokens.

    A finished sentence leaves the batch (its cache rows are dropped), so the work shrinks as the
    batch finishes and no sentence's result depends on the others in its batch.
    """
    B = max_len.shape[0]
    device = max_len.device
    tokens: list[list[int]] = [[] for _ in range(B)]
    scores = [0.0] * B
    active = torch.arange(B, device=device)  # original row of each live row
    prev = torch.full((B,), bos, dtype=torch.long, device=device)  # (B_live,)
    t = 0
    while active.numel():
        logits, cache = step(prev, cache)  # (B_live, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        best = logp.argmax(dim=-1)  # (B_live,)
        best_logp = logp.gather(1, best[:, None])[:, 0]
        t += 1
        done = (best == eos) | (t >= max_len[active])  # (B_live,)
        for row, tok, lp in zip(active.tolist(), best.tolist(), best_logp.tolist()):
            scores[row] += lp
            if tok != eos:
                tokens[row].append(tok)
        if done.any():
            keep = (~done).nonzero()[:, 0]
            active, best = active[keep], best[keep]
            cache = select_rows(cache, keep)
        prev = best
    return Hypotheses(tokens, scores)
