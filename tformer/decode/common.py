"""What every search shares: the step-function contract, results, length limits, cache row selection and
the rules that forbid tokens (minimum length, repeated n-grams). Notation: B sentences, K hypotheses per
sentence, N = B x K rows, V vocabulary, t tokens decoded so far."""

from __future__ import annotations

from typing import Callable, NamedTuple

from torch import Tensor

Cache = dict[str, Tensor]
StepFn = Callable[[Tensor, Cache], "tuple[Tensor, Cache]"]

# Cache entries named "hyp.*" have one row per hypothesis (self-attention keys/values); every other entry has
# one row per sentence (the source mask, the cross-attention keys/values) and is shared by the sentence's
# hypotheses: rows i*K .. i*K+K-1 of a hypothesis-level tensor belong to sentence i.
HYP_PREFIX = "hyp."


class Hypotheses(NamedTuple):
    tokens: list[list[int]]  # per sentence, without <s> and </s>
    scores: list[float]  # sum of log-probabilities of the tokens chosen, </s> included when reached


class NBest(NamedTuple):
    tokens: list[list[list[int]]]  # per sentence, its hypotheses best first, without <s> and </s>
    scores: list[list[float]]  # their scores (beam: length-normalised; greedy/sampling: log-probability)


def max_lengths(src_lengths: Tensor, a: float, b: int) -> Tensor:
    """The output limit a * source_length + b (at least 1), per sentence: (B,) -> (B,)."""
    return (src_lengths.double() * a + b).floor().long().clamp(min=1)


def select_rows(cache: Cache, rows: Tensor) -> Cache:
    """Keep (or reorder, or repeat) the batch rows `rows` of every cached tensor."""
    return {k: v.index_select(0, rows) for k, v in cache.items()}


def select_hyps(cache: Cache, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> Cache:
    """Reorder the hypothesis-level entries by `hyp_rows` and, if given, the sentence-level ones by
    `sentence_rows` (sentences leaving the batch)."""
    out = {}
    for k, v in cache.items():
        if k.startswith(HYP_PREFIX):
            out[k] = v.index_select(0, hyp_rows)
        else:
            out[k] = v if sentence_rows is None else v.index_select(0, sentence_rows)
    return out


def forbid(logp: Tensor, history: Tensor, t: int, eos: int, min_len: int, no_repeat_ngram: int) -> Tensor:
    """Set to -inf, in place, the log-probabilities of tokens the rules forbid at step t+1: <pad> and <s>
    always, </s> before `min_len` tokens, and any token completing an n-gram already in `history` (N, t)."""
    logp[:, :2] = float("-inf")  # ids 0 and 1: <pad>, <s> (tformer.data.vocab)
    if t < min_len:
        logp[:, eos] = float("-inf")
    n = no_repeat_ngram
    if n and t >= n:  # the n-gram ending at the next token needs n-1 earlier tokens, and a match needs n more
        windows = history.unfold(1, n, 1)  # (N, t-n+1, n)
        prefix = history[:, t - n + 1 :]  # (N, n-1)
        match = (windows[:, :, : n - 1] == prefix[:, None, :]).all(-1)  # (N, t-n+1)
        rows, cols = match.nonzero(as_tuple=True)
        logp[rows, windows[rows, cols, n - 1]] = float("-inf")
    return logp
