"""Batched greedy decoding with a key/value cache: the most probable allowed token at each step."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.data.vocab import Vocab
from tformer.decode.batch import Batch
from tformer.decode.common import Cache, Hypotheses, StepFn, Stop, log_probs, row_max
from tformer.decode.rules import Rules


def greedy_search(step: StepFn, cache: Cache, max_len: Tensor, rules: Rules, stop: Stop | None = None) -> Hypotheses:
    """Pick the most probable token the `rules` allow (decode.rules.rules_for, which also gives the limits
    `max_len` (B,)) at each step, scored by the log-softmax of the logits, until </s> or the limit.

    A finished sentence leaves the batch (its cache rows are dropped), so the work shrinks as the batch
    finishes and no sentence's result depends on the others in its batch. Rows leave in groups (when an eighth
    of the rows have finished): each departure copies the whole cache, and a few finished rows cost less
    carried along than copied out. `stop` (common.stopped), asked before every step, takes sentences out at
    once; their tokens are what they had.
    """
    B, eos, longest = max_len.shape[0], Vocab.eos, int(max_len.max())
    device = max_len.device
    out = torch.full((B, longest), eos, dtype=torch.long, device=device)  # tokens, </s> after the end
    batch = Batch(cache, rules, torch.arange(B, device=device), torch.ones(B, dtype=torch.bool, device=device),
                  longest, out)  # carried (B_rows,): False once finished, until the row leaves
    scores = torch.zeros(B, dtype=torch.float64, device=device)  # summed as the Python floats they become
    while batch.go_on(stop):
        logits = batch.step(step)  # (B_rows, V)
        allowed, _ = rules.scores(logits, batch, log_probs)  # (B_rows, V), over the logits
        best_logp, best = row_max(allowed)  # (B_rows,)
        running = batch.carried
        best = torch.where(running, best, eos)  # a finished row carried along writes nothing
        scores.index_add_(0, batch.sentence, torch.where(running, best_logp, 0.0).double())
        batch.advance(best)
        running &= (best != eos) & (batch.t < max_len[batch.sentence])  # (B_rows,)
        n_done = int(running.numel() - running.sum())
        if n_done and (n_done * 8 >= running.numel() or n_done == running.numel()):
            batch.keep(~running)
    tokens = [row[: row.index(eos)] if eos in row else row for row in out.tolist()]
    return Hypotheses(tokens, scores.tolist())
