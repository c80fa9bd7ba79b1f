"""Phrases no output may hold (negative constraints, decode.rules.Avoid) against oracles: on toy tables, greedy
and top-1 sampling are the plain greedy walk that never completes a phrase, a beam wider than the tree is the
exhaustive search over the paths that hold none (and, with constraints, hold every wanted phrase); a sentence
without phrases decodes as without the rule whatever its batch holds. Through the library, the command line,
/v1/translate and a glossary's '!' terms: no output's pieces hold a phrase's, and each answer is the library's."""

import pytest
import torch

import tformer
from helpers.search import (cache_of, completes, constrained_paths, holds, plain_greedy, plain_paths, random_table,
                            tables_step)
from tformer.config import DecodeConfig
from tformer.decode import search
from tformer.errors import DataError


TABLES = [random_table(40 + s, depth=6, peaky=True) for s in range(5)]
AVOID = [[[4]], [[5, 6], [6, 6, 4]], [], [[4, 4], [5]], [[6, 5, 4], [5]]]  # sentence 2: none
PREFIX = [None, [5], [4, 4], [4], []]  # sentence 3's prefix ends in the head of [4, 4]: its next token may not be 4


def test_greedy_and_top_one_sampling_are_the_plain_greedy_walk_that_completes_no_phrase():
    B, limit = len(TABLES), 5
    cache, limits = cache_of(list(range(B))), torch.full((B,), limit)
    greedy = search(tables_step(TABLES), cache, limits, DecodeConfig(), prefix=PREFIX, phrases={"avoid": AVOID})
    drawn = search(tables_step(TABLES, shared=False), cache, limits, DecodeConfig(strategy="sample", top_k=1),
                   prefix=PREFIX, phrases={"avoid": AVOID})
    free = search(tables_step(TABLES), cache, limits, DecodeConfig(), prefix=PREFIX)
    assert sum(any(holds(t[0], p) for p in a) for t, a in zip(free.tokens, AVOID)) >= 3  # the rule bites
    for i, (table, phrases, p) in enumerate(zip(TABLES, AVOID, PREFIX)):
        toks, score = plain_greedy(table, limit, prefix=p or (), avoid=phrases)
        assert greedy.tokens[i] == [toks] and greedy.scores[i] == pytest.approx([score], abs=1e-5)
        assert drawn.tokens[i] == [toks]
        assert not any(holds(toks[len(p or ()):], ph) for ph in phrases)
        if not phrases:
            assert greedy.tokens[i] == free.tokens[i] and greedy.scores[i] == free.scores[i]


@pytest.mark.parametrize("finish", ["all", "top_k"])
@pytest.mark.parametrize("rule, alpha", [("gnmt", 0.6), ("power", 1.0)])
def test_a_wide_beam_is_the_exhaustive_search_over_paths_that_hold_no_phrase(finish, rule, alpha):
    """finish 'all' keeps every ending that may win: the n-best is the exhaustive one. 'top_k' keeps an ending
    only among a step's best K: with K above every path, the same."""
    B, limit = len(TABLES), 5
    cfg = DecodeConfig(strategy="beam", beam_size=400, nbest=3, len_penalty=alpha, len_penalty_rule=rule,
                       beam_finish=finish)
    got = search(tables_step(TABLES), cache_of(list(range(B))), torch.full((B,), limit), cfg, prefix=PREFIX,
                 phrases={"avoid": AVOID})
    for i, (table, phrases, p) in enumerate(zip(TABLES, AVOID, PREFIX)):
        want = plain_paths(table, limit, alpha, rule, prefix=p or (), avoid=phrases)[:3]
        assert got.tokens[i] == [t for _, t in want]
        assert got.scores[i] == pytest.approx([s for s, _ in want], abs=1e-5)
    alone = [search(tables_step([TABLES[i]]), cache_of([0]), torch.full((1,), limit), cfg, prefix=[PREFIX[i]],
                    phrases={"avoid": [AVOID[i]]}) for i in range(B)]
    assert [a.tokens[0] for a in alone] == got.tokens  # nothing depends on the batch


def test_with_constraints_a_wide_beam_holds_every_wanted_phrase_and_no_avoided_one():
    """Both phrase inputs at once: the exhaustive search over the paths that hold every wanted phrase, filtered
    to those in which no token completes an avoided one."""
    wanted = [[[5, 6]], [[6], [4, 4]], [], [[5, 4]], [[4, 6]]]
    avoid = [[[6, 5]], [[5, 5]], [[4]], [[6, 6]], [[5], [6, 4, 4]]]
    B, limit = len(TABLES), 5
    cfg = DecodeConfig(strategy="beam", beam_size=400, nbest=3, len_penalty=0.6, beam_finish="all")
    got = search(tables_step(TABLES), cache_of(list(range(B))), torch.full((B,), limit), cfg,
                 phrases={"constraints": wanted, "avoid": avoid})
    for i, table in enumerate(TABLES):
        paths = [(s, t) for s, t in constrained_paths(table, limit, 0.6, "gnmt", wanted[i])
                 if not any(completes(t[:j], t[j], avoid[i]) for j in range(len(t)))]
        assert got.tokens[i] == [t for _, t in paths[:3]]
        assert got.scores[i] == pytest.approx([s for s, _ in paths[:3]], abs=1e-5)


