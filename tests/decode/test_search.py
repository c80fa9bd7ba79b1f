"""The searches' contract against oracles: sentences taken out by `stop` leave the others as each alone would
decode, the searches and their helpers put every tensor on their inputs' device, `search` hands every setting
to the search it names, the length penalties are their formulas, and bad settings are refused by name."""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from helpers.models import assert_follows_input_device
from helpers.search import (BOS, EOS, PAD, REPEAT, RULE_PREFIX, RULE_TABLES, V, cache_of, plain_greedy, plain_paths,
                            random_table, run_beam, run_greedy, run_sample, tables_step)
from tformer.config import DecodeConfig
from tformer.data import Vocab
from tformer.decode import (TensorCache, force, forced_scores, length_penalty, log_probs, max_lengths, prefix_table,
                            rules_for, search, select_rows, stopped)
from tformer.decode.beam import Finished, penalties
from tformer.decode.common import row_max, row_topk


# ----------------------------------------------------------------------------- stop: sentences taken out


def long_table(seed):
    """A random table where </s> is rare, so that outputs run to their limit: a sentence stopped early has
    had fewer steps than it would have taken."""
    table = random_table(seed, depth=6)
    return {h: {t: (p * 0.05 if t == EOS else p) for t, p in d.items()} for h, d in table.items()}


class Stopper:
    """Stops the sentences `gone` before step `at` (counting from 0), recording what it was asked."""

    def __init__(self, gone, at):
        self.gone, self.at, self.asked = set(gone), at, []

    def __call__(self, live):
        self.asked.append(list(live))
        return [s in self.gone and len(self.asked) > self.at for s in live]


TABLES = [long_table(s) for s in range(5)]
GONE, AT = {1, 3}, 2  # sentences 1 and 3 leave before the third step


def _alone(fn, i):
    return fn(cache_of([i]), torch.tensor([6]), [i])


def _assert_asked(stopper, B, per=1):
    """`stop` is asked about every live sentence in batch order (sampling: once per live sample)."""
    assert stopper.asked[0] == [i for i in range(B) for _ in range(per)]
    for n, live in enumerate(stopper.asked):
        assert live == sorted(live)
        if n > stopper.at:  # once stopped, never asked about again
            assert not set(live) & stopper.gone


@pytest.mark.parametrize("strategy", ["greedy", "beam_all", "beam_top_k", "sample"])
def test_stopped_sentences_leave_and_the_others_decode_as_each_alone(strategy):
    """Oracle: each sentence decoded alone, without `stop`. A stopped sentence keeps what it had: greedy the
    tokens of its first AT steps, beam and sampling only hypotheses that had ended before the stop (and a
    sample is the very sample it would have been)."""
    step = tables_step(TABLES)
    if strategy == "greedy":
        def run(cache, limit, ids, stop=None, prefix=None):
            h = run_greedy(step, cache, limit, prefix=prefix, stop=stop)
            return [[t] for t in h.tokens], [[s] for s in h.scores]
    elif strategy.startswith("beam"):
        def run(cache, limit, ids, stop=None, prefix=None):
            return run_beam(step, cache, limit, 3, 0.6, nbest=2, prefix=prefix,
                            finish=strategy[5:], stop=stop)
    else:
        def run(cache, limit, ids, stop=None, prefix=None):
            return run_sample(tables_step(TABLES, shared=False), cache, limit, ids, n=3, seed=5, prefix=prefix,
                              stop=stop)
    B = len(TABLES)
    stopper = Stopper(GONE, AT)
    tokens, scores = run(cache_of(list(range(B))), torch.full((B,), 6), list(range(B)), stopper)
    _assert_asked(stopper, B, 3 if strategy == "sample" else 1)
    assert len(stopper.asked) > AT + 1  # the others went on after the stop
    for i in range(B):
        want_tokens, want_scores = run(cache_of([i]), torch.tensor([6]), [i])
        if i not in GONE:
            assert tokens[i] == want_tokens[0]
            assert scores[i] == pytest.approx(want_scores[0], abs=1e-6)
        elif strategy == "greedy":
            assert len(want_tokens[0][0]) > AT and tokens[i] == [want_tokens[0][0][:AT]]
        else:  # only what had ended in fewer than AT tokens (</s> the AT-th at the latest)
            assert all(len(h) < AT for h in tokens[i])
            if strategy == "sample":
                assert all(h in want_tokens[0] for h in tokens[i])


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_stopping_every_sentence_ends_the_search_before_any_step(strategy):
    calls = []

    def step(prev, cache):
        calls.append(prev.shape[0])
        return tables_step(TABLES)(prev, cache)

    cfg = DecodeConfig(strategy=strategy, beam_size=2, nbest=1 if strategy == "greedy" else 2)
    out = search(step, cache_of([0, 1, 2]), torch.full((3,), 4), cfg, stop=lambda live: [True] * len(live))
    assert calls == []
    if strategy == "greedy":
        assert out == ([[[]], [[]], [[]]], [[0.0], [0.0], [0.0]])  # nothing decoded: no tokens, no score
    else:
        assert out == ([[], [], []], [[], [], []])  # nothing finished


def test_stopped_says_which_sentences_to_take_out_on_their_device():
    live = torch.tensor([0, 2, 5])
    assert stopped(None, live) is None
    assert stopped(lambda s: [False] * len(s), live) is None  # none stops: nothing to do
    asked = []
    assert stopped(lambda s: asked.append(s) or [False] * len(s), live[:0]) is None and asked == []
    got = assert_follows_input_device(stopped, lambda s: [x == 2 for x in s], live)
    assert got.dtype == torch.bool and got.tolist() == [False, True, False]


# ----------------------------------------------------------------------------- devices


