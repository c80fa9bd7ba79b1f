"""Label-smoothed cross-entropy as pure functions. Notation: N target positions, V vocabulary.

The smoothed target of a position whose true class is y puts 1 - eps on y and spreads eps evenly over
the V - 2 classes that are neither y nor <pad> (the Annotated Transformer's choice); <pad> gets 0.
Positions whose target is <pad> are ignored.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class LossOutput(NamedTuple):
    loss: Tensor  # summed label-smoothed loss over real positions (the quantity to minimise)
    nll: Tensor  # summed negative log-likelihood of the true classes (for perplexity)
    n_tokens: Tensor  # real (non-pad) positions


def smoothed_targets(target: Tensor, vocab_size: int, eps: float, pad: int) -> Tensor:
    """The explicit smoothed distribution, (N,) -> (N, V); rows of padding positions are all zero."""
    q = torch.full((target.shape[0], vocab_size), eps / (vocab_size - 2))  # (N, V)
    q[:, pad] = 0.0
    q.scatter_(1, target[:, None], 1.0 - eps)
    q[target == pad] = 0.0
    return q


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, eps: float, pad: int) -> LossOutput:
    """logits (N, V), target (N,) -> sums over the non-pad positions.

    Equals -(smoothed_targets(target) * log_softmax(logits)).sum() without building the (N, V) target.
    """
    V = logits.shape[-1]
    if V <= 2:
        raise ValueError(f"label smoothing needs a vocabulary of more than 2 entries, got {V}")
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    real = target != pad  # (N,)
    nll = -lprobs.gather(1, target[:, None])[:, 0]  # (N,)
    if eps > 0:
        all_but_pad = -(lprobs.sum(dim=-1) - lprobs[:, pad])  # (N,): -sum of log p over classes != pad
        loss = (1.0 - eps) * nll + eps / (V - 2) * (all_but_pad - nll)
    else:
        loss = nll
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return LossOutput(torch.where(real, loss, zero).sum(), torch.where(real, nll, zero).sum(), real.sum())