def test_avoided_phrases_with_special_ids_are_refused():
    for bad in ([[2]], [[4, 1]], [[]], [[-3]]):
        with pytest.raises(ValueError, match="avoided phrase is empty or holds a negative or special id"):
            search(tables_step(TABLES[:1]), cache_of([0]), torch.full((1,), 4), DecodeConfig(),
                   phrases={"avoid": [bad]})


# ------------------------------------------------------------------------------------------ entry points

from helpers.serve import CHECKPOINT, LINES, call, live  # noqa: E402

SOURCES = LINES[:6]


@pytest.fixture(scope="module")
def v1():
    return tformer.load(CHECKPOINT, device="cpu")


def _words(v1):
    """Per source, one word of its free greedy output to avoid (its second word, or its only one)."""
    free = v1.translate(SOURCES)
    return [[t.text.split()[min(1, len(t.text.split()) - 1)]] if t.text else None for t in free]


@pytest.mark.parametrize("options", [{}, {"beam": 4, "nbest": 2}, {"strategy": "sample", "seed": 3}])
def test_no_output_of_any_search_holds_an_avoided_phrases_pieces(v1, options):
    avoid = _words(v1)
    got = v1.translate(SOURCES, avoid=avoid, **options)
    free = v1.translate(SOURCES, **options)
    bitten = 0
    for i, (t, f, phrases) in enumerate(zip(got, free, avoid)):
        for phrase in phrases or ():
            ids = v1.encode(phrase, "target")
            assert not any(holds(v1.encode(h.text, "target"), ids) for h in t.hypotheses), (h.text, phrase)
            bitten += any(holds(v1.encode(h.text, "target"), ids) for h in f.hypotheses)
        if options.get("strategy") != "sample":  # sampling seeds each sentence by its index in the input
            alone = v1.translate([SOURCES[i]], avoid=[phrases], **options)[0]
            assert [h.text for h in alone.hypotheses] == [h.text for h in t.hypotheses]
    assert bitten >= 3


def test_bad_avoided_phrases_are_refused_naming_the_entry(v1):
    cases = [({"avoid": [["CAT"]]}, "1 entries for 2 sources"),
             ({"avoid": [["CAT", " "], None]}, r"avoid\[0\]\[1\] must be a non-empty"),
             ({"avoid": [["A"] * 65, None]}, "at most 64")]
    for options, match in cases:
        with pytest.raises(DataError, match=match):
            v1.translate(SOURCES[:2], **options)


def test_the_server_and_a_glossarys_marked_terms_avoid_as_the_library(v1, tmp_path):
    from tformer.documents import Glossary

    avoid = _words(v1)
    with live(v1) as (_, url):
        status, out, _ = call(url, "/v1/translate", {"src": SOURCES, "avoid": avoid, "beam": 3})
    assert status == 200, out
    assert [t["text"] for t in out["translations"]] == [t.text for t in v1.translate(SOURCES, avoid=avoid, beam=3)]
    first = SOURCES[0].split()[0]
    glossary = Glossary.parse(f"{first}\t!{avoid[0][0]}\n")
    assert glossary.phrases(SOURCES[0]) == {"avoid": avoid[0]}
    with live(v1, glossary=glossary) as (_, url):
        status, out, _ = call(url, "/v1/translate", {"src": SOURCES})
    assert status == 200, out
    want = v1.translate(SOURCES, avoid=[glossary.phrases(s).get("avoid") for s in SOURCES])
    assert [t["text"] for t in out["translations"]] == [t.text for t in want]
    assert out["translations"][0]["text"] != v1.translate(SOURCES[:1])[0].text  # the glossary's term bit


def test_a_glossary_gives_a_term_one_wanted_rendering_and_any_number_to_avoid():
    from tformer.documents import Glossary

    g = Glossary.parse("bank\tUfer\nbank\t!Bank\nbank\t! Banken\n# a comment\nriver bank\tFlussufer\n")
    assert g.phrases("The bank of a river bank.") == {"constraints": ["Ufer", "Flussufer"], "avoid": ["Bank", "Banken"]}
    with pytest.raises(DataError, match="line 2: 'bank' is already in line 1 with another target term"):
        Glossary.parse("bank\tUfer\nbank\tBank\n")
    with pytest.raises(DataError, match="line 1: the target term is empty"):
        Glossary.parse("bank\t!\n")


def test_the_command_line_reads_avoided_phrases_from_a_file(v1, tmp_path):
    from helpers.cli import tformer as cli

    avoid = _words(v1)
    src, phrases = tmp_path / "in.txt", tmp_path / "avoid.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    phrases.write_text("\n".join("\t".join(a or ()) for a in avoid) + "\n", encoding="utf-8")
    r = cli("translate", "--checkpoint", CHECKPOINT, "--input", src, "--avoid", phrases)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [t.text for t in v1.translate(SOURCES, avoid=avoid)]