def test_the_searches_put_every_tensor_on_their_inputs_device():
    """Device oracle (conftest): each search, with every rule, a prefix and a stop, run under a 'meta' default
    device gives the CPU result: no tensor is made off the inputs' device."""
    step, B = tables_step(TABLES), len(TABLES)
    cache, limit = cache_of(list(range(B))), torch.tensor([6, 5, 2, 6, 4])
    prefix = [[4, 5], [], None, [6], [5, 5, 5, 5, 5]]
    rules = dict(min_len=2, no_repeat_ngram=2, prefix=prefix)

    def stop():  # a fresh one for each run
        return Stopper({3}, 2)

    assert_follows_input_device(lambda: run_greedy(step, cache, limit, **rules, stop=stop()))
    for finish in ("all", "top_k"):
        assert_follows_input_device(lambda: run_beam(step, cache, limit, 3, 0.6, nbest=2,
                                                     finish=finish, **rules, stop=stop()))
    sampling = tables_step(TABLES, shared=False)
    assert_follows_input_device(lambda: run_sample(sampling, cache, limit, [3, 1, 4, 1, 5], n=2, top_k=2,
                                                   top_p=0.9, temperature=0.7, **rules, stop=stop()))


def test_rules_for_builds_only_the_rules_a_batch_needs_in_their_order():
    """A rule that would do nothing for the batch is not built (the plain search runs only the one that keeps
    <pad> and <s> out); every rule asked for is, in ORDER; the limits are raised for a prefix and phrases."""
    from tformer.decode import PHRASE_INPUTS
    from tformer.decode.phrases import PHRASE_INPUTS as declared
    from tformer.decode.rules import ORDER, NeverSpecial

    limit = torch.tensor([3, 3])
    plain, same = rules_for(DecodeConfig(), limit, [[], None], {"constraints": [None, []]})
    assert [type(r) for r in plain.rules] == [NeverSpecial] and torch.equal(same, limit)
    cfg = DecodeConfig(strategy="beam", min_len=2, no_repeat_ngram=2, repetition_penalty=1.2, unk_penalty=2.0)
    every, raised = rules_for(cfg, limit, [[4, 5, 6, 4], None], {"constraints": [None, [[5, 6, 4, 5]]],
                                                                  "avoid": [[[6, 6]], None]})
    assert [type(r) for r in every.rules] == list(ORDER)
    assert raised.tolist() == [4, 4]  # the prefix's 4 tokens; the phrase's 4
    assert declared is PHRASE_INPUTS and [p.name for p in PHRASE_INPUTS] == ["avoid", "constraints"]


def test_the_helpers_put_every_tensor_on_their_inputs_device():
    limit = torch.tensor([3, 1, 4])
    assert_follows_input_device(prefix_table, [[4, 5, 6, 4], None, []], limit, BOS, EOS)
    assert_follows_input_device(prefix_table, None, limit, BOS, EOS)
    table, raised = prefix_table([[4, 5, 6, 4], None, []], limit.to("meta"), BOS, EOS)  # built on the CPU, then
    assert table.device == raised.device == torch.device("meta")  # moved to the limits' device (meta: any other)
    assert_follows_input_device(max_lengths, limit, 1.5, 2)
    history = torch.tensor([[4, 5, 6, 4, 5], [4, 4, 4, 4, 4]])
    rules, _ = rules_for(DecodeConfig(min_len=6, no_repeat_ngram=3, repetition_penalty=1.3), torch.tensor([9, 9]))
    at = SimpleNamespace(t=5, history=history)
    assert_follows_input_device(lambda x: rules.scores(x.clone(), at)[0], torch.zeros(2, V))
    forced = torch.tensor([4, -1, 6])
    assert_follows_input_device(lambda x, scores: force(x.clone(), forced, scores), torch.randn(3, V), torch.randn(3))
    assert_follows_input_device(forced_scores, torch.randn(3, V), forced)
    assert_follows_input_device(lambda x: log_probs(x.clone()), torch.randn(3, V))
    wide = torch.randn(3, 6000)  # wide enough for the grouped path
    assert_follows_input_device(row_topk, wide, 4)
    assert_follows_input_device(row_max, wide)
    cpu = torch.device("cpu")
    assert_follows_input_device(penalties, 6, 0.6, "gnmt", cpu)
    assert_follows_input_device(penalties, 6, 0.6, "power", cpu)

    def nth():
        done = Finished(3, 2, cpu)
        done.add(0, -1.0, [4])
        done.add(0, -2.0, [5])
        done.add(2, -0.5, [6])
        return done.nth([0, 1, 2], 1), done.nth([0, 1, 2], 2)

    got = assert_follows_input_device(nth)
    assert got[0].tolist() == [-1.0, float("-inf"), -0.5] and got[1].tolist() == [-2.0, float("-inf"), float("-inf")]


# ----------------------------------------------------------------------------- settings: formulas and refusals


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
def test_length_penalties_are_their_formulas(alpha):
    """GNMT: ((5 + |Y|) / 6) ** alpha; power: |Y| ** alpha, an empty length counting as 1. `penalties` is
    the same for every length 0 .. longest, in float64."""
    for n in range(0, 9):
        assert length_penalty(n, alpha) == pytest.approx(((5 + n) / 6) ** alpha, rel=1e-12)
        assert length_penalty(n, alpha, "gnmt") == pytest.approx(((5 + n) / 6) ** alpha, rel=1e-12)
        assert length_penalty(n, alpha, "power") == pytest.approx(max(n, 1) ** alpha, rel=1e-12)
    for rule, formula in (("gnmt", lambda n: ((5 + n) / 6) ** alpha), ("power", lambda n: max(n, 1) ** alpha)):
        table = penalties(8, alpha, rule, torch.device("cpu"))
        assert table.dtype == torch.float64 and table.shape == (9,)
        assert table.tolist() == pytest.approx([formula(n) for n in range(9)], rel=1e-12)


