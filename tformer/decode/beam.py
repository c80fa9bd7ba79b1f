"""Beam search, vectorised over sentences x beams.

Every step extends each of a sentence's K hypotheses by every token and keeps the K best extensions that do
not end; what ends (a hypothesis followed by </s>) is set aside as finished. Two rules say which endings are
kept (`finish`):

    top_k   (fairseq, CTranslate2, Marian; the default) of the step's 2K best extensions, those ending in </s>
            within the top K ranks
    all     (t5x) every ending with a finite score is a candidate, whatever its rank: a small beam still
            returns an ending it had at hand, even when K other extensions scored higher at that step

`all` always returns a hypothesis scoring at least as high (tested), but a higher model score is not a better
translation: on the Multi30k model, without a length penalty it returns shorter outputs, 11.8 BLEU lower
(24.53 vs 36.33), 0.7 lower with alpha 0.6 and the same with alpha 1.0, at about the same speed
(benchmarks/RESULTS.md, benchmarks/beam_rules.py). Hence the default.

A sentence is done at its length limit, or once no live hypothesis can still beat its `nbest`-th best
finished one: scores only fall, so a live raw score s < 0 ends at best at s / lp, lp the largest length penalty
among the lengths it can still end at (t+1 .. its limit). The rule is exact: stopping never changes the result.
top_k also stops, as Hugging Face does, once K have finished and the best live hypothesis, normalised at its
current length, does not beat the K-th (a heuristic when alpha > 0; fairseq stops at K finished, which misses
longer outputs that a length penalty prefers). A done sentence leaves the batch, so nothing a sentence gets
depends on the other sentences it is decoded with. The cache's hypothesis-level entries are reordered between
steps; the sentence-level entries (encoder keys/values) are never copied per beam.

Finished hypotheses are ranked by a length-normalised score, |Y| counting the </s> (`PENALTIES`):

    gnmt    GNMT's length penalty (Wu et al., 2016): logprob / ((5 + |Y|) / 6) ** alpha   (the default)
    power   logprob / |Y| ** alpha: Hugging Face, Marian, CTranslate2 and fairseq's lenpen

alpha = 0 ranks by log-probability alone (both rules), larger alpha favours longer outputs.

Each step ranks tokens within each hypothesis first (the best K, or 2K, of its V), then across a sentence's
K hypotheses: the sentence's best candidates are among its hypotheses' best ones, so the score is added to a
few candidates per row, not to all V, and every row is computed by the same arithmetic whether or not another
sentence of the batch is inside a prefix.

A forced target prefix is one more rule on the step's log-probabilities (`common.force`): while a sentence is
inside its prefix, every continuation but the prefix token is -inf, the prefix token keeps its log-probability.
A sentence starts from one hypothesis, so exactly one finite hypothesis follows the prefix and the other K-1 rows
carry -inf scores: -inf never turns finite, never finishes (only finite candidates are set aside) and ranks below
every finite candidate, so from the end of the prefix the search goes on exactly as a beam started from that one
hypothesis. Scores include the prefix tokens (a raw score is still the teacher-forced log-probability) and
lengths count them. No hypothesis can finish inside the prefix (</s> is -inf there, and the limit is raised
to the prefix's length), so no stopping rule fires before it ends, and the exact bound holds afterwards.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import torch
from torch import Tensor

from tformer.decode.common import (Cache, NBest, StepFn, Stop, forbid, force, forced_scores, log_probs,
                                   penalize_repeats, prefix_table, row_topk, stopped)
from tformer.decode.constraints import Constraints, choose

FINISH_RULES = ("all", "top_k")
PENALTIES = ("gnmt", "power")


def length_penalty(length: int, alpha: float, rule: str = "gnmt") -> float:
    """What a finished hypothesis of `length` tokens (</s> included) divides its log-probability by."""
    if rule not in PENALTIES:
        raise ValueError(f"rule must be one of {PENALTIES}, got {rule!r}")
    return ((5.0 + length) / 6.0) ** alpha if rule == "gnmt" else float(max(length, 1)) ** alpha


def penalties(longest: int, alpha: float, rule: str, device: torch.device) -> Tensor:
    """(longest + 1,) float64: `length_penalty` of every length 0 .. longest."""
    lengths = torch.arange(longest + 1, dtype=torch.float64, device=device)
    return ((5.0 + lengths) / 6.0) ** alpha if rule == "gnmt" else lengths.clamp(min=1) ** alpha


class Finished:
    """Each sentence's best finished hypotheses, at most `keep` of them, best first, with the `n`-th best
    score (the bar an ending must clear to matter) as a tensor the stopping rule compares against."""

    def __init__(self, B: int, keep: int, device: torch.device) -> None:
        self.keep = keep
        self.hyps: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]  # (normalised score, tokens)
        self._neg: list[list[float]] = [[] for _ in range(B)]  # -scores, ascending: for bisect
        self.device = device

    def add(self, sentence: int, score: float, tokens: list[int]) -> None:
        """Keep it if it ranks among the best `keep`; equal scores keep the order they were found in."""
        neg = self._neg[sentence]
        at = bisect.bisect_right(neg, -score)
        if at >= self.keep:
            return
        neg.insert(at, -score)
        self.hyps[sentence].insert(at, (score, tokens))
        del neg[self.keep :], self.hyps[sentence][self.keep :]

    def add_all(self, live: list[int], l: Tensor, tokens: Tensor, raw: Tensor, penalty: float) -> None:
        """`add` each ending, in order: live sentence l (E,) (an index into `live`, the sentences' original
        indices), its tokens (E, t), its raw score (E,) divided by `penalty`. The tensors come back to the host
        in one read each, however many end: on a GPU, a read per ending was a synchronisation per ending."""
        if l.numel():
            for i, toks, score in zip(l.tolist(), tokens.tolist(), raw.tolist()):
                self.add(live[i], score / penalty, toks)

    def nth(self, sentences: list[int], n: int) -> Tensor:
        """(L,) the n-th best finished score of each sentence, -inf while it has fewer than n."""
        return torch.tensor([-self._neg[i][n - 1] if len(self._neg[i]) >= n else float("-inf") for i in sentences],
                            device=self.device, dtype=torch.float64)


def beam_search(step: StepFn, cache: Cache, bos: int, eos: int, max_len: Tensor, beam: int, alpha: float = 0.6,
                min_len: int = 0, nbest: int = 1, no_repeat_ngram: int = 0,
                prefix: list[list[int]] | None = None, finish: str = "top_k", stop: Stop | None = None,
                penalty_rule: str = "gnmt", repetition_penalty: float = 1.0,
                constraints: Sequence[Sequence[Sequence[int]] | None] | None = None) -> NBest:
    """`cache` holds one row per sentence (B); `max_len` (B,) limits each sentence's output, raised where
    `prefix` (one id list per sentence, or None) is longer. `finish`: which endings are kept (module
    docstring). Returns the `nbest` best finished hypotheses of every sentence, each beginning with the
    sentence's prefix, with their length-normalised scores (fewer than `nbest` where fewer finite ones exist,
    e.g. an output cut to exactly its prefix). `stop` (common.stopped), asked before every step, takes
    sentences out at once with what they had finished. `alpha` and `penalty_rule`: the length normalisation
    (module docstring). `repetition_penalty` (common.penalize_repeats) changes the logits of each hypothesis's
    tokens so far before it is extended; its scores sum the penalised log-probabilities. `constraints`: one
    list of phrases (token id lists) per sentence, or None, that every output must hold (decode.constraints;
    a limit too short for them is raised)."""
    if finish not in FINISH_RULES:
        raise ValueError(f"finish must be one of {FINISH_RULES}, got {finish!r}")
    if penalty_rule not in PENALTIES:
        raise ValueError(f"penalty_rule must be one of {PENALTIES}, got {penalty_rule!r}")
    B, K = max_len.shape[0], beam
    device = max_len.device
    prefix, max_len = prefix_table(prefix, max_len, bos, eos)  # (B, P), (B,)
    rule = None
    if constraints is not None and any(constraints):
        rule, max_len = Constraints.of(constraints, prefix, max_len, (0, bos, eos))  # id 0: <pad>
    top_k = finish == "top_k"
    finished = Finished(B, K, device)
    penalty = penalties(int(max_len.max()) + 1, alpha, penalty_rule, device)  # (longest + 2,)
    divide = penalty.tolist()  # the same float64 values on the host: an ending's score is divided there
    sent = torch.arange(B, device=device)  # original index of each live sentence (L live)
    # k hypotheses per live sentence: 1 at the first step (all K beams would start identical, so only one is
    # computed), then K (fewer only while K exceeds the candidates a tiny vocabulary offers)
    prev = torch.full((B,), bos, dtype=torch.long, device=device)  # (L*k,)
    scores = torch.zeros((B, 1), device=device)  # (L, k) summed log-probabilities
    history = torch.empty((B, 0), dtype=torch.long, device=device)  # (L*k, t)
    t = 0
    while sent.numel():
        gone = stopped(stop, sent)  # (L,) or None
        if gone is not None:
            keep = (~gone).nonzero()[:, 0]  # (L',)
            if not keep.numel():
                break
            k = scores.shape[1]
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).reshape(-1)  # (L'*k,)
            sent, scores, prev = sent[keep], scores[keep], prev.index_select(0, keep_rows)
            history = history.index_select(0, keep_rows)
            cache = cache.reorder(keep_rows, keep)
            if rule is not None:
                rule.select(keep_rows)
        L, k = scores.shape
        live = sent.tolist()  # the host's copy, read once per step
        logits, cache = step(prev, cache)  # (L*k, V)
        logp = log_probs(penalize_repeats(logits, history, repetition_penalty))  # (L*k, V), over the logits
        forcing = t < prefix.shape[1]  # some sentence may still be inside its prefix
        if forcing:
            forced = prefix[sent, t].repeat_interleave(k)  # (L*k,) the prefix token due, -1 past the prefix
            kept = forced_scores(logp, forced)  # (L*k,) before the rules
        ranked = forbid(logp, history, t, eos, min_len, no_repeat_ngram)  # in place
        if rule is not None:  # the tokens left after this one, per row
            ranked = rule.allow(ranked, max_len.index_select(0, sent).repeat_interleave(k) - t - 1, eos)  # in place
        if forcing:  # the prefix token keeps its own log-probability; every row is computed alike
            ranked = force(ranked, forced, kept)  # in place
        V = ranked.shape[-1]
        t += 1
        base = scores.reshape(L * k, 1)  # (L*k, 1): a candidate's raw score is base + its log-probability
        if top_k:  # the 2K best extensions; </s> in the top K ranks ends
            row_val, row_tok = _candidates(ranked, min(2 * K, V), rule)  # (L*k, n)
            per_row = row_tok.shape[1]
            cand = (base + row_val).reshape(L, k * per_row)
            top_scores, top_idx = _take(cand, row_tok, min(2 * K, k * per_row), rule)
            top_tok = row_tok.reshape(L, -1).gather(1, top_idx)  # (L, 2K) best first, or as the banks take them
            top_beam = top_idx // per_row
            is_eos = top_tok == eos
            ranks = torch.arange(top_tok.shape[1], device=device)
            end_l, end_r = (is_eos & (ranks < K) & torch.isfinite(top_scores)).nonzero().unbind(1)  # (E,) each
            end_rows, end_raw = end_l * k + top_beam[end_l, end_r], top_scores[end_l, end_r]
            n_next = min(K, top_tok.shape[1] - k)  # at most k of the 2K end in </s>
            pick = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :n_next]  # (L, K')
            next_scores, next_beam = top_scores.gather(1, pick), top_beam.gather(1, pick)
            next_tok = top_tok.gather(1, pick)
        else:  # every finite ending may still win; the K best extensions that do not end go on
            eos_scores = (base[:, 0] + ranked[:, eos]).double()  # (L*k,)
            bar = finished.nth(live, nbest).repeat_interleave(k) * penalty[t]  # raw score to beat
            end_rows = (torch.isfinite(eos_scores) & (eos_scores > bar)).nonzero()[:, 0]  # (E,)
            end_l, end_raw = end_rows // k, eos_scores[end_rows]
            ranked[:, eos] = float("-inf")
            row_val, row_tok = _candidates(ranked, min(K, V), rule)  # (L*k, n)
            per_row = row_tok.shape[1]
            cand = (base + row_val).reshape(L, k * per_row)
            n_next = min(K, k * per_row)
            next_scores, top_idx = _take(cand, row_tok, n_next, rule)  # (L, K')
            next_tok = row_tok.reshape(L, -1).gather(1, top_idx)
            next_beam = top_idx // per_row
        finished.add_all(live, end_l, history.index_select(0, end_rows), end_raw, divide[t])
        rows = (torch.arange(L, device=device)[:, None] * k + next_beam).reshape(-1)  # (L*K',) parent rows
        k = n_next
        history = torch.cat([history.index_select(0, rows), next_tok.reshape(-1, 1)], dim=1)
        if rule is not None:
            rule.advance(rows, next_tok.reshape(-1))
        limits = max_len.index_select(0, sent)  # (L,)
        last = t >= limits  # the length limit: what is alive ends here
        end_l, end_j = (last[:, None] & torch.isfinite(next_scores)).nonzero().unbind(1)  # (E,) each, in row order
        finished.add_all(live, end_l, history.index_select(0, end_l * k + end_j), next_scores[end_l, end_j], divide[t])
        # done: at the limit; or no live hypothesis can still reach the nbest-th finished (exact); or, top_k,
        # K finished and none alive ranks above the K-th any more (Hugging Face's rule)
        alive_best = next_scores.amax(1).double()  # (L,) best live raw score
        reach = alive_best / torch.maximum(penalty[min(t + 1, len(penalty) - 1)], penalty[limits])
        done = last | (reach <= finished.nth(live, nbest))
        if top_k:
            done |= alive_best / penalty[t] <= finished.nth(live, K)
        n_done = int(done.sum())
        if n_done == L:
            break
        if n_done:
            keep = (~done).nonzero()[:, 0]  # (L',)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).reshape(-1)  # (L'*K',)
            sent, next_scores, next_tok = sent[keep], next_scores[keep], next_tok[keep]
            history = history.index_select(0, keep_rows)
            cache = cache.reorder(rows.index_select(0, keep_rows), keep)
            if rule is not None:
                rule.select(keep_rows)
        else:
            cache = cache.reorder(rows)
        scores, prev = next_scores, next_tok.reshape(-1)
    tokens = [[h[1] for h in hyps[:nbest]] for hyps in finished.hyps]
    return NBest(tokens, [[h[0] for h in hyps[:nbest]] for hyps in finished.hyps])


def _candidates(ranked: Tensor, n: int, rule: Constraints | None) -> tuple[Tensor, Tensor]:
    """Each row's candidate extensions, (values, tokens) (N, n'): its n best tokens and, under constraints, every
    token of its sentence's phrases that is not among them already (-inf where it is)."""
    values, tokens = row_topk(ranked, n)  # (N, n)
    if rule is None:
        return values, tokens
    extra = rule.extra()  # (N, a) the row's sentence's phrase tokens, -1 past them
    seen = (extra[:, :, None] == tokens[:, None, :]).any(2) | (extra < 0)
    extra = extra.clamp(min=0)  # padding: <pad>, at -inf
    extra_values = ranked.gather(1, extra).masked_fill(seen, float("-inf"))
    return torch.cat([values, extra_values], 1), torch.cat([tokens, extra], 1)


def _take(cand: Tensor, tokens: Tensor, n: int, rule: Constraints | None) -> tuple[Tensor, Tensor]:
    """(scores, positions) (L, n) of the candidates `cand` (L, m) a sentence keeps: the n best, or under
    constraints the n the banks take (constraints.choose), by the progress each candidate's token (`tokens`,
    (N, m/k)) makes."""
    if rule is None:
        return cand.topk(n, dim=1)
    banks = rule.progress(tokens).reshape(cand.shape)  # (L, m)
    at = choose(cand, banks, n)
    return cand.gather(1, at), at
