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

A forced target prefix is one more rule on the step's log-probabilities (`common.force`): while a sentence is
inside its prefix, every continuation but the prefix token is -inf, the prefix token keeps its log-probability.
A sentence starts from one hypothesis, so exactly one finite hypothesis follows the prefix and the other K-1 rows
carry -inf scores: -inf never turns finite, never finishes (only finite candidates are set aside) and ranks below
every finite candidate, so from the end of the prefix the search goes on exactly as a beam started from that one
hypothesis. Scores include the prefix tokens (a raw score is still the teacher-forced log-probability) and
lengths count them. No hypothesis can finish inside the prefix (</s> is -inf there, and the limit is raised
to the prefix's length), so no stopping rule fires before it ends, and the exact bound (scores only fall)
holds afterwards as before.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.decode.common import Cache, NBest, StepFn, forbid, force, prefix_table


def length_penalty(length: int, alpha: float) -> float:
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, beam: int, alpha: float = 0.6,
                min_len: int = 0, nbest: int = 1, no_repeat_ngram: int = 0,
                prefix: list[list[int]] | None = None) -> NBest:
    """`cache` holds one row per sentence (B); `max_len` (B,) limits each sentence's output, raised where
    `prefix` (one id list per sentence, or None) is longer. Returns the `nbest` best finished hypotheses of
    every sentence, each beginning with the sentence's prefix, with their length-normalised scores (fewer
    than `nbest` where fewer finite ones exist, e.g. an output cut to exactly its prefix)."""
    B, K = max_len.shape[0], beam
    device = max_len.device
    prefix, max_len = prefix_table(prefix, max_len, bos, eos)  # (B, P), (B,)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]  # (normalised score, tokens)
    sent = torch.arange(B, device=device)  # original index of each live sentence (L live)
    # k hypotheses per live sentence: 1 at the first step (all K beams would start identical, so only one is
    # computed), then K (fewer only while K exceeds the candidates a tiny vocabulary offers)
    prev = torch.full((B,), bos, dtype=torch.long, device=device)  # (L*k,)
    scores = torch.zeros((B, 1), device=device)  # (L, k) summed log-probabilities
    history = torch.empty((B, 0), dtype=torch.long, device=device)  # (L*k, t)
    ranks = torch.arange(2 * K, device=device)
    t = 0
    while sent.numel():
        L, k = scores.shape
        logits, cache = step(prev, cache)  # (L*k, V)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (L*k, V)
        forcing = t < prefix.shape[1]  # some sentence may still be inside its prefix
        allowed = forbid(logp.clone() if forcing else logp, history, t, eos, min_len, no_repeat_ngram)
        logp = force(logp, allowed, prefix[sent, t].repeat_interleave(k)) if forcing else allowed
        V = logp.shape[-1]
        t += 1
        cand = (scores.reshape(L * k, 1) + logp).reshape(L, k * V)
        top_scores, top_idx = cand.topk(min(2 * K, k * V), dim=1)  # (L, 2K), best first
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == eos
        # set aside the hypotheses ending here: </s> within the top K ranks
        ended = is_eos & (ranks[: top_tok.shape[1]] < K) & torch.isfinite(top_scores)
        for l, r in ended.nonzero().tolist():
            toks = history[l * k + int(top_beam[l, r])].tolist()
            finished[int(sent[l])].append((float(top_scores[l, r]) / length_penalty(t, alpha), toks))
        # go on with the K best candidates that did not end (a stable sort keeps their rank order)
        # (K' = K, unless a tiny vocabulary offers fewer than 2K candidates: at most k of them end in </s>)
        n_next = min(K, top_tok.shape[1] - k)
        pick = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :n_next]  # (L, K')
        next_scores = top_scores.gather(1, pick)
        next_beam = top_beam.gather(1, pick)
        next_tok = top_tok.gather(1, pick)
        rows = (torch.arange(L, device=device)[:, None] * k + next_beam).reshape(-1)  # (L*K',) parent rows
        k = n_next
        history = torch.cat([history.index_select(0, rows), next_tok.reshape(-1, 1)], dim=1)
        last = t >= max_len.index_select(0, sent)  # (L,) the length limit: what is alive ends here
        for l in last.nonzero()[:, 0].tolist():
            for j in range(k):
                if torch.isfinite(next_scores[l, j]):
                    finished[int(sent[l])].append((float(next_scores[l, j]) / length_penalty(t, alpha),
                                                   history[l * k + j].tolist()))
        # done: at the limit; or K finished and none alive ranks above the K-th finished any more (Hugging
        # Face's rule, a heuristic when alpha > 0); or, exactly, no live hypothesis can still reach the
        # `nbest` best finished: scores only fall, so a live raw score s < 0 ends at best at s / lp, lp the
        # largest length penalty among the lengths it can still end at (t+1 .. its limit)
        alive_best = next_scores[:, 0].tolist()  # (L,) best live raw score
        limits = max_len.index_select(0, sent).tolist()
        done = last.clone()
        for l, i in enumerate(sent.tolist()):
            ranked = sorted((h[0] for h in finished[i]), reverse=True)
            reach = alive_best[l] / max(length_penalty(t + 1, alpha), length_penalty(limits[l], alpha))
            if len(ranked) >= K and alive_best[l] / length_penalty(t, alpha) <= ranked[K - 1]:
                done[l] = True
            elif len(ranked) >= nbest and reach <= ranked[nbest - 1]:
                done[l] = True
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero()[:, 0]  # (L',)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).reshape(-1)  # (L'*K',)
            sent, next_scores, next_tok = sent[keep], next_scores[keep], next_tok[keep]
            history = history.index_select(0, keep_rows)
            cache = cache.reorder(rows.index_select(0, keep_rows), keep)
        else:
            cache = cache.reorder(rows)
        scores, prev = next_scores, next_tok.reshape(-1)
    tokens, out_scores = [], []
    for hyps in finished:
        hyps.sort(key=lambda h: -h[0])  # stable: equal scores keep the order they were found in
        tokens.append([h[1] for h in hyps[:nbest]])
        out_scores.append([h[0] for h in hyps[:nbest]])
    return NBest(tokens, out_scores)