def test_unknown_rules_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"^rule must be one of \('gnmt', 'power'\), got 'gnm'$"):
        length_penalty(3, 0.6, "gnm")
    step, cache, limit = tables_step(TABLES[:1]), cache_of([0]), torch.tensor([4])
    with pytest.raises(ValueError, match=r"^finish must be one of \('all', 'top_k'\), got 'topk'$"):
        run_beam(step, cache, limit, 2, finish="topk")
    with pytest.raises(ValueError, match=r"^penalty_rule must be one of \('gnmt', 'power'\), got 'pow'$"):
        run_beam(step, cache, limit, 2, penalty_rule="pow")
    with pytest.raises(ValueError, match=r"^3 prefixes for a batch of 1 sentences$"):
        prefix_table([[4], [5], [6]], limit, BOS, EOS)
    for bad in ([4, PAD], [BOS], [5, EOS], [-3]):
        with pytest.raises(ValueError, match=r"^prefix 1 holds a special or negative id \(\[.*\]\); give ids without "
                                             r"<s>, </s>, <pad>$"):
            prefix_table([[4], bad], torch.tensor([4, 4]), BOS, EOS)


def test_every_search_refuses_a_prefix_holding_a_special_id():
    """The prefix check reaches each search with the search's own </s>, not only prefix_table called alone."""
    step, cache, limit = tables_step(TABLES[:1]), cache_of([0]), torch.tensor([4])
    for search in (lambda: run_greedy(step, cache, limit, prefix=[[4, EOS]]),
                   lambda: run_beam(step, cache, limit, 2, prefix=[[4, EOS]]),
                   lambda: run_sample(tables_step(TABLES[:1], shared=False), cache, limit, [0],
                                      prefix=[[4, EOS]])):
        with pytest.raises(ValueError, match=r"^prefix 0 holds a special or negative id"):
            search()


def test_beam_search_defaults_to_the_configs_length_penalty():
    """beam_search called without alpha normalises as DecodeConfig's default (GNMT, alpha 0.6) does: the same
    hypotheses and the same scores, which depend on alpha for every length."""
    step, cache, limit = tables_step(TABLES[:2]), cache_of([0, 1]), torch.tensor([4, 4])
    cfg = DecodeConfig()
    plain = run_beam(step, cache, limit, 3, nbest=2)
    assert plain == run_beam(step, cache, limit, 3, cfg.len_penalty, nbest=2,
                             penalty_rule=cfg.len_penalty_rule)
    assert plain.scores != run_beam(step, cache, limit, 3, cfg.len_penalty + 1.0, nbest=2).scores


# ----------------------------------------------------------------------------- `search` hands on every setting


@pytest.mark.parametrize("min_len, n", [(0, 0), (3, 0), (0, 2), (2, 3)])
def test_search_greedy_and_top_k_one_sampling_are_the_plain_greedy_under_the_rules(min_len, n):
    """`search` passes min_len, no_repeat_ngram, the prefix, the temperature and top_k on: greedy and
    sampling with top_k = 1 both give the plain greedy output; greedy scores it by log p, sampling scores
    the drawn tokens 0 (the filtered distribution keeps one token) and the forced ones under the temperature."""
    step, B, limit = tables_step(RULE_TABLES), len(RULE_TABLES), 5
    cache, limits = cache_of(list(range(B))), torch.full((B,), limit)
    greedy = search(step, cache, limits, DecodeConfig(min_len=min_len, no_repeat_ngram=n), prefix=RULE_PREFIX)
    T = 0.5
    cfg = DecodeConfig(strategy="sample", nbest=2, top_k=1, temperature=T, seed=3, min_len=min_len,
                       no_repeat_ngram=n)
    drawn = search(tables_step(RULE_TABLES, shared=False), cache, limits, cfg, prefix=RULE_PREFIX)
    free = [plain_greedy(t, limit, 0, 0, p or ()) for t, p in zip(RULE_TABLES, RULE_PREFIX)]
    assert (min_len, n) == (0, 0) or free != [plain_greedy(t, limit, min_len, n, p or ())
                                              for t, p in zip(RULE_TABLES, RULE_PREFIX)]  # the rules bite
    for i, (table, p) in enumerate(zip(RULE_TABLES, RULE_PREFIX)):
        toks, score = plain_greedy(table, limit, min_len, n, p or ())
        assert greedy.tokens[i] == [toks] and greedy.scores[i] == pytest.approx([score], abs=1e-5)
        assert drawn.tokens[i] == [toks, toks]
        forced, hist = 0.0, []
        for tok in p or ():  # log softmax(log p / T) of each prefix token
            probs = table[tuple(hist)]
            forced += math.log(probs[tok] ** (1 / T) / sum(q ** (1 / T) for q in probs.values()))
            hist.append(tok)
        assert drawn.scores[i] == pytest.approx([forced, forced], abs=1e-5)


@pytest.mark.parametrize("rule, alpha, min_len, n", [("gnmt", 0.6, 0, 0), ("power", 1.0, 3, 0), ("power", 2.0, 0, 2),
                                                     ("gnmt", 1.0, 2, 3)])
def test_search_wide_beam_is_the_exhaustive_search_under_the_rules(rule, alpha, min_len, n):
    """`search` passes the beam size, nbest, length penalty and its rule, min_len, no_repeat_ngram and the
    prefix on: a beam wider than the tree returns the nbest best paths the rules allow (random tables: REPEAT
    would tie the paths that permute the same tokens)."""
    step, B, limit = tables_step(RULE_TABLES[:4]), 4, 5
    cfg = DecodeConfig(strategy="beam", beam_size=100, nbest=3, len_penalty=alpha, len_penalty_rule=rule,
                       min_len=min_len, no_repeat_ngram=n, beam_finish="all")
    got = search(step, cache_of(list(range(B))), torch.full((B,), limit), cfg, prefix=RULE_PREFIX[:B])
    for i, (table, p) in enumerate(zip(RULE_TABLES[:B], RULE_PREFIX)):
        want = plain_paths(table, limit, alpha, rule, min_len, n, p or ())[:3]
        assert got.tokens[i] == [toks for _, toks in want]
        assert got.scores[i] == pytest.approx([s for s, _ in want], abs=1e-5)


# An ending at hand at the first step (</s>: 0.4) that a beam of 1 under the top_k rule never keeps (it ranks
# second of 2 candidates): it follows 4s to the limit instead.
EARLY_END = {(): {EOS: 0.4, 4: 0.6}, **{(4,) * k: {4: 0.3, EOS: 0.2, 5: 0.25, 6: 0.25} for k in range(1, 6)}}


