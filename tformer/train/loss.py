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


class _SmoothedNLL(torch.autograd.Function):
    """Per-position smoothed loss and nll with a hand-written backward.

    d loss / d logits = softmax - q and d nll / d logits = softmax - onehot, so the gradient is built in two
    passes over (N, V) instead of the several (N, V) buffers that autograd of the formula allocates."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float, pad: int) -> tuple[Tensor, Tensor]:
        V = logits.shape[-1]
        wide = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()  # fp16/bf16 -> fp32
        lprobs = torch.log_softmax(wide, dim=-1)  # (N, V)
        nll = -lprobs.gather(1, target[:, None])[:, 0]  # (N,)
        if eps > 0:
            all_but_pad = -(lprobs.sum(dim=-1) - lprobs[:, pad])  # (N,): -sum of log p over classes != pad
            loss = (1.0 - eps) * nll + eps / (V - 2) * (all_but_pad - nll)
        else:
            loss = nll.clone()
        ctx.save_for_backward(lprobs, target)
        ctx.eps, ctx.pad, ctx.dtype = eps, pad, logits.dtype
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor | None, grad_nll: Tensor | None):
        lprobs, target = ctx.saved_tensors
        eps, pad = ctx.eps, ctx.pad
        g_loss = torch.zeros_like(lprobs[:, 0]) if grad_loss is None else grad_loss.to(lprobs.dtype)  # (N,)
        g_nll = torch.zeros_like(lprobs[:, 0]) if grad_nll is None else grad_nll.to(lprobs.dtype)
        other = eps / (lprobs.shape[-1] - 2)  # q on a class that is neither the target nor <pad>
        # (g_loss + g_nll) * softmax - g_loss * other everywhere ...
        grad = torch.addcmul((-g_loss * other)[:, None], lprobs.exp(), (g_loss + g_nll)[:, None])  # (N, V)
        grad[:, pad] += g_loss * other  # ... <pad> has q = 0 ...
        true = g_loss * (1.0 - eps - other) + g_nll  # ... and the target has q = 1 - eps, onehot = 1
        grad.scatter_add_(1, target[:, None], -true[:, None])
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, eps: float, pad: int) -> LossOutput:
    """logits (N, V), target (N,) -> sums over the non-pad positions.

    Equals -(smoothed_targets(target) * log_softmax(logits)).sum() without building the (N, V) target.
    """
    V = logits.shape[-1]
    if V <= 2:
        raise ValueError(f"label smoothing needs a vocabulary of more than 2 entries, got {V}")
    loss, nll = _SmoothedNLL.apply(logits, target, eps, pad)  # (N,) each
    real = target != pad  # (N,)
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return LossOutput(torch.where(real, loss, zero).sum(), torch.where(real, nll, zero).sum(), real.sum())
