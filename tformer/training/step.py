"""One optimizer update: the loss of a batch (`train_step_loss`) and an update over the batches of a gradient
accumulation (`take_update`), normalised by the target tokens of all of them, summed over the processes of a
torchrun job, clipped, and skipped (weights and optimizer untouched) when the loss or the gradient norm is NaN/inf.
The loop (tformer.training.loop) decides when to take one; the mathematics of the loss is tformer.training.loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import NamedTuple

import torch

from tformer.config import Config, TrainConfig
from tformer.data import Batch, Vocab
from tformer.data.specaugment import SpecAugment
from tformer.model import Transformer
from tformer.positions import RandomPositions
from tformer.training import distributed
from tformer.training.distributed import Context, all_reduce_update
from tformer.training.loss import ctc_loss, generator_loss
from tformer.training.precision import Precision
from tformer.training.progress import Window
from tformer.training.schedule import learning_rate


def build_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam with the configured betas/eps, fused (one kernel over all parameters: 3x faster than the
    per-parameter loop on this CPU) where torch has it for the parameters' device."""
    t = cfg.train
    params = list(model.parameters())
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.Adam(params, lr=learning_rate(1, t, cfg.model.d_model), betas=t.betas, eps=t.adam_eps,
                            weight_decay=t.weight_decay, fused=fused)


class StepLoss(NamedTuple):
    loss: torch.Tensor  # summed smoothed loss (+ ponder_weight x ponder cost for a universal transformer)
    nll: torch.Tensor  # summed nll
    correct: int  # correct next-token predictions
    ponder_steps: float = 0.0  # ACT steps summed over source and target positions (universal transformer)
    aux_loss: float = 0.0  # the part of `loss` that is not the decoder's (ponder cost, CTC): left out of the log
    positions: int = 0  # the positions those steps are over


def train_step_loss(model: Transformer, batch, eps: float, ponder_weight: float = 0.0,
                    positions: RandomPositions | None = None, ctc_weight: float = 0.0) -> StepLoss:
    """Summed smoothed loss, summed nll and correct predictions for one batch (generator on real
    positions only: padding costs no vocabulary projection). A universal transformer adds its ponder cost
    (N + R summed over real source and target positions) times `ponder_weight` to the loss. `positions`:
    randomised positions for this batch (train.random_positions). A model with a CTC layer (model.ctc) mixes in its
    loss: ctc_weight x CTC + (1 - ctc_weight) x the decoder's; the logged loss and nll stay the decoder's."""
    output = model(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_lengths, positions=positions)
    hidden = output.real()  # (N, D)
    real = batch.tgt_out != Vocab.pad  # (B, T)
    target = batch.tgt_out[real]  # (N,)
    out = generator_loss(hidden, model.generator, target, eps, Vocab.pad)  # logits (N, V) in row chunks
    loss, aux = out.loss, 0.0
    if model.ctc is not None and ctc_weight:
        loss = (1 - ctc_weight) * out.loss + ctc_weight * ctc_loss(model, output.encoder, batch.tgt_out,
                                                                  batch.tgt_lengths)
        aux = float(loss.detach() - out.loss.detach())
    if output.ponder is None:
        return StepLoss(loss, out.nll, out.correct, aux_loss=aux)
    cost = sum(p.cost for p in output.ponder)
    steps = float(sum(p.steps.sum() for p in output.ponder))
    positions = sum(int((p.steps > 0).sum()) for p in output.ponder)  # real positions (model frames for features)
    aux += float(ponder_weight * cost.detach())
    return StepLoss(loss + ponder_weight * cost, out.nll, out.correct, steps, aux, positions)


def take_update(model: Transformer, optimizer: torch.optim.Optimizer, micro: list[Batch], lr: float,
                t: TrainConfig, window: Window, ctx: Context = Context(), amp: Precision | None = None,
                step: int = 0) -> bool:
    """One optimizer update over the batches `micro` (gradient accumulation), the loss normalised by
    the target tokens of all of them: exactly one big batch's gradient. Under torchrun `micro` is this
    process's share of the update; every process divides its loss by the target tokens of the whole update
    (summed over the processes first) before its backward pass, as one process does with all the batches, so
    the gradients summed over the processes are the one process's sum, also where autocast rounds the
    backward's products to bf16 (dividing afterwards rounded them differently: 3% of an update's size).

    Returns False, leaving the weights and the optimizer as they were, when the loss or the gradient norm
    is NaN/inf (every process sees the same sums, so all skip together). Under fp16 an overflowing gradient
    is the scaler's business (it skips and lowers its scale); only a non-finite loss is a fault there.
    `step` (the update's number) seeds randomised positions and SpecAugment's masks, with the process and the
    batch: a resume draws the same ones."""
    tic = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    n_tgt = distributed.sum_ranks(ctx, sum(b.n_tgt_tokens for b in micro))  # the whole update's
    augment = SpecAugment.from_config(t)
    # local sums: loss (without ponder), nll, correct, ponder steps, positions, source tokens
    sums = [0.0] * 6
    for j, b in enumerate(micro):
        b = b.to(ctx.device)
        positions = (RandomPositions(t.random_positions, t.seed, step, ctx.rank, j, draw=t.random_draw)
                     if t.random_positions else None)
        if augment is not None:  # SpecAugment, seeded like the positions; masked values read as the mean
            b = dataclasses.replace(b, src=augment(b.src, b.src_lengths, t.seed, step, ctx.rank, j,
                                                   fill=getattr(model.src_embed, "cmvn_mean", None)))
        with amp.autocast() if amp else contextlib.nullcontext():
            out = train_step_loss(model, b, t.label_smoothing, t.ponder_weight, positions, t.ctc_weight)
        loss = out.loss / n_tgt
        (amp.scaler.scale(loss) if amp and amp.scaler else loss).backward()
        for i, v in enumerate((float(out.loss.detach()) - out.aux_loss, float(out.nll.detach()), out.correct,
                               out.ponder_steps, out.positions, b.n_src_tokens)):
            sums[i] += v
    if ctx.enabled:
        sums = all_reduce_update(ctx, [p for p in model.parameters() if p.requires_grad], sums)
    scaler = amp.scaler if amp else None
    if scaler:
        scaler.unscale_(optimizer)  # every process sees the same summed gradients: the same overflow verdict
    norm = grad_norm(model, t.clip_norm)
    finite = math.isfinite(sums[0]) and (scaler is not None or math.isfinite(norm))
    if scaler:
        scaler.step(optimizer)  # skips by itself when the gradients hold inf/NaN
        scaler.update()
    elif finite:
        optimizer.step()
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        window.skipped += 1
        window.seconds += time.perf_counter() - tic
        return False
    window.loss += sums[0]  # the logged loss is comparable across models
    window.nll += sums[1]
    window.correct += int(sums[2])
    window.ponder += sums[3]
    window.positions += int(sums[4])
    window.src += int(sums[5])
    window.tgt += int(n_tgt)
    window.seconds += time.perf_counter() - tic
    return True


def grad_norm(model: torch.nn.Module, clip_norm: float) -> float:
    """The gradients' global L2 norm, clipped to `clip_norm` when that is set (a NaN/inf norm clips nothing)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    if clip_norm:
        return float(torch.nn.utils.clip_grad_norm_(params, clip_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