def test_search_hands_on_the_finish_rule():
    step, cache, limit = tables_step([EARLY_END]), cache_of([0]), torch.tensor([4])
    every = search(step, cache, limit, DecodeConfig(strategy="beam", beam_size=1, len_penalty=0.0, beam_finish="all"))
    assert every == ([[[]]], [[pytest.approx(math.log(0.4))]])
    top = search(step, cache, limit, DecodeConfig(strategy="beam", beam_size=1, len_penalty=0.0, beam_finish="top_k"))
    assert top == ([[[4, 4, 4, 4]]], [[pytest.approx(math.log(0.6 * 0.3**3))]])


def test_search_seeds_each_sentence_by_its_position_when_no_ids_are_given():
    """Without `ids`, sentence i of the batch samples as it does alone with ids [i] (and not as with [i + 1])."""
    step, B = tables_step(TABLES, shared=False), len(TABLES)
    cfg = DecodeConfig(strategy="sample", nbest=3, seed=2, max_len_b=6)
    got = search(step, cache_of(list(range(B))), torch.full((B,), 6), cfg)
    for i in range(B):
        assert search(step, cache_of([i]), torch.tensor([6]), cfg, ids=[i]) == (got.tokens[i : i + 1],
                                                                                got.scores[i : i + 1])
    assert any(search(step, cache_of([i]), torch.tensor([6]), cfg, ids=[i + 1]).tokens[0] != got.tokens[i]
               for i in range(B))


# ----------------------------------------------------------------------------- beam: when a sentence is done


def plain_beam(table, K, alpha, limit, finish, nbest):
    """One sentence, no tensors, the module docstring's rules: each step extends every live hypothesis by
    every token; top_k keeps the endings among the 2K best candidates' top K ranks, all keeps every ending;
    the K best that do not end go on. Done at the limit, or when the best live raw score over the largest
    penalty still reachable does not beat the nbest-th finished, or (top_k) when that score over the current
    length's penalty does not beat the K-th finished. Returns the nbest best finished and the steps taken."""
    lp = lambda n: length_penalty(n, alpha)  # noqa: E731
    alive, finished, steps = [(0.0, [])], [], 0
    for t in range(1, limit + 1):
        steps += 1
        cands = sorted(((s + math.log(p), k, tok) for k, (s, toks) in enumerate(alive)
                        for tok, p in table.get(tuple(toks), {EOS: 1.0}).items()), key=lambda c: (-c[0], c[1], c[2]))
        top = cands[: 2 * K] if finish == "top_k" else cands
        finished += [(s / lp(t), alive[k][1]) for r, (s, k, tok) in enumerate(top)
                     if tok == EOS and (finish == "all" or r < K)]
        alive = [(s, alive[k][1] + [tok]) for s, k, tok in top if tok != EOS][:K]
        if t == limit:
            finished += [(s / lp(t), toks) for s, toks in alive]
            break
        best = sorted((f[0] for f in finished), reverse=True)
        nth = lambda n: best[n - 1] if len(best) >= n else float("-inf")  # noqa: E731
        if alive[0][0] / max(lp(t + 1), lp(limit)) <= nth(nbest):
            break
        if finish == "top_k" and alive[0][0] / lp(t) <= nth(K):
            break
    finished.sort(key=lambda f: -f[0])  # stable: equal scores in the order found
    return finished[:nbest], steps


@pytest.mark.parametrize("finish", ["all", "top_k"])
@pytest.mark.parametrize("K, alpha, nbest", [(1, 0.0, 1), (2, 0.6, 1), (3, 1.0, 2), (3, 0.0, 3), (2, -0.5, 1)])
def test_beam_stops_each_sentence_exactly_when_the_rules_say(finish, K, alpha, nbest):
    """Oracle: the plain beam above, its results and the number of steps it takes. A batch runs as many steps
    as its slowest sentence, and a done sentence computes no more rows. A negative alpha (beam_search takes
    it; the config does not) makes the next length's penalty, not the limit's, the largest still reachable."""
    tables = [random_table(20 + s, depth=6, peaky=True) for s in range(4)]
    limits = [6, 4, 5, 3]
    want = [plain_beam(t, K, alpha, n, finish, nbest) for t, n in zip(tables, limits)]
    rows = []
    step = tables_step(tables)

    def counting(prev, cache):
        rows.append(prev.shape[0])
        return step(prev, cache)

    for i, (table, limit) in enumerate(zip(tables, limits)):  # one at a time: its steps
        rows.clear()
        got = run_beam(counting, cache_of([i]), torch.tensor([limit]), K, alpha, nbest=nbest,
                       finish=finish)
        assert got.tokens[0] == [toks for _, toks in want[i][0]]
        assert got.scores[0] == pytest.approx([s for s, _ in want[i][0]], abs=1e-5)
        assert len(rows) == want[i][1]
    rows.clear()
    got = run_beam(counting, cache_of([0, 1, 2, 3]), torch.tensor(limits), K, alpha, nbest=nbest,
                   finish=finish)
    assert got.tokens == [[toks for _, toks in w[0]] for w in want]
    assert len(rows) == max(w[1] for w in want)
    assert sum(rows) == sum(1 + (w[1] - 1) * K for w in want)  # one row at the first step, then K


def test_finished_keeps_the_best_in_order_found_and_its_bar_is_exact():
    """Finished hypotheses: at most `keep` per sentence, best first, equal scores in the order they came; the
    n-th best score comes back exactly (float64: a bar rounded to float32 could end a sentence too early)."""
    done = Finished(2, 3, torch.device("cpu"))
    for score, toks in ((-0.1, [4]), (-0.3, [5]), (-0.1, [6]), (-0.05, [4, 4]), (-0.3, [6, 6]), (-0.2, [5, 5])):
        done.add(0, score, toks)
    assert done.hyps[0] == [(-0.05, [4, 4]), (-0.1, [4]), (-0.1, [6])] and done.hyps[1] == []
    done.add(1, -0.3, [5])
    done.add(1, -0.3, [6])
    assert done.hyps[1] == [(-0.3, [5]), (-0.3, [6])]
    for n, want in ((1, [-0.05, -0.3]), (2, [-0.1, -0.3]), (3, [-0.1, float("-inf")])):
        bar = done.nth([0, 1], n)
        assert bar.dtype == torch.float64 and bar.tolist() == want  # exactly, not within float32
    assert done.nth([1], 1).tolist() == [-0.3]


