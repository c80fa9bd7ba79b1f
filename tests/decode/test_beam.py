"""Beam search and sampling against oracles: exhaustive search over hand-written probability tables,
greedy (beam 1), an uncached one-sentence-at-a-time beam, teacher-forced rescoring, and batch invariance."""

import itertools
import math

import pytest
import torch

from tformer.config import DecodeConfig, ModelConfig
from tformer.data import Vocab
from tformer.decode import TensorCache, filter_logits, length_penalty
from tformer.inference import translate_ids
from tformer.model import build_model

from helpers.models import TEST_DEVICE, on_device
from helpers.search import run_beam as beam_over, run_greedy, run_sample

pytestmark = pytest.mark.device
EOS, BOS = Vocab.eos, Vocab.bos
V = 7  # 4 specials + tokens 4, 5, 6


def table_step(table):
    """A step function reading next-token probabilities from {prefix tuple: {token: p}}; the prefix of every
    hypothesis rides in the cache as a hypothesis-level entry, so the search must reorder it."""

    def step(prev, cache):
        prefix = prev[:, None] if "hyp.prefix" not in cache else torch.cat([cache["hyp.prefix"], prev[:, None]], 1)
        logits = torch.full((prev.shape[0], V), -1e9)
        for r, row in enumerate(prefix.tolist()):
            for tok, p in table.get(tuple(row[1:]), {EOS: 1.0}).items():
                logits[r, tok] = math.log(p)
        # a sentence-level entry must keep one row per sentence
        assert cache["sentence"].shape[0] * (prev.shape[0] // cache["sentence"].shape[0]) == prev.shape[0]
        return logits, TensorCache({"hyp.prefix": prefix, "sentence": cache["sentence"]})

    return step


def exhaustive_best(table, max_len, alpha, rule="gnmt"):
    """Every complete path through `table` (ending in </s> or cut at max_len), best normalised score."""
    best = None

    def walk(prefix, logp):
        nonlocal best
        for tok, p in table.get(tuple(prefix), {EOS: 1.0}).items():
            lp, n = logp + math.log(p), len(prefix) + 1
            if tok == EOS or n == max_len:
                out = prefix if tok == EOS else prefix + [tok]
                score = lp / length_penalty(n, alpha, rule)
                if best is None or score > best[0]:
                    best = (score, out)
            else:
                walk(prefix + [tok], lp)

    walk([], 0.0)
    return best


def run_beam(table, K, alpha, max_len=6, nbest=1, finish="all", rule="gnmt"):
    cache = TensorCache({"sentence": torch.zeros(1)})
    return beam_over(table_step(table), cache, torch.tensor([max_len]), K, alpha, nbest=nbest, finish=finish,
                     penalty_rule=rule)


# Greedy takes 4 (0.55) and then finds nothing better than 0.35; the best path is 5 </s> (0.45 * 0.95).
GARDEN = {
    (): {4: 0.55, 5: 0.45},
    (4,): {EOS: 0.30, 6: 0.35, 4: 0.35},  # greedy goes 4 and then finds only poor continuations
    (4, 6): {EOS: 0.5, 6: 0.5},
    (4, 4): {EOS: 0.5, 4: 0.5},
    (5,): {EOS: 0.95, 5: 0.05},  # the best path: 5 </s> = 0.4275
}


def test_beam_finds_the_best_path_greedy_misses():
    greedy = run_greedy(table_step(GARDEN), TensorCache({"sentence": torch.zeros(1)}), torch.tensor([6]))
    assert greedy.tokens[0][0] == 4  # greedy commits to 4 (0.55), whose continuations are all poor
    hyp = run_beam(GARDEN, K=2, alpha=0.0)
    assert hyp.tokens == [[[5]]]
    assert hyp.scores[0][0] == pytest.approx(math.log(0.45 * 0.95))


# A choice between a short and a long output: the short one is more probable, the long one wins once
# the length penalty divides by ((5 + |Y|) / 6) ** alpha with a large enough alpha.
SHORT_LONG = {
    (): {4: 0.5, 5: 0.5},
    (4,): {EOS: 1.0},  # "4 </s>": log 0.5 = -0.693, 2 tokens
    (5,): {5: 1.0},
    (5, 5): {5: 1.0},
    (5, 5, 5): {5: 0.9, EOS: 0.1},
    (5, 5, 5, 5): {EOS: 1.0},  # "5 5 5 5 </s>": log 0.45 = -0.799, 5 tokens
}


@pytest.mark.parametrize("alpha, expected", [(0.0, [4]), (0.3, [4]), (1.0, [5, 5, 5, 5]), (2.0, [5, 5, 5, 5])])
def test_length_penalty_favours_short_or_long(alpha, expected):
    oracle = exhaustive_best(SHORT_LONG, 6, alpha)
    assert oracle[1] == expected  # the table does what this test means it to
    hyp = run_beam(SHORT_LONG, K=2, alpha=alpha)
    assert hyp.tokens[0][0] == expected
    assert hyp.scores[0][0] == pytest.approx(oracle[0])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha,rule", [(0.0, "gnmt"), (1.0, "gnmt"), (1.0, "power"), (2.0, "power")])
def test_wide_beam_equals_exhaustive_search_on_random_tables(seed, alpha, rule):
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(4):
        for prefix in itertools.product([4, 5, 6], repeat=n):
            p = torch.rand(4, generator=g) + 0.05
            table[prefix] = dict(zip([EOS, 4, 5, 6], (p / p.sum()).tolist()))
    oracle = exhaustive_best(table, 4, alpha, rule)
    hyp = run_beam(table, K=200, alpha=alpha, max_len=4, rule=rule)
    assert hyp.tokens[0][0] == oracle[1]
    assert hyp.scores[0][0] == pytest.approx(oracle[0], abs=1e-5)


# An ending at hand at the first step (</s>: 0.4) that a beam of 1 under fairseq's rule never keeps: </s> ranks
# second of the 2K = 2 candidates, outside the top K = 1; after 4, token 4 always leads (0.3) with </s> behind
# it (0.2), so that beam follows 4s to the limit: 0.6 * 0.3^5, far below 0.4.
EARLY_END = {(): {EOS: 0.4, 4: 0.6}, **{(4,) * n: {4: 0.3, EOS: 0.2, 5: 0.25, 6: 0.25} for n in range(1, 6)}}


@pytest.mark.parametrize("K", [1, 2])
def test_every_finished_candidate_is_kept_and_the_best_ending_returned(K):
    oracle = exhaustive_best(EARLY_END, 6, 0.0)
    assert oracle[1] == [] and oracle[0] == pytest.approx(math.log(0.4))  # the ending at the first step
    got = run_beam(EARLY_END, K=K, alpha=0.0, finish="all")
    assert got.tokens == [[[]]] and got.scores[0][0] == pytest.approx(math.log(0.4))
    fairseq = run_beam(EARLY_END, K=K, alpha=0.0, finish="top_k")
    if K == 1:  # </s> at rank 2 of 2 is outside the top K = 1: the beam goes on through 4 and ends far lower
        assert fairseq.tokens[0][0][:1] == [4] and fairseq.scores[0][0] < math.log(0.4) - 1
    else:  # rank 2 of 4 is inside the top K = 2: both rules keep it
        assert fairseq.tokens == got.tokens


def _all_endings_reference(table, K, alpha, max_len):
    """The "all" rule written plainly, one sentence, no tensors: every step, each live hypothesis's </s>
    extension is a finished candidate; the K best other extensions go on; stop at the limit or when the best
    live raw score, divided by the largest penalty it can still end at, cannot beat the best finished."""
    alive, finished = [(0.0, [])], []
    for t in range(1, max_len + 1):
        cands = []
        for score, toks in alive:
            for tok, p in table.get(tuple(toks), {EOS: 1.0}).items():
                cands.append((score + math.log(p), toks, tok))
        finished += [(s / length_penalty(t, alpha), toks) for s, toks, tok in cands if tok == EOS]
        alive = sorted(((s, toks + [tok]) for s, toks, tok in cands if tok != EOS), key=lambda c: -c[0])[:K]
        if t == max_len:
            finished += [(s / length_penalty(t, alpha), toks) for s, toks in alive]
            break
        if not alive or (finished and alive[0][0] / max(length_penalty(t + 1, alpha), length_penalty(max_len, alpha))
                         <= max(f[0] for f in finished)):
            break
    return max(finished, key=lambda f: f[0])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("K, alpha", [(1, 0.0), (2, 0.0), (2, 1.0), (3, 0.6)])
def test_the_all_rule_equals_its_plain_reference_and_never_scores_below_fairseqs(seed, K, alpha):
    g = torch.Generator().manual_seed(100 + seed)
    table = {}
    for n in range(5):
        for prefix in itertools.product([4, 5, 6], repeat=n):
            p = torch.rand(4, generator=g) ** 3 + 0.01  # peaky: rankings differ between the rules
            table[prefix] = dict(zip([EOS, 4, 5, 6], (p / p.sum()).tolist()))
    want = _all_endings_reference(table, K, alpha, 5)
    got = run_beam(table, K=K, alpha=alpha, max_len=5, finish="all")
    assert got.scores[0][0] == pytest.approx(want[0], abs=1e-5)
    assert got.tokens[0][0] == want[1]
    fairseq = run_beam(table, K=K, alpha=alpha, max_len=5, finish="top_k")
    assert got.scores[0][0] >= fairseq.scores[0][0] - 1e-6  # the same live beam, more endings kept, exact stop


def test_nbest_is_sorted_and_distinct():
    hyp = run_beam(GARDEN, K=4, alpha=0.0, nbest=4)
    scores = hyp.scores[0]
    assert len(hyp.tokens[0]) == 4 and scores == sorted(scores, reverse=True)
    assert len({tuple(t) for t in hyp.tokens[0]}) == 4
    assert hyp.tokens[0][0] == [5]


# ----------------------------------------------------------------------------- on a real (random) model


def _model(**kw):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, **kw)
    torch.manual_seed(2)
    model = build_model(cfg, 13, 13).eval()
    with torch.no_grad():  # a peaky output layer, so that searches disagree and ties are rare
        for p in model.generator.parameters():
            p.mul_(4.0)
    return on_device(model)


