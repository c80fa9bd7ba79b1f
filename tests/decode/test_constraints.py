"""Lexically constrained beam search against oracles: on toy tables, a beam wider than the tree is the
exhaustive search over the paths that hold every phrase; narrow beams still hold every phrase and never score
above it; a limit too short for the phrases is raised to the shortest that holds them; sentences without
phrases decode as plain beam search whatever their batch holds; the automaton's distances are a plain
breadth-first search's."""

import itertools

import pytest
import torch

from helpers.search import (BOS, EOS, RULE_PREFIX, cache_of, constrained_paths, holds, random_table, run_beam,
                            shortest, tables_step)
from tformer.config import DecodeConfig
from tformer.decode import search
from tformer.decode.constraints import Constraints, _automaton, _distances, choose


def deep_table(seed, depth=7):
    return random_table(seed, depth=depth, peaky=True)


TABLES = [deep_table(20 + s) for s in range(5)]
PHRASES = [[[5, 6]], [[6], [4, 4]], [[6, 6, 5]], [], [[5, 4], [4, 6]]]  # sentence 3: none


@pytest.mark.parametrize("finish", ["all", "top_k"])
@pytest.mark.parametrize("rule, alpha, limit", [("gnmt", 0.6, 5), ("power", 1.0, 4), ("gnmt", 0.0, 3)])
def test_a_wide_constrained_beam_is_the_exhaustive_search_over_paths_holding_every_phrase(finish, rule, alpha, limit):
    """Limit 3 is shorter than sentence 1's and 4's phrases need (3 and 3 tokens fit; [6,6,5] needs 3; the
    prefixes push past it): the limit is raised as the oracle raises it."""
    B = len(TABLES)
    prefix = [[4], None, [5, 5], [], [5]]
    cfg = DecodeConfig(strategy="beam", beam_size=400, nbest=3, len_penalty=alpha, len_penalty_rule=rule,
                       beam_finish=finish)
    got = search(tables_step(TABLES), cache_of(list(range(B))), torch.full((B,), limit), cfg, prefix=prefix,
                 phrases={"constraints": PHRASES})
    for i, (table, phrases, p) in enumerate(zip(TABLES, PHRASES, prefix)):
        want = constrained_paths(table, limit, alpha, rule, phrases, p or ())[:3]
        assert want and got.tokens[i] == [toks for _, toks in want]
        assert got.scores[i] == pytest.approx([s for s, _ in want], abs=1e-5)