def test_row_topk_and_row_max_take_a_strided_view_as_it_is():
    """A non-contiguous (N, V) (a transposed view) gives torch's own topk and max."""
    x = (torch.randn(6000, 3, generator=torch.Generator().manual_seed(4)) * 4).t()  # (3, 6000), strided
    assert not x.is_contiguous()
    values, index = row_topk(x, 4)
    assert torch.equal(values, x.topk(4, dim=1).values) and torch.equal(index, x.topk(4, dim=1).indices)
    value, at = row_max(x)
    assert torch.equal(value, x.max(dim=1).values) and torch.equal(at, x.max(dim=1).indices)
    wide = x.contiguous()  # 6000 = 60 groups of 100 columns: k = 150 best lie in more than 100 groups
    for k in (25, 26, 150):
        values, index = row_topk(wide, k)
        assert torch.equal(values, wide.topk(k, dim=1).values) and torch.equal(index, wide.topk(k, dim=1).indices)


# ----------------------------------------------------------------------------- sampling: the draws themselves


def plain_sample(table, seed, i, j, limit, T, top_k):
    """Sample j of sentence i, no tensors but its generator (seeded by seed * 1_000_003 + i * 1_009 + j, one
    uniform draw per step): the table's probabilities to the power 1/T, the top_k most probable kept and
    renormalised, the token the draw falls on in vocabulary order. Returns (tokens, log-probability)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1_009 + j)
    out, score = [], 0.0
    while len(out) < limit:
        probs = {t: p ** (1 / T) for t, p in table.get(tuple(out), {EOS: 1.0}).items()}
        if top_k:
            probs = dict(sorted(probs.items(), key=lambda tp: -tp[1])[:top_k])
        total = sum(probs.values())
        u, acc = float(torch.rand((), generator=g)), 0.0
        for tok in sorted(probs):
            acc += probs[tok] / total
            if acc >= u:
                break
        score += math.log(probs[tok] / total)
        if tok == EOS:
            break
        out.append(tok)
    return out, score


@pytest.mark.parametrize("T, top_k", [(1.0, 0), (0.7, 2)])
def test_samples_are_the_plain_draws_of_their_seeded_generators(T, top_k):
    """Reproducible: a seed gives the same samples in every version; each (seed, sentence id, sample) its own
    generator. Oracle: the plain sampler above; samples come back in the order they end."""
    ids, n, seed, limit, seen = [7, 0, 3], 4, 11, 5, []
    tables = [random_table(30 + s) for s in range(3)]
    step = tables_step(tables, shared=False)

    def counting(prev, cache):
        seen.append(prev.shape[0])
        return step(prev, cache)

    got = run_sample(counting, cache_of([0, 1, 2]), torch.full((3,), limit), ids, n=n, temperature=T,
                     top_k=top_k, seed=seed)
    ends = []  # the step at which each sample ends: a finished sample computes no more rows
    for s, i in enumerate(ids):
        want = [plain_sample(tables[s], seed, i, j, limit, T, top_k) for j in range(n)]
        order = sorted(range(n), key=lambda j: len(want[j][0]) + (len(want[j][0]) < limit))  # stable: by end
        assert got.tokens[s] == [want[j][0] for j in order]
        assert got.scores[s] == pytest.approx([want[j][1] for j in order], abs=1e-5)
        ends += [len(toks) + (len(toks) < limit) for toks, _ in want]
    assert seen == [sum(e >= t for e in ends) for t in range(1, max(ends) + 1)]
    assert min(ends) < limit  # some samples end early


def test_greedy_drops_finished_rows_once_an_eighth_of_the_batch_has_finished():
    """Sentence r (of 17) ends at step r + 1 (r tokens, then </s>). The rows the step function sees follow the
    documented rule, written out: finished rows are carried until they are at least an eighth of the rows (or
    all of them), then all leave together; the outputs are unchanged."""
    B, seen = 17, []

    def step(prev, cache):
        seen.append(prev.shape[0])
        t, rows = cache["hyp.t"], cache["hyp.row"]
        logits = torch.zeros(prev.shape[0], V, device=prev.device)
        logits[:, 4] = 1.0
        logits[:, EOS] = torch.where(rows <= t, 2.0, 0.0)  # row r prefers </s> from its (r+1)-th step
        return logits, TensorCache({"hyp.t": t + 1, "hyp.row": rows})

    cache = TensorCache({"hyp.t": torch.zeros(B, dtype=torch.long), "hyp.row": torch.arange(B)})
    got = run_greedy(step, cache, torch.full((B,), 20))
    assert got.tokens == [[4] * r for r in range(B)]
    want, rows, done, t = [], B, 0, 0  # rows in the batch, finished rows among them
    while rows:
        want.append(rows)
        t += 1
        done += 1 if t - 1 < B else 0  # sentence t-1 ends at step t
        if done * 8 >= rows or done == rows:
            rows, done = rows - done, 0
    assert seen == want


@pytest.mark.parametrize("finish, alpha", [("all", 0.0), ("top_k", 0.0), ("top_k", 1.0)])
def test_beam_stops_when_the_best_live_hypothesis_only_ties_the_finished_one(finish, alpha):
    """</s> and 4 are equally likely at the root: the live "4" can at best tie the finished "" (alpha = 0), and
    a tie does not beat it, so the sentence is done after one step, with "". With alpha = 1 it could still
    win by growing longer (the exact rule goes on) but top_k's rule compares it at its current length: a tie,
    done too."""
    table = {(): {EOS: 0.5, 4: 0.5}, (4,): {EOS: 0.5, 5: 0.5}}
    want, steps = plain_beam(table, 1, alpha, 4, finish, 1)
    assert steps == 1 and want == [(math.log(0.5), [])]
    calls = []

    def counting(prev, cache):
        calls.append(prev.shape[0])
        return tables_step([table])(prev, cache)

    got = run_beam(counting, cache_of([0]), torch.tensor([4]), 1, alpha, finish=finish)
    assert got == ([[[]]], [[pytest.approx(math.log(0.5))]]) and calls == [1]


def test_beam_stops_before_its_last_step_when_even_the_longest_ending_cannot_win():
    """"all", alpha 1, limit 3. After step 2 the finished "" scores -0.7 and the live "4 5" has -1.0, which at
    best ends at the limit: -1.0 / ((5 + 3) / 6) = -0.75 <= -0.7, so the third step is never taken (after
    step 1, the live "4" could still have reached -0.514: it goes on)."""
    a = math.exp(-0.7)
    d = math.exp(-1.0) / (1 - a)
    table = {(): {EOS: a, 4: 1 - a}, (4,): {EOS: 1 - d, 5: d}}
    want, steps = plain_beam(table, 1, 1.0, 3, "all", 1)
    assert steps == 2 and want == [(pytest.approx(-0.7), [])]
    calls = []

    def counting(prev, cache):
        calls.append(prev.shape[0])
        return tables_step([table])(prev, cache)

    got = run_beam(counting, cache_of([0]), torch.tensor([3]), 1, 1.0, finish="all")
    assert got == ([[[]]], [[pytest.approx(-0.7, abs=1e-6)]]) and calls == [1, 1]


def test_tensor_cache_reorders_hypothesis_entries_and_sentence_entries_only_when_asked():
    """Oracle: indexing by hand. "hyp.*" entries follow the hypothesis rows, the others the sentence rows,
    and stay as they are (the same tensor) when no sentence rows are given."""
    hyp, sent = torch.arange(12).reshape(6, 2), torch.tensor([10, 20, 30])
    cache = TensorCache({"hyp.h": hyp, "enc": sent})
    rows = torch.tensor([5, 0, 0, 3])
    same = cache.reorder(rows)
    assert torch.equal(same["hyp.h"], hyp[[5, 0, 0, 3]]) and same["enc"] is sent
    both = cache.reorder(rows, torch.tensor([2, 0]))
    assert torch.equal(both["hyp.h"], hyp[[5, 0, 0, 3]]) and both["enc"].tolist() == [30, 10]
    picked = select_rows(cache, torch.tensor([1, 1]))  # rows of both kinds alike
    assert picked["hyp.h"].tolist() == [[2, 3], [2, 3]] and picked["enc"].tolist() == [20, 20]


def test_greedy_scores_are_the_float64_sums_of_the_float32_log_probabilities():
    """Oracle: torch's log_softmax of each step's logits (float32), each value taken as a Python float and
    summed in order: exactly, not within float32 (long outputs would drift)."""
    class Always(dict):  # the same next-token probabilities after any history: 4 4 4 ... to the limit
        def get(self, history, default=None):
            return {4: 0.5, 5: 0.28, 6: 0.12, EOS: 0.1}

    table = Always()
    step = tables_step([table])
    got = run_greedy(step, cache_of([0]), torch.tensor([40]))
    toks = got.tokens[0]
    assert toks == [4] * 40
    want, hist = 0.0, []
    for tok in toks:
        row = [-1e9] * V
        for t, p in table.get(tuple(hist), {EOS: 1.0}).items():
            row[t] = math.log(p)
        want += float(torch.log_softmax(torch.tensor(row), -1)[tok])
        hist.append(tok)
    assert got.scores[0] == want


def test_log_probs_write_over_a_steps_own_logits_and_never_over_a_view_of_someone_elses():
    x = torch.randn(4, 50)
    want = torch.log_softmax(x, dim=-1)
    fresh = x.clone()
    got = log_probs(fresh)
    assert got.data_ptr() == fresh.data_ptr() and torch.equal(got, want)  # in place: no (N, V) allocation
    table = torch.randn(3, 4, 50)
    before = table.clone()
    assert torch.equal(log_probs(table[1]), torch.log_softmax(table[1], dim=-1)) and torch.equal(table, before)
    half = x.bfloat16()
    assert torch.equal(log_probs(half), torch.log_softmax(half.float(), dim=-1))


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_a_search_step_allocates_no_vocabulary_sized_tensor_beyond_the_logits(strategy):
    """Oracle: torch.profiler's record of every allocation. Of the (N, V) tensors made during the search, the
    step function's own logits are the only ones (the log-softmax is written over them, the rules edit them in
    place); a prefix being forced costs none either."""
    from torch.profiler import ProfilerActivity, profile

    B, K, Vbig, steps = 3, 2, 4000, 6

    def step(prev, cache):
        t = cache["hyp.t"]
        g = torch.Generator().manual_seed(int(t.sum()))
        logits = torch.randn(prev.shape[0], Vbig, generator=g)
        logits[:, EOS] = -30.0  # nobody ends early: every step runs with every row
        return logits, TensorCache({"hyp.t": t + 1})

    cache = TensorCache({"hyp.t": torch.zeros(B, dtype=torch.long)})
    limit = torch.full((B,), steps)
    prefix = [[7, 8], None, [9]]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if strategy == "greedy":
            run_greedy(step, cache, limit, prefix=prefix, no_repeat_ngram=2)
        else:
            run_beam(step, cache, limit, K, prefix=prefix, no_repeat_ngram=2)
    wide = [e for e in prof.events() if e.self_cpu_memory_usage >= B * Vbig * 4]  # at least B rows of V floats
    makers = [e.name for e in wide if e.name not in ("aten::empty", "aten::empty_strided")]
    assert len(wide) == steps and not makers, [(e.name, e.self_cpu_memory_usage) for e in wide]


@pytest.mark.parametrize("finish", ["top_k", "all"])
def test_beam_search_reads_one_value_back_per_step_however_many_hypotheses_end(finish):
    """On a GPU each value read back to the host (int(t), float(t), bool(t)) waits for the device: the search
    takes each step's endings back in whole tensors, so its single-value reads do not grow with the batch or
    with how many hypotheses end. Oracle: torch.profiler's count of aten::_local_scalar_dense (what every such
    read runs), against the steps the search ran; here about half of all candidates end at every step, and
    what is alive at the limit is set aside too."""
    from torch.profiler import ProfilerActivity, profile

    def reads_and_steps(B):
        steps = []

        def step(prev, cache):
            t = cache["hyp.t"]
            steps.append(prev.shape[0])
            g = torch.Generator().manual_seed(int(t.sum()))  # one read per step of the test's own, subtracted
            logits = torch.randn(prev.shape[0], 40, generator=g)
            logits[:, EOS] = 2.0  # </s> in the top ranks of every row: many endings each step
            return logits, TensorCache({"hyp.t": t + 1})

        cache = TensorCache({"hyp.t": torch.arange(B)})
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            found = run_beam(step, cache, torch.full((B,), 6), 4, alpha=0.0, nbest=4, finish=finish)
        reads = sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")
        assert all(len(h) == 4 for h in found.tokens)  # endings were taken: four finished per sentence
        return reads - len(steps), len(steps)

    one, steps_one = reads_and_steps(1)
    many, steps_many = reads_and_steps(24)
    assert many <= steps_many + 2 and one <= steps_one + 2, (one, steps_one, many, steps_many)


def test_the_repetition_penalty_is_hugging_faces_processor_on_the_logits():
    """penalize_repeats equals transformers' RepetitionPenaltyLogitsProcessor (the oracle) for penalties above
    and below 1, tokens repeated in a history included; it writes over a step's own fp32 logits, never over
    bf16 ones or a view, and leaves everything as it was for 1 or an empty history."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from tformer.decode import penalize_repeats

    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0)) * 3
    logits[2, 3] = 0.0
    history = torch.tensor([[4, 4, 7], [0, 1, 2], [10, 3, 3], [5, 6, 5]])
    for penalty in (1.3, 0.6):
        want = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
        own = logits.clone()
        got = penalize_repeats(own, history, penalty)
        assert torch.equal(got, want) and got.data_ptr() == own.data_ptr()
        assert not torch.equal(want, logits)
    bf16 = logits.bfloat16()
    got = penalize_repeats(bf16, history, 1.3)
    assert got.dtype == torch.float32 and torch.equal(bf16, logits.bfloat16())
    assert torch.equal(got, RepetitionPenaltyLogitsProcessor(1.3)(history, bf16.float()))
    wide = torch.randn(4, 22)
    view, before = wide[:, :11], wide.clone()
    penalize_repeats(view, history, 1.3)
    assert torch.equal(wide, before)
    assert penalize_repeats(logits, history, 1.0) is logits and penalize_repeats(logits, history[:, :0], 1.3) is logits