def _sources(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 13, (int(k),), generator=g).tolist() for k in torch.randint(1, 10, (n,), generator=g)]


@torch.no_grad()
def test_beam_one_equals_greedy_under_fairseqs_rule_and_scores_at_least_as_well_under_all():
    model, sources = _model(), _sources(9)
    greedy = translate_ids(model, sources, DecodeConfig(max_len_a=1.5, max_len_b=4))
    beam = translate_ids(model, sources, DecodeConfig(strategy="beam", beam_size=1, beam_finish="top_k",
                                                      max_len_a=1.5, max_len_b=4))
    assert beam.tokens == greedy.tokens
    # every ending kept: a beam of 1 follows greedy's path but may end earlier, where ending scored better
    every = translate_ids(model, sources, DecodeConfig(strategy="beam", beam_size=1, beam_finish="all",
                                                       len_penalty=0.0, max_len_a=1.5, max_len_b=4))
    for hyps, scores, g, g_score in zip(every.tokens, every.scores, greedy.tokens, greedy.scores):
        assert g[0][: len(hyps[0])] == hyps[0] and scores[0] >= g_score[0] - 1e-5
    assert every.tokens != greedy.tokens  # the model is peaky enough that some sentence ends earlier


@torch.no_grad()
def test_beam_is_batch_invariant():
    model, sources = _model(norm="pre"), _sources(7)
    cfg = DecodeConfig(strategy="beam", beam_size=4, nbest=3, max_len_a=1.5, max_len_b=4, batch_size=7)
    batched = translate_ids(model, sources, cfg)
    for i, s in enumerate(sources):
        alone = translate_ids(model, [s], cfg)
        assert alone.tokens[0] == batched.tokens[i]
        assert alone.scores[0] == pytest.approx(batched.scores[i], abs=1e-5)


