"""Oracles written out plainly: what batching may change in a score, token-budget batch ends by the plain loop,
corpus BLEU by its definition."""

import collections
import math

import pytest

# What batching may change in a score (docs/reliability.md, "Outputs and batching"; docs/howto/translate.md):
# tokens and texts never; a log-probability only in its last float32 digits, per token within REL of
# max(1, |value|), so a sum within REL of its absolute value plus REL per token.
REL = 1e-5


def assert_same_scores(got, want) -> None:
    """`got` and `want`, lists of tformer Score (forced decoding) for the same pairs, agree as batching promises:
    the same tokens and alignments, every log-probability within REL (per token: of max(1, |value|))."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.tokens == w.tokens and g.alignment == w.alignment, i
        assert g.token_log_probs == pytest.approx(w.token_log_probs, rel=REL, abs=REL), i
        assert g.log_prob == pytest.approx(w.log_prob, rel=REL, abs=REL * len(w.tokens)), i


def greedy_batch_ends(sizes: list[int], max_tokens: int, max_sentences: int) -> list[int]:
    """Token-budget batch ends by the plain loop, the oracle of BatchPlan: take the next example while
    count x longest stays within the budget (and the count within `max_sentences`, 0 = no cap)."""
    ends, count, longest = [], 0, 0
    for i, s in enumerate(sizes):
        if count and (max(longest, s) * (count + 1) > max_tokens or (max_sentences and count >= max_sentences)):
            ends.append(i)
            count, longest = 0, 0
        count, longest = count + 1, max(longest, s)
    return ends + [len(sizes)] if sizes else []


def bleu_by_definition(hyps, refs):
    """Corpus BLEU-4 from its definition (Papineni et al., 2002) on whitespace tokens, one reference."""
    match, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h, r = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = collections.Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            rc = collections.Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    logp = sum(math.log(m / t) for m, t in zip(match, total)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(logp)