def _penalised(table, out, penalty):
    """A step's log-probabilities after the repetition penalty, from scratch: tables_step's logits are log p
    (-1e9 where the table has no entry); a token already in `out` has its logit multiplied by the penalty
    (log p <= 0), then the log-softmax."""
    probs = table.get(tuple(out), {EOS: 1.0})
    logits = {t: math.log(probs[t]) if t in probs else -1e9 for t in range(V)}
    for t in set(out):
        logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
    z = math.log(sum(math.exp(v) for v in logits.values()))
    return {t: v - z for t, v in logits.items() if t in probs}


def _penalised_greedy(table, limit, penalty, prefix=()):
    out, score = [], 0.0
    while len(out) < max(limit, len(prefix)):
        logp = _penalised(table, out, penalty)
        tok = prefix[len(out)] if len(out) < len(prefix) else max(logp, key=logp.get)
        score += logp[tok]
        if tok == EOS:
            break
        out.append(tok)
    return out, score


def _penalised_paths(table, limit, penalty, alpha, rule, prefix=()):
    limit, paths = max(limit, len(prefix)), []

    def walk(path, lp):
        for tok, logp in _penalised(table, path, penalty).items():
            if len(path) < len(prefix) and tok != prefix[len(path)]:
                continue
            score, size = lp + logp, len(path) + 1
            if tok == EOS or size == limit:
                paths.append((score / length_penalty(size, alpha, rule), path if tok == EOS else path + [tok]))
            else:
                walk(path + [tok], score)

    walk([], 0.0)
    return sorted(paths, key=lambda h: -h[0])