def _reference_beam(model, src_ids, K, alpha, max_len, finish):
    """One sentence, no cache: every step re-runs the decoder on each hypothesis' whole prefix. Same rules:
    top_k: the 2K best candidates, </s> in the top K ranks finishes; stop at the length limit or when K have
    finished and the best live hypothesis (normalised at its length) does not beat the K-th finished. all:
    every live hypothesis's </s> extension finishes; the K best others go on; stop at the limit or when the
    best live raw score over the largest penalty still reachable does not beat the best finished."""
    src = torch.tensor([src_ids + [EOS]], device=TEST_DEVICE)
    enc = model.encode(src, torch.tensor([src.shape[1]], device=TEST_DEVICE))
    alive, finished = [(0.0, [])], []
    for t in range(1, max_len + 1):
        cands = []
        for k, (score, toks) in enumerate(alive):
            prefix = torch.tensor([[BOS] + toks], device=TEST_DEVICE)
            hidden = model.decode(prefix, torch.tensor([prefix.shape[1]], device=TEST_DEVICE), enc).hidden
            logp = torch.log_softmax(model.generator(hidden[0, -1]), -1)
            logp[[Vocab.pad, BOS]] = float("-inf")  # never generated
            cands += [(score + float(logp[v]), k, v) for v in range(logp.shape[0])]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))  # ties: lower beam, lower token (as topk on K*V)
        top = cands[: 2 * K] if finish == "top_k" else cands
        for rank, (s, k, v) in enumerate(top):
            if v == EOS and (rank < K or finish == "all"):
                finished.append((s / length_penalty(t, alpha), alive[k][1]))
        alive = [(s, alive[k][1] + [v]) for s, k, v in top if v != EOS][:K]
        if t == max_len:
            finished += [(s / length_penalty(t, alpha), toks) for s, toks in alive]
            break
        if finish == "top_k":
            kth = sorted(h[0] for h in finished)[-K] if len(finished) >= K else None
            if kth is not None and alive[0][0] / length_penalty(t, alpha) <= kth:
                break
        elif alive[0][0] / max(length_penalty(t + 1, alpha), length_penalty(max_len, alpha)) <= max(
                (h[0] for h in finished), default=float("-inf")):
            break
    finished.sort(key=lambda h: -h[0])
    return finished[0]


