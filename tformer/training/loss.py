"""Label-smoothed cross-entropy as pure functions. Notation: N target positions, V vocabulary.

The smoothed target of a position whose true class is y puts 1 - eps on y and spreads eps evenly over
the V - 2 classes that are neither y nor <pad> (the Annotated Transformer's choice); <pad> gets 0.
Positions whose target is <pad> are ignored.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tformer.metrics import token_accuracy


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


def _smoothed(nll: Tensor, all_but_pad: Tensor, eps: float, vocab_size: int) -> Tensor:
    """Per-position smoothed loss from the nll of the true class and -sum of log p over the classes != <pad>:
    1 - eps on the true class, eps / (V - 2) on each class that is neither it nor <pad>."""
    return (1.0 - eps) * nll + eps / (vocab_size - 2) * (all_but_pad - nll)


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
            loss = _smoothed(nll, all_but_pad, eps, V)
        else:
            loss = nll.clone()
        ctx.save_for_backward(lprobs, target)
        ctx.eps, ctx.pad, ctx.dtype = eps, pad, logits.dtype
        return loss, nll

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        """g_loss, g_nll (N,) in lprobs' dtype, the outputs' (autograd passes zeros for an unused output)."""
        lprobs, target = ctx.saved_tensors
        eps, pad = ctx.eps, ctx.pad
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


class GeneratorLoss(NamedTuple):
    loss: Tensor  # summed label-smoothed loss over real positions (differentiable)
    nll: Tensor  # summed negative log-likelihood of the true classes
    n_tokens: Tensor  # real (non-pad) positions
    correct: int  # real positions whose most probable class is the true one


# Rows of the (N, V) logits handled at a time by generator_loss: small enough that a chunk's logits stay in
# the CPU's cache between the passes over them, large enough for efficient matrix multiplies.
CHUNK_ROWS = 512


class _ChunkedGeneratorLoss(torch.autograd.Function):
    """The generator (hidden W^T + b) and the label-smoothed loss, `CHUNK_ROWS` rows at a time, gradients
    computed in the forward pass: d loss / d logits = softmax - q per chunk, then d hidden = g W,
    d W += g^T hidden, d b += sum g. The (N, V) logits, log-probabilities and their gradient never exist
    whole (the generator and its loss are a large share of a small model's step)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, eps: float, pad: int):
        N, V = hidden.shape[0], weight.shape[0]
        other = eps / (V - 2)  # q on a class that is neither the target nor <pad>
        g_hidden, g_weight = hidden.new_empty(hidden.shape), torch.zeros_like(weight)
        g_bias = None if bias is None else torch.zeros_like(bias)
        loss = hidden.new_zeros(())
        nll = hidden.new_zeros(())
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        for s in range(0, N, CHUNK_ROWS):
            h, t = hidden[s : s + CHUNK_ROWS], target[s : s + CHUNK_ROWS]  # (c, D), (c,)
            real = t != pad  # (c,)
            z = torch.addmm(bias, h, weight.t()) if bias is not None else h @ weight.t()  # (c, V) logits
            lse = torch.logsumexp(z, dim=-1)  # (c,)
            row_nll = lse - z.gather(1, t[:, None])[:, 0]  # (c,)
            row_loss = row_nll
            if eps > 0:  # -sum of log p over the classes != <pad>, then the smoothed mix
                all_but_pad = (V - 1) * lse - z.sum(dim=-1) + z[:, pad]
                row_loss = _smoothed(row_nll, all_but_pad, eps, V)
            loss += row_loss[real].sum()
            nll += row_nll[real].sum()
            correct += (z.argmax(dim=-1) == t)[real].sum()
            g = z.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            g.sub_(other)  # softmax - q: other everywhere ...
            g[:, pad] += other  # ... 0 on <pad> ...
            g.scatter_add_(1, t[:, None], g.new_full((t.shape[0], 1), -(1.0 - eps - other)))  # ... 1 - eps on t
            if not bool(real.all()):
                g[~real] = 0.0  # padding positions contribute nothing
            torch.mm(g, weight, out=g_hidden[s : s + CHUNK_ROWS])
            g_weight.addmm_(g.t(), h)
            if g_bias is not None:
                g_bias += g.sum(dim=0)
        ctx.save_for_backward(g_hidden, g_weight, g_bias)
        ctx.mark_non_differentiable(nll, correct)
        return loss, nll, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll, _grad_correct):
        g_hidden, g_weight, g_bias = ctx.saved_tensors
        return (g_hidden * grad_loss, g_weight * grad_loss, None if g_bias is None else g_bias * grad_loss,
                None, None, None)


def generator_loss(hidden: Tensor, generator: torch.nn.Linear, target: Tensor, eps: float, pad: int
                   ) -> GeneratorLoss:
    """hidden (N, D), target (N,) -> the summed label-smoothed loss of `generator(hidden)`, the summed nll, the
    real positions and the correct predictions: what `label_smoothed_nll_loss` and `token_accuracy` give on
    the logits. With gradients on float32/float64 tensors and no autocast, the chunked computation above;
    otherwise (evaluation, mixed precision) the logits are built whole."""
    V = generator.out_features
    if V <= 2:
        raise ValueError(f"label smoothing needs a vocabulary of more than 2 entries, got {V}")
    real = target != pad
    chunked = (torch.is_grad_enabled() and hidden.dtype == generator.weight.dtype in (torch.float32, torch.float64)
               and not torch.is_autocast_enabled(hidden.device.type))
    if chunked:
        loss, nll, correct = _ChunkedGeneratorLoss.apply(hidden, generator.weight, generator.bias, target, eps, pad)
        return GeneratorLoss(loss, nll, real.sum(), int(correct))
    logits = generator(hidden)  # (N, V)
    out = label_smoothed_nll_loss(logits, target, eps, pad)
    return GeneratorLoss(out.loss, out.nll, out.n_tokens, token_accuracy(logits.detach(), target, pad)[0])


def ctc_loss(model, enc, tgt_out: Tensor, tgt_lengths: Tensor) -> Tensor:
    """CTC's negative log-likelihood of each target (its ids without </s>) given the encoder's output, summed
    over the batch; the blank is the padding id. enc: the EncoderOutput the decoder read (padded or packed);
    tgt_out (B, T) ids + </s>, tgt_lengths (B,) with the </s>. A target that cannot align with its frames (more
    labels than frames) costs nothing rather than infinity."""
    mask = enc.mask  # (B, S') True at real frames
    memory = enc.memory
    if enc.packed:  # (1, Ns, D) -> (B, S', D)
        padded = memory.new_zeros(*mask.shape, memory.shape[-1])
        padded[mask] = memory[0]
        memory = padded
    log_probs = torch.log_softmax(model.ctc(memory).float(), dim=-1).transpose(0, 1)  # (S', B, V)
    targets = tgt_out[:, : max(int(tgt_lengths.max()) - 1, 1)]
    return torch.nn.functional.ctc_loss(log_probs, targets, mask.sum(1), tgt_lengths - 1, blank=0,
                                        reduction="sum", zero_infinity=True)