@pytest.mark.parametrize("penalty", [1.0, 2.0, 0.5])
def test_greedy_beam_and_sampling_under_a_repetition_penalty_are_the_plain_searches_over_penalised_logits(penalty):
    """`search` hands decode.repetition_penalty to every search: greedy (and sampling with top_k = 1) give the
    plain greedy path over the penalised distribution, scored by it; a beam wider than the tree gives its
    exhaustive n-best. The prefix's tokens count as output. On REPEAT (4 4 4 4 4 without it) the penalty bites."""
    step, B, limit = tables_step(RULE_TABLES), len(RULE_TABLES), 5
    cache, limits = cache_of(list(range(B))), torch.full((B,), limit)
    greedy = search(step, cache, limits, DecodeConfig(repetition_penalty=penalty), prefix=RULE_PREFIX)
    drawn = search(tables_step(RULE_TABLES, shared=False), cache, limits,
                   DecodeConfig(strategy="sample", top_k=1, seed=3, repetition_penalty=penalty), prefix=RULE_PREFIX)
    for i, (table, p) in enumerate(zip(RULE_TABLES, RULE_PREFIX)):
        toks, score = _penalised_greedy(table, limit, penalty, p or ())
        assert greedy.tokens[i] == [toks] and greedy.scores[i] == pytest.approx([score], abs=1e-5)
        assert drawn.tokens[i] == [toks]
    assert (_penalised_greedy(REPEAT, limit, penalty)[0] == [4] * 5) == (penalty <= 1.0)
    cfg = DecodeConfig(strategy="beam", beam_size=100, nbest=3, len_penalty=1.0, len_penalty_rule="power",
                       beam_finish="all", repetition_penalty=penalty)
    wide = search(tables_step(RULE_TABLES[:4]), cache_of(list(range(4))), torch.full((4,), limit), cfg,
                  prefix=RULE_PREFIX[:4])
    for i, (table, p) in enumerate(zip(RULE_TABLES[:4], RULE_PREFIX)):
        want = _penalised_paths(table, limit, penalty, 1.0, "power", p or ())[:3]
        assert wide.tokens[i] == [toks for _, toks in want]
        assert wide.scores[i] == pytest.approx([s for s, _ in want], abs=1e-5)


