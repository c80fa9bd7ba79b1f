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

The rules (decode.rules) shape every step's log-probabilities; constraints also choose which candidates are
kept (`Rules.candidates`, `Rules.take`). A forced target prefix is a rule (`rules.ForcedPrefix`): while a
sentence is inside its prefix, every continuation but the prefix token is -inf, the prefix token keeps its
log-probability.
A sentence starts from one hypothesis, so exactly one finite hypothesis follows the prefix and the other K-1 rows
carry -inf scores: -inf never turns finite, never finishes (only finite candidates are set aside) and ranks below
every finite candidate, so from the end of the prefix the search goes on exactly as a beam started from that one
hypothesis. Scores include the prefix tokens (a raw score is still the teacher-forced log-probability) and
lengths count them. No hypothesis can finish inside the prefix (</s> is -inf there, and the limit is raised
to the prefix's length), so no stopping rule fires before it ends, and the exact bound holds afterwards.
"""

from __future__ import annotations

import bisect

import torch
from torch import Tensor

from tformer.data.vocab import Vocab
from tformer.decode.batch import Batch
from tformer.decode.common import Cache, NBest, StepFn, Stop, log_probs
from tformer.decode.rules import Rules

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


def beam_search(step: StepFn, cache: Cache, max_len: Tensor, rules: Rules, beam: int, alpha: float = 0.6,
                nbest: int = 1, finish: str = "top_k", penalty_rule: str = "gnmt", stop: Stop | None = None) -> NBest:
    """`cache` holds one row per sentence (B); `rules` (decode.rules.rules_for, which also gives the limits
    `max_len` (B,)) shape every step's log-probabilities and, under constraints, which candidates are kept.
    `beam`: K hypotheses per sentence. `finish`: which endings are kept (module docstring). Returns the
    `nbest` best finished hypotheses of every sentence, each beginning with the sentence's prefix, with their
    length-normalised scores (fewer than `nbest` where fewer finite ones exist, e.g. an output cut to exactly
    its prefix). `stop` (common.stopped), asked before every step, takes sentences out at once with what they
    had finished. `alpha` and `penalty_rule`: the length normalisation (module docstring)."""
    if finish not in FINISH_RULES:
        raise ValueError(f"finish must be one of {FINISH_RULES}, got {finish!r}")
    if penalty_rule not in PENALTIES:
        raise ValueError(f"penalty_rule must be one of {PENALTIES}, got {penalty_rule!r}")
    B, K, eos, longest = max_len.shape[0], beam, Vocab.eos, int(max_len.max())
    device = max_len.device
    top_k = finish == "top_k"
    finished = Finished(B, K, device)
    penalty = penalties(longest + 1, alpha, penalty_rule, device)  # (longest + 2,)
    divide = penalty.tolist()  # the same float64 values on the host: an ending's score is divided there
    # k hypotheses per live sentence: 1 at the first step (all K beams would start identical, so only one is
    # computed), then K (fewer only while K exceeds the candidates a tiny vocabulary offers); carried: their
    # summed log-probabilities (L, k)
    batch = Batch(cache, rules, torch.arange(B, device=device), torch.zeros((B, 1), device=device), longest)
    while batch.go_on(stop):
        L, k = batch.carried.shape
        live = batch.sentence.tolist()  # the host's copy, read once per step
        logits = batch.step(step)  # (L*k, V)
        ranked, _ = rules.scores(logits, batch, log_probs)  # (L*k, V), over the logits
        V = ranked.shape[-1]
        t = batch.t + 1  # the tokens each extension holds
        base = batch.carried.reshape(L * k, 1)  # (L*k, 1): a candidate's raw score is base + its log-probability
        if top_k:  # the 2K best extensions; </s> in the top K ranks ends
            row_val, row_tok = rules.candidates(ranked, min(2 * K, V))  # (L*k, n)
            per_row = row_tok.shape[1]
            cand = (base + row_val).reshape(L, k * per_row)
            top_scores, top_idx = rules.take(cand, row_tok, min(2 * K, k * per_row))
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
            row_val, row_tok = rules.candidates(ranked, min(K, V))  # (L*k, n)
            per_row = row_tok.shape[1]
            cand = (base + row_val).reshape(L, k * per_row)
            n_next = min(K, k * per_row)
            next_scores, top_idx = rules.take(cand, row_tok, n_next)  # (L, K')
            next_tok = row_tok.reshape(L, -1).gather(1, top_idx)
            next_beam = top_idx // per_row
        finished.add_all(live, end_l, batch.history.index_select(0, end_rows), end_raw, divide[t])
        parents = (torch.arange(L, device=device)[:, None] * k + next_beam).reshape(-1)  # (L*K',)
        batch.advance(next_tok.reshape(-1), parents)
        batch.carried = next_scores
        k = n_next
        limits = max_len.index_select(0, batch.sentence)  # (L,)
        last = t >= limits  # the length limit: what is alive ends here
        end_l, end_j = (last[:, None] & torch.isfinite(next_scores)).nonzero().unbind(1)  # (E,) each, in row order
        finished.add_all(live, end_l, batch.history.index_select(0, end_l * k + end_j), next_scores[end_l, end_j],
                         divide[t])
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
        batch.keep(done if n_done else None)
    tokens = [[h[1] for h in hyps[:nbest]] for hyps in finished.hyps]
    return NBest(tokens, [[h[0] for h in hyps[:nbest]] for hyps in finished.hyps])
