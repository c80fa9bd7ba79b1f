"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering.

Each sentence draws from its own generator seeded by (seed, sentence index, sample), so a sentence's samples
do not depend on the batch it is decoded in. A forced target prefix (`common.force`) starts every sample of
its sentence; a prefix token is taken, not drawn (a draw is still made, so the stream of the generator does
not depend on whether a row is forced), and scored at its log-probability under the temperature alone: no
top-k/top-p filter, which a forced token may lie outside of."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.decode.common import (Cache, NBest, StepFn, Stop, forbid, force, forced_scores, penalize_repeats,
                                   prefix_table, select_rows, stopped)


def top_p_mask(probs: Tensor, top_p: float) -> Tensor:
    """(N, V) probabilities -> (N, V) bool, True in the nucleus: the most probable tokens, down to and including
    the one at which their cumulative sum (in the probabilities' dtype, float32) first reaches top_p; all of
    them when it never does. Ties are taken in vocabulary order. The sum is compared where it stands, never
    recomputed by subtraction, so a sum that reaches top_p exactly keeps the minimal set."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (N, V)
    reached = sorted_probs.cumsum(-1) >= top_p  # (N, V) top_p is compared in the probabilities' dtype
    after = torch.zeros_like(reached)
    after[:, 1:] = reached[:, :-1]  # the tokens ahead already reached top_p: this one is not needed
    return torch.zeros_like(after).scatter(1, order, ~after)


def filter_logits(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """(N, V) logits -> log-probabilities of the filtered, renormalised distribution (-inf outside it)."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        logits = logits.masked_fill(~top_p_mask(logits.softmax(-1), top_p), float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def sample(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, ids: list[int], n: int = 1,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, min_len: int = 0,
           no_repeat_ngram: int = 0, prefix: list[list[int]] | None = None, stop: Stop | None = None,
           repetition_penalty: float = 1.0) -> NBest:
    """`n` independent samples per sentence, each beginning with the sentence's `prefix` (one id list per
    sentence, or None; a shorter limit is raised to it); `ids` (B,) are the sentences' indices in their input,
    which seed their generators. Scores are the samples' log-probabilities: the drawn tokens' under the
    filtered distribution, the forced ones' under the temperature alone. `stop` (common.stopped), asked
    before every step, takes sentences out at once with the samples they had finished. `repetition_penalty`
    (common.penalize_repeats) changes the logits of each sample's tokens so far, before the temperature."""
    B = max_len.shape[0]
    device = max_len.device
    prefix, max_len = prefix_table(prefix, max_len, bos, eos)  # (B, P), (B,)
    gens = [torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + j) for i in ids for j in range(n)]
    out: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    hyp_sent = torch.arange(B, device=device).repeat_interleave(n)  # (N,) sentence of each row
    cache = select_rows(cache, hyp_sent)  # rows finish independently: each gets its own copy
    live = torch.arange(B * n, device=device)  # (N_live,) original row
    prev = torch.full((B * n,), bos, dtype=torch.long, device=device)
    history = torch.empty((B * n, 0), dtype=torch.long, device=device)
    total = torch.zeros(B * n, device="cpu")
    t = 0
    while live.numel():
        gone = stopped(stop, hyp_sent[live])  # (N_live,) or None: a sentence's samples go together
        if gone is not None:
            keep = (~gone).nonzero()[:, 0]
            if not keep.numel():
                break
            live, history, prev = live[keep], history[keep], prev[keep]
            cache = select_rows(cache, keep)
        logits, cache = step(prev, cache)  # (N_live, V)
        logits = penalize_repeats(logits, history, repetition_penalty)
        allowed = forbid(logits.float().clone(), history, t, eos, min_len, no_repeat_ngram)  # -inf logits
        logp = filter_logits(allowed, temperature, top_k, top_p)  # (N_live, V)
        forcing = t < prefix.shape[1]  # some sentence may still be inside its prefix
        if forcing:
            forced = prefix[hyp_sent[live], t]  # (N_live,) the prefix token due, -1 past the prefix
            logp = force(logp, forced, forced_scores(torch.log_softmax(logits.float() / temperature, dim=-1), forced))
        probs = logp.exp().cpu()
        u = torch.stack([torch.rand((), generator=gens[r], device="cpu") for r in live.tolist()])  # (N_live,)
        cdf = probs.cumsum(-1)
        tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=probs.shape[-1] - 1)[:, 0]
        tok = tok.to(device)
        if forcing:
            tok = torch.where(forced >= 0, forced, tok)  # taken; the draw is spent all the same
        total[live.cpu()] += logp.gather(1, tok[:, None])[:, 0].cpu()
        t += 1
        history = torch.cat([history, tok[:, None]], dim=1)
        done = (tok == eos) | (t >= max_len[hyp_sent[live]])
        for i in done.nonzero()[:, 0].tolist():
            r = int(live[i])
            toks = history[i].tolist()
            out[r // n].append((float(total[r]), toks[:-1] if toks[-1] == eos else toks))
        if done.any():
            keep = (~done).nonzero()[:, 0]
            live, history, tok = live[keep], history[keep], tok[keep]
            cache = select_rows(cache, keep)
        prev = tok
    return NBest([[h[1] for h in hyps] for hyps in out], [[h[0] for h in hyps] for hyps in out])