@torch.no_grad()
@pytest.mark.parametrize("finish", ["all", "top_k"])
@pytest.mark.parametrize("K, alpha", [(3, 0.6), (5, 0.0), (2, 0.0)])
def test_cached_batched_beam_equals_uncached_reference(K, alpha, finish):
    model, sources = _model(), _sources(6, seed=11)
    cfg = DecodeConfig(strategy="beam", beam_size=K, len_penalty=alpha, max_len_a=1.0, max_len_b=3,
                       beam_finish=finish)
    got = translate_ids(model, sources, cfg)
    for i, s in enumerate(sources):
        score, toks = _reference_beam(model, s, K, alpha, len(s) + 3, finish)
        assert got.tokens[i][0] == toks
        assert got.scores[i][0] == pytest.approx(score, abs=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_exact_early_stop_for_the_nbest_changes_nothing_but_the_work(alpha):
    """With nbest = 1 a sentence may stop as soon as no live hypothesis can still beat its best finished one;
    with nbest = K only the K-finished rule applies (the bound then never ends a sentence earlier for
    alpha = 0). The best hypothesis must be the same; the work, for alpha = 0, smaller."""
    model, sources = _model(), _sources(12, seed=3)
    work = []
    real_step = model.decode_step

    def counting(tokens, cache):
        work[-1] += tokens.shape[0]
        return real_step(tokens, cache)

    model.decode_step = counting
    got = {}
    for nbest in (1, 4):
        work.append(0)
        cfg = DecodeConfig(strategy="beam", beam_size=4, nbest=nbest, len_penalty=alpha, max_len_a=1.5, max_len_b=5)
        got[nbest] = translate_ids(model, sources, cfg)
    del model.decode_step
    assert [h[0] for h in got[1].tokens] == [h[0] for h in got[4].tokens]
    assert [s[0] for s in got[1].scores] == pytest.approx([s[0] for s in got[4].scores])
    assert work[0] <= work[1] and (alpha or work[0] < work[1])


@torch.no_grad()
def test_beam_scores_equal_teacher_forced_rescoring_and_memory_is_not_copied():
    model, sources = _model(), _sources(4, seed=8)
    rows_seen = []
    real_step = model.decode_step

    def spy(tokens, cache):
        rows_seen.append((tokens.shape[0], cache.cross[0][0].shape[0]))
        return real_step(tokens, cache)

    model.decode_step = spy
    cfg = DecodeConfig(strategy="beam", beam_size=4, nbest=4, len_penalty=1.0, max_len_a=1.0, max_len_b=3)
    got = translate_ids(model, sources, cfg)
    del model.decode_step
    # the first step runs one hypothesis per sentence (all 4 beams would be <s>), then 4 per row of encoder
    # keys/values, which are never repeated per beam
    assert rows_seen[0] == (len(sources), len(sources))  # one batch
    assert all(n == 4 * b for n, b in rows_seen[1:])
    for s, hyps, scores in zip(sources, got.tokens, got.scores):
        for toks, score in zip(hyps, scores):
            src = torch.tensor([s + [EOS]], device=TEST_DEVICE)
            tgt_in = torch.tensor([[BOS] + toks], device=TEST_DEVICE)
            lengths = torch.tensor([src.shape[1], tgt_in.shape[1]], device=TEST_DEVICE)
            hidden = model(src, lengths[:1], tgt_in, lengths[1:]).hidden
            logp = torch.log_softmax(model.generator(hidden[0]), -1)
            targets = toks + [EOS]
            n = len(targets) if len(toks) < len(s) + 3 else len(toks)  # cut at the limit: no </s>
            total = sum(float(logp[i, targets[i]]) for i in range(n))
            assert score == pytest.approx(total / length_penalty(n, 1.0), abs=1e-4)


# ----------------------------------------------------------------------------- sampling


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda lp: torch.isfinite(lp[0]).nonzero()[:, 0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, 1.0, 2, 1.0)) == [0, 1]
    assert kept(filter_logits(logits, 1.0, 0, 0.8)) == [0, 1]  # 0.5 + 0.3 reaches 0.8
    assert kept(filter_logits(logits, 1.0, 0, 0.81)) == [0, 1, 2]
    assert kept(filter_logits(logits, 1.0, 0, 0.1)) == [0]
    lp = filter_logits(logits, 1.0, 2, 1.0)
    assert lp.exp().sum().item() == pytest.approx(1.0)
    assert lp[0, 0].exp().item() == pytest.approx(0.5 / 0.8)
    sharp = filter_logits(logits, 0.5, 0, 1.0).exp()[0]  # temperature 0.5 squares and renormalises
    assert sharp[0].item() == pytest.approx(0.25 / (0.25 + 0.09 + 0.0225 + 0.0025))