def test_a_repetition_penalty_that_is_not_positive_is_refused_by_name():
    for bad in (0.0, -1.2, 5e-324, 2000.0, float("nan")):  # tiny or huge ones make logits overflow to inf
        with pytest.raises(ValueError, match=r"decode\.repetition_penalty.*must be > 0, from 0.001 to 1000"):
            DecodeConfig(repetition_penalty=bad)


def test_every_search_refuses_a_prefix_holding_its_own_bos():
    """As the </s> check above, with the search's <s>: each search hands prefix_table its own bos."""
    step, cache, limit = tables_step(TABLES[:1]), cache_of([0]), torch.tensor([4])
    for search in (lambda: run_greedy(step, cache, limit, prefix=[[4, BOS]]),
                   lambda: run_beam(step, cache, limit, 2, prefix=[[4, BOS]]),
                   lambda: run_sample(tables_step(TABLES[:1], shared=False), cache, limit, [0],
                                      prefix=[[4, BOS]])):
        with pytest.raises(ValueError, match=r"^prefix 0 holds a special or negative id"):
            search()


def unknown_table(seed, depth=5):
    """A random table in which <unk> (id 3) is often the most probable token."""
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(depth):
        for hist in itertools.product([Vocab.unk, 4, 5], repeat=n):
            p = torch.rand(4, generator=g) ** 2 + torch.tensor([0.01, 0.6, 0.01, 0.01])
            table[hist] = dict(zip([EOS, Vocab.unk, 4, 5], (p / p.sum()).tolist()))
    return table


def _unk_lowered(table, penalty):
    """The table a model would give if <unk>'s logit were `penalty` lower: its probability times e^-penalty,
    every entry renormalised. Written from the definition, without tensors."""
    out = {}
    for hist, probs in table.items():
        weights = {t: p * (math.exp(-penalty) if t == Vocab.unk else 1.0) for t, p in probs.items()}
        z = sum(weights.values())
        out[hist] = {t: w / z for t, w in weights.items() if w > 0}  # e^-1000 is 0: such a path is not taken
    return out


@pytest.mark.parametrize("penalty", [0.0, 1.5, 1000.0])
def test_an_unknown_penalty_decodes_as_the_plain_searches_over_a_table_with_unk_made_rarer(penalty):
    """decode.unk_penalty (fairseq's --unkpen, CTranslate2's disable_unk) in every search: greedy, sampling with
    top_k = 1 and a beam wider than the tree give the plain searches' paths over the table with <unk>'s
    probability scaled by e^-penalty and renormalised, scored by it; penalty 1000 never writes <unk>."""
    tables = [unknown_table(s) for s in range(4)]
    prefix = [[Vocab.unk] if penalty < 100 else [5], None, [4], []]  # a forced <unk> is scored penalised too
    B, limit = len(tables), 4
    cache, limits = cache_of(list(range(B))), torch.full((B,), limit)
    greedy = search(tables_step(tables), cache, limits, DecodeConfig(unk_penalty=penalty), prefix=prefix)
    drawn = search(tables_step(tables, shared=False), cache, limits,
                   DecodeConfig(strategy="sample", top_k=1, seed=3, unk_penalty=penalty), prefix=prefix)
    cfg = DecodeConfig(strategy="beam", beam_size=100, nbest=3, len_penalty=1.0, len_penalty_rule="power",
                       beam_finish="all", unk_penalty=penalty)
    wide = search(tables_step(tables), cache, limits, cfg, prefix=prefix)
    plain = [plain_greedy(t, limit, prefix=p or ())[0] for t, p in zip(tables, prefix)]
    assert sum(toks.count(Vocab.unk) for toks in plain) >= 4  # without the rule, <unk> is written
    for i, (table, p) in enumerate(zip(tables, prefix)):
        lowered = _unk_lowered(table, penalty)
        toks, score = plain_greedy(lowered, limit, prefix=p or ())
        assert greedy.tokens[i] == [toks] and greedy.scores[i] == pytest.approx([score], abs=1e-4)
        assert drawn.tokens[i] == [toks]
        want = plain_paths(lowered, limit, 1.0, "power", prefix=p or ())[:3]
        assert wide.tokens[i] == [t for _, t in want]
        assert wide.scores[i] == pytest.approx([s for s, _ in want], abs=1e-4)
        if penalty == 1000.0:
            assert all(Vocab.unk not in h for h in greedy.tokens[i] + wide.tokens[i])


def test_the_unknown_penalty_writes_over_a_steps_own_logits_and_never_over_anyone_elses():
    """UnknownPenalty.logits lowers the <unk> column by the penalty: in place in a step's own fp32 logits, into
    a new fp32 tensor for bf16 logits or a view of someone else's, which stay as they were."""
    from tformer.decode.rules import UnknownPenalty

    rule = UnknownPenalty(2.0)

    def lowered(x):
        want = x.float().clone()
        want[:, Vocab.unk] -= 2.0
        return want

    own = torch.randn(3, 9)
    want = lowered(own)
    got = rule.logits(own, None)
    assert got is own and torch.equal(got, want)
    bf16 = torch.randn(3, 9).bfloat16()
    kept = bf16.clone()
    got = rule.logits(bf16, None)
    assert got.dtype == torch.float32 and torch.equal(got, lowered(kept)) and torch.equal(bf16, kept)
    wide = torch.randn(3, 18)
    kept = wide.clone()
    got = rule.logits(wide[:, :9], None)
    assert torch.equal(got, lowered(kept[:, :9])) and torch.equal(wide, kept)