@pytest.mark.parametrize("K", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_narrow_constrained_beams_hold_every_phrase_and_never_beat_the_exhaustive_search(K, seed):
    g = torch.Generator().manual_seed(seed)
    B, limit = 4, 6
    tables = [deep_table(100 * seed + i) for i in range(B)]
    phrases = [[torch.randint(4, 7, (int(torch.randint(1, 3, (1,), generator=g)),), generator=g).tolist()
                for _ in range(int(torch.randint(0, 3, (1,), generator=g)))] for _ in range(B)]
    got = run_beam(tables_step(tables), cache_of(list(range(B))), torch.full((B,), limit), K,
                   alpha=0.6, nbest=1, constraints=phrases)
    for i in range(B):
        best = constrained_paths(tables[i], limit, 0.6, "gnmt", phrases[i])
        assert got.tokens[i], f"sentence {i} ({phrases[i]}) has no output"
        toks = got.tokens[i][0]
        assert all(holds(toks, p) for p in phrases[i]), (toks, phrases[i])
        assert len(toks) <= max(limit, shortest(phrases[i]))
        assert got.scores[i][0] <= best[0][0] + 1e-6


def test_a_limit_too_short_for_the_phrases_is_raised_to_the_shortest_output_that_holds_them():
    """Limit 1, phrases of 2 + 3 tokens that overlap by one (4 5 | 5 6 6): the output is the 4 tokens that hold
    both, whatever the model prefers."""
    table = deep_table(7)
    got = run_beam(tables_step([table]), cache_of([0]), torch.tensor([1]), 4, constraints=[[[4, 5], [5, 6, 6]]])
    assert got.tokens[0][0] == [4, 5, 6, 6]


@pytest.mark.parametrize("finish", ["all", "top_k"])
def test_sentences_without_phrases_decode_as_plain_beam_search_whatever_their_batch_holds(finish):
    B, limit = len(TABLES), 6
    cfg = DecodeConfig(strategy="beam", beam_size=3, nbest=2, beam_finish=finish)
    plain = search(tables_step(TABLES), cache_of(list(range(B))), torch.full((B,), limit), cfg, prefix=RULE_PREFIX)
    mixed = search(tables_step(TABLES), cache_of(list(range(B))), torch.full((B,), limit), cfg, prefix=RULE_PREFIX,
                   phrases={"constraints": PHRASES})
    for i in range(B):
        if not PHRASES[i]:
            assert mixed.tokens[i] == plain.tokens[i] and mixed.scores[i] == plain.scores[i]
        else:
            assert mixed.tokens[i] != plain.tokens[i] or all(holds(plain.tokens[i][0], p) for p in PHRASES[i])
    alone = [search(tables_step([TABLES[i]]), cache_of([0]), torch.full((1,), limit), cfg, prefix=[RULE_PREFIX[i]],
                    phrases={"constraints": [PHRASES[i]]}) for i in range(B)]
    assert [a.tokens[0] for a in alone] == mixed.tokens  # nothing depends on the batch


def bfs_distances(phrases):
    """{(tuple of the output's last tokens that matter, completed set)}: by brute force, the fewest tokens to
    append to each short output over tokens 4..6 so that it holds every phrase."""
    out = {}
    for n in range(5):
        for hist in itertools.product([4, 5, 6], repeat=n):
            hist = list(hist)
            for extra in range(8):
                if any(all(holds(hist + list(tail), p) for p in phrases)
                       for tail in itertools.product([4, 5, 6, 9], repeat=extra)):
                    out[tuple(hist)] = extra
                    break
    return out


@pytest.mark.parametrize("phrases", [[[4, 5], [5, 6]], [[4, 4, 4]], [[5], [4, 5, 6], [6, 6]], [[4, 5, 4], [5, 4, 5]]])
def test_the_automatons_distances_are_a_brute_force_search_over_every_continuation(phrases):
    alphabet = sorted({t for p in phrases for t in p})
    delta, out = _automaton(phrases, alphabet)
    dist = _distances(torch.tensor(delta), torch.tensor(out), len(phrases))
    col = {t: a for a, t in enumerate(alphabet)}
    for hist, want in bfs_distances(phrases).items():
        node, met = 0, 0
        for tok in hist:
            node = delta[node][col.get(tok, len(alphabet))]
            met |= out[node]
        assert dist[node, met] == want, (hist, phrases)


def test_choose_takes_the_banks_in_turn_best_first_and_is_score_order_with_one_bank():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")]])
    assert choose(scores, torch.zeros(1, 6, dtype=torch.long), 4).tolist() == [[0, 1, 2, 3]]
    banks = torch.tensor([[0, 0, 1, 0, 2, 2]])  # bank 2: -5 (and a -inf), bank 1: -3, bank 0: -1 -2 -4
    assert choose(scores, banks, 5).tolist() == [[4, 2, 0, 1, 3]]


def test_bad_constraints_are_refused_naming_the_sentence():
    step, cache = tables_step([TABLES[0]]), cache_of([0])
    for bad, what in (([[[]]], "empty"), ([[[4, EOS]]], "special"), ([[[4]] * 9], "at most 8")):
        with pytest.raises(ValueError, match=what):
            run_beam(step, cache, torch.tensor([4]), 2, constraints=bad)
    with pytest.raises(ValueError, match="beam search"):
        search(step, cache, torch.tensor([4]), DecodeConfig(), phrases={"constraints": [[[4]]]})
    with pytest.raises(ValueError, match="2 constraint lists"):
        Constraints.build([[[4]], None], torch.full((1, 0), -1), torch.tensor([4]), EOS)


# ----------------------------------------------------------------------------- through the Translator

from pathlib import Path  # noqa: E402

import tformer  # noqa: E402
from tformer.errors import ConfigError, DataError  # noqa: E402

V1 = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_v1"
LINES = (V1 / "input.en").read_text(encoding="utf-8").splitlines()[:6]
WANTED = [["CAT"], ["BIG WOMAN", "MAN"], None, ["RED DOG"], ["EATS", "SMALL", "A"], []]


def _ids_hold(translator, hyp, phrase):
    return holds(translator.encode(hyp.text, "target"), translator.encode(phrase, "target"))


@pytest.fixture(scope="module")
def v1():
    return tformer.load(V1 / "checkpoint", device="cpu")


def test_every_hypothesis_holds_its_phrases_with_prefixes_and_scores_as_forced_decoding(v1):
    """The oracles: each of the n-best holds every phrase (as pieces) and begins with its prefix; with no length
    penalty its score is the teacher-forced log-probability that `score` computes in one forward pass (without the
closing </s> for an output cut at the length limit, 1.5 x source + 10: the checkpoint's); and each
    sentence decodes alone as in the batch."""
    prefix = [None, "MAN", None, "", "SMALL", None]
    options = dict(beam=4, nbest=3, len_penalty=0.0)
    got = v1.translate(LINES, constraints=WANTED, prefix=prefix, **options)
    free = v1.translate(LINES, prefix=prefix, **options)
    assert any(not all(_ids_hold(v1, f.hypotheses[0], p) for p in w or ()) for f, w in zip(free, WANTED))  # it bites
    for i, (t, phrases) in enumerate(zip(got, WANTED)):
        assert len(t.hypotheses) == 3
        forced = v1.score([LINES[i]] * 3, [h.text for h in t.hypotheses])
        for h, s in zip(t.hypotheses, forced):
            assert all(_ids_hold(v1, h, p) for p in phrases or ()), (h.text, phrases)
            assert h.text.startswith(prefix[i] or "")
            cut = len(h.tokens) >= int(1.5 * len(v1.encode(LINES[i])) + 10)  # at the limit: no </s> was scored
            assert h.score == pytest.approx(s.log_prob - (s.token_log_probs[-1] if cut else 0.0), abs=1e-4)
        if not phrases:
            assert [h.text for h in t.hypotheses] == [h.text for h in free[i].hypotheses]
        alone = v1.translate([LINES[i]], constraints=[phrases], prefix=[prefix[i]], **options)[0]
        assert [h.text for h in alone.hypotheses] == [h.text for h in t.hypotheses]


def test_an_ensemble_of_one_model_twice_decodes_constraints_as_the_model():
    twice = tformer.load([V1 / "checkpoint", V1 / "checkpoint"], device="cpu")
    one = tformer.load(V1 / "checkpoint", device="cpu")
    a = twice.translate(LINES, constraints=WANTED, beam=3, nbest=2)
    b = one.translate(LINES, constraints=WANTED, beam=3, nbest=2)
    assert [[h.text for h in t.hypotheses] for t in a] == [[h.text for h in t.hypotheses] for t in b]


def test_constraints_the_translator_cannot_take_are_refused_naming_the_entry(v1):
    cases = [(dict(constraints=[["CAT"]]), DataError, "1 entries for 2 sources"),
             (dict(constraints=["CAT", None]), DataError, r"constraints\[0\] must be a list.*wrap it"),
             (dict(constraints=[["CAT", " "], None]), DataError, r"constraints\[0\]\[1\] must be a non-empty"),
             (dict(constraints=[["CAT", "ß€"], None]), DataError, r"constraints\[0\]\[1\] \('ß€'\) holds .*<unk>"),
             (dict(constraints=[["A"] * 9, None]), DataError, "at most 8"),
             (dict(constraints=[["CAT"], None], beam=1), ConfigError, "beam search")]
    for options, error, match in cases:
        with pytest.raises(error, match=match):
            v1.translate(LINES[:2], **{"beam": 3, **options})


def test_a_constraint_the_other_rules_rule_out_gives_an_empty_output_scored_minus_infinity(v1, caplog):
    """no_repeat_ngram=1 forbids a second 'M' of 'MAN MAN': no output can hold it. The sentence still gets its
    one (empty) hypothesis, and the log says why; the others decode as usual."""
    got = v1.translate(LINES[:2], beam=3, constraints=[["MAN MAN"], None], no_repeat_ngram=1)
    assert got[0].text == "" and got[0].score == float("-inf") and "no output satisfies" in caplog.text
    assert got[1].text == v1.translate(LINES[1:2], beam=3, no_repeat_ngram=1)[0].text


def test_progress_is_the_tokens_of_the_shortest_completion_already_made():
    """The bank of a candidate token: D (the shortest output holding every phrase, here 3 for 5 6 7) minus the
    tokens that output still needs after it; the higher, the nearer done. A sentence without phrases: 0."""
    prefix = torch.tensor([[-1], [5], [-1]])  # the second sentence's prefix has begun the phrase already
    rule, _ = Constraints.build([[[5, 6, 7]], [[5, 6, 7]], None], prefix, torch.tensor([6, 6, 6]), EOS,
                                (0, BOS, EOS))
    progress = rule.progress(torch.tensor([[5, 6, 9]] * 3))
    assert progress.tolist() == [[1, 0, 0],   # 5 begins the phrase; 6 or 9 leave it all still to do
                                 [1, 2, 0],   # after 5: 5 again begins it anew, 6 goes on with it
                                 [0, 0, 0]]