@torch.no_grad()
def test_sampling_top_k_one_is_greedy_and_seeded_draws_are_batch_invariant():
    model, sources = _model(), _sources(6)
    greedy = translate_ids(model, sources, DecodeConfig(max_len_a=1.5, max_len_b=4))
    top1 = translate_ids(model, sources, DecodeConfig(strategy="sample", top_k=1, max_len_a=1.5, max_len_b=4))
    assert top1.tokens == greedy.tokens
    cfg = DecodeConfig(strategy="sample", nbest=3, seed=4, max_len_a=1.5, max_len_b=4, batch_size=6)
    a = translate_ids(model, sources, cfg)
    assert a == translate_ids(model, sources, cfg)
    small = DecodeConfig(strategy="sample", nbest=3, seed=4, max_len_a=1.5, max_len_b=4, batch_size=2)
    assert translate_ids(model, sources, small).tokens == a.tokens
    other = translate_ids(model, sources, DecodeConfig(strategy="sample", nbest=3, seed=5, max_len_a=1.5,
                                                       max_len_b=4))
    assert other.tokens != a.tokens


def test_sampling_frequencies_follow_the_distribution():
    probs = {4: 0.6, 5: 0.3, 6: 0.1}
    table = {(): probs}
    cache = TensorCache({"sentence": torch.zeros(400)})
    out = run_sample(table_step(table), cache, torch.full((400,), 3), ids=list(range(400)))
    first = [h[0][0] for h in out.tokens]
    freq = {k: first.count(k) / 400 for k in probs}
    for k, p in probs.items():  # 4 standard deviations of a binomial proportion
        assert abs(freq[k] - p) < 4 * math.sqrt(p * (1 - p) / 400)
