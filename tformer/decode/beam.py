"""Beam search, vectorised over sentences x beams.

Every step scores all K x V continuations of a sentence's K hypotheses at once and keeps the 2K best: the
ones ending in </s> among the top K ranks are set aside as finished, the K best others go on. A sentence is
done at its length limit, or once it has K finished hypotheses and its best live hypothesis, normalised at
its current length, no longer beats the K-th best finished one (Hugging Face's rule; fairseq stops at K
finished, which misses longer outputs that a length penalty prefers). A done sentence leaves the batch, so
nothing a sentence gets depends on the other sentences it is decoded with. The cache's hypothesis-level entries are
reordered between steps; the sentence-level entries (encoder keys/values) are never copied per beam.

Finished hypotheses are ranked by GNMT's length penalty (Wu et al., 2016): logprob / ((5 + |Y|) / 6) ** alpha,
|Y| counting the </s>. alpha = 0 ranks by log-probability alone, larger alpha favours longer outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.decode.common import Cache, NBest, StepFn, forbid, select_hyps


def length_penalty(length: int, alpha: float) -> float:
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, beam: int, alpha: float = 0.6,
                min_len: int = 0, nbest: int = 1, no_repeat_ngram: int = 0) -> NBest:
    """`cache` holds one row per sentence (B); `max_len` (B,) limits each sentence's output. Returns the
    `nbest` best finished hypotheses of every sentence with their length-normalised scores."""
    B, K = max_len.shape[0], beam
    device = max_len.device
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]  # (normalised score, tokens)
    sent = torch.arange(B, device=device)  # original index of each live sentence (L live)
    prev = torch.full((B * K,), bos, dtype=torch.long, device=device)  # (L*K,)
    scores = torch.zeros((B, K), device=device)  # (L, K) summed log-probabilities
    scores[:, 1:] = float("-inf")  # all beams start identical: let only the first one expand
    history = torch.empty((B * K, 0), dtype=torch.long, device=device)  # (L*K, t)
    ranks = torch.arange(2 * K, device=device)
    t = 0
    while sent.numel():
        L = sent.numel()
        logits, cache = step(prev, cache)  # (L*K, V)
        logp = forbid(torch.log_softmax(logits.float(), dim=-1), history, t, eos, min_len, no_repeat_ngram)
        V = logp.shape[-1]
        t += 1
        cand = (scores.reshape(L * K, 1) + logp).reshape(L, K * V)
        top_scores, top_idx = cand.topk(min(2 * K, K * V), dim=1)  # (L, 2K), best first
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == eos
        # set aside the hypotheses ending here: </s> within the top K ranks
        ended = is_eos & (ranks[: top_tok.shape[1]] < K) & torch.isfinite(top_scores)
        for l, r in ended.nonzero().tolist():
            toks = history[l * K + int(top_beam[l, r])].tolist()
            finished[int(sent[l])].append((float(top_scores[l, r]) / length_penalty(t, alpha), toks))
        # go on with the K best candidates that did not end (a stable sort keeps their rank order)
        pick = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :K]  # (L, K)
        next_scores = top_scores.gather(1, pick)
        next_beam = top_beam.gather(1, pick)
        next_tok = top_tok.gather(1, pick)
        rows = (torch.arange(L, device=device)[:, None] * K + next_beam).reshape(-1)  # (L*K,) parent rows
        history = torch.cat([history.index_select(0, rows), next_tok.reshape(-1, 1)], dim=1)
        last = t >= max_len.index_select(0, sent)  # (L,) the length limit: what is alive ends here
        for l in last.nonzero()[:, 0].tolist():
            for k in range(K):
                if torch.isfinite(next_scores[l, k]):
                    finished[int(sent[l])].append((float(next_scores[l, k]) / length_penalty(t, alpha),
                                                   history[l * K + k].tolist()))
        # done: at the limit, or K finished and none alive ranks above the K-th finished any more
        alive_best = (next_scores[:, 0] / length_penalty(t, alpha)).tolist()  # (L,) best alive, normalised
        done = last.clone()
        for l, i in enumerate(sent.tolist()):
            if len(finished[i]) >= K and alive_best[l] <= sorted(h[0] for h in finished[i])[-K]:
                done[l] = True
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero()[:, 0]  # (L',)
            keep_rows = (keep[:, None] * K + torch.arange(K, device=device)).reshape(-1)  # (L'*K,)
            sent, next_scores, next_tok = sent[keep], next_scores[keep], next_tok[keep]
            history = history.index_select(0, keep_rows)
            cache = select_hyps(cache, rows.index_select(0, keep_rows), keep)
        else:
            cache = select_hyps(cache, rows)
        scores, prev = next_scores, next_tok.reshape(-1)
    tokens, out_scores = [], []
    for hyps in finished:
        hyps.sort(key=lambda h: -h[0])  # stable: equal scores keep the order they were found in
        tokens.append([h[1] for h in hyps[:nbest]])
        out_scores.append([h[0] for h in hyps[:nbest]])
    return NBest(tokens, out_scores)
