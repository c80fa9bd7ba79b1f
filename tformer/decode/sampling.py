"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering.

Each sentence draws from its own generator seeded by (seed, sentence index, sample), so a sentence's samples
do not depend on the batch it is decoded in. A forced target prefix (`rules.ForcedPrefix`) starts every sample of
its sentence; a prefix token is taken, not drawn (a draw is still made, so the stream of the generator does
not depend on whether a row is forced), and scored at its log-probability under the temperature alone: no
top-k/top-p filter, which a forced token may lie outside of."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.data.vocab import Vocab
from tformer.decode.batch import Batch
from tformer.decode.common import Cache, NBest, StepFn, Stop, select_rows
from tformer.decode.rules import Rules


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
    return _filter(logits.float() / temperature, top_k, top_p)


def _filter(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """`filter_logits` of logits already divided by the temperature (fp32)."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        logits = logits.masked_fill(~top_p_mask(logits.softmax(-1), top_p), float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def sample(step: StepFn, cache: Cache, max_len: Tensor, rules: Rules, ids: list[int], n: int = 1,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: Stop | None = None
           ) -> NBest:
    """`n` independent samples per sentence under the `rules` (decode.rules.rules_for, which also gives the
    limits `max_len` (B,)); `ids` (B,) are the sentences' indices in their input, which seed their generators.
    The rules' masks act on the logits / temperature, before the top-k/top-p filter. Scores are the samples'
    log-probabilities: the drawn tokens' under the filtered distribution, the forced ones' under the
    temperature alone. `stop` (common.stopped), asked before every step, takes sentences out at once with the
    samples they had finished."""
    B, eos = max_len.shape[0], Vocab.eos
    device = max_len.device
    gens = [torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + j) for i in ids for j in range(n)]
    out: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    hyp_sent = torch.arange(B, device=device).repeat_interleave(n)  # (N,) sentence of each row
    cache = select_rows(cache, hyp_sent)  # rows finish independently: each gets its own copy
    batch = Batch(cache, rules, hyp_sent, torch.arange(B * n, device=device), int(max_len.max()))  # carried: row
    total = torch.zeros(B * n, device="cpu")

    def scaled(logits: Tensor) -> Tensor:
        return logits.float() / temperature

    def read(x: Tensor) -> Tensor:  # a forced token's score: under the temperature alone, unfiltered
        return torch.log_softmax(x, dim=-1)

    def filtered(x: Tensor) -> Tensor:
        return _filter(x, top_k, top_p)

    while batch.go_on(stop):  # a sentence's samples go together
        logits = batch.step(step)  # (N_live, V)
        logp, forced = rules.scores(logits, batch, scaled, read, filtered)  # (N_live, V)
        probs = logp.exp().cpu()
        live = batch.carried  # (N_live,) original row
        u = torch.stack([torch.rand((), generator=gens[r], device="cpu") for r in live.tolist()])  # (N_live,)
        cdf = probs.cumsum(-1)
        tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=probs.shape[-1] - 1)[:, 0]
        tok = tok.to(device)
        if forced is not None:
            tok = torch.where(forced >= 0, forced, tok)  # taken; the draw is spent all the same
        total[live.cpu()] += logp.gather(1, tok[:, None])[:, 0].cpu()
        batch.advance(tok)
        done = (tok == eos) | (batch.t >= max_len[batch.sentence])
        for i in done.nonzero()[:, 0].tolist():
            r = int(live[i])
            toks = batch.history[i].tolist()
            out[r // n].append((float(total[r]), toks[:-1] if toks[-1] == eos else toks))
        if done.any():
            batch.keep(done)
    return NBest([[h[1] for h in hyps] for hyps in out], [[h[0] for h in hyps] for hyps in out])
