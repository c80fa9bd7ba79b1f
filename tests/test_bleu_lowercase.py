"""Lowercased tokenized BLEU (multi-bleu.perl -lc, as Multi30k papers report it) beside the cased one: against
BLEU from its definition on lowercased Moses tokens, on real text with case errors that move the score, a
hand-worked line whose only error is a non-ASCII capital, and `tformer evaluate` printing and reporting it."""

import gzip
import json
import re
from pathlib import Path

import pytest

from helpers.oracles import bleu_by_definition
from tformer.cli import main
from tformer.metrics import moses_tokenize, translation_scores

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1"


def _lower(lines):
    return [line.lower() for line in lines]


def test_lowercased_tokenized_bleu_equals_bleu_by_definition(shared_data):
    with gzip.open(shared_data / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f][:200]
    damage = (lambda r: r,  # right
              str.lower,  # every German noun in the wrong case
              lambda r: " ".join(w.capitalize() for w in r.split()),  # every lower-case word capitalised
              lambda r: " ".join(r.split()[:-2] + ["Hund", "."]))  # a real error, casing right
    hyps = [damage[i % 4](r) for i, r in enumerate(refs)]
    s = translation_scores(hyps, refs, "de")
    tok_hyps, tok_refs = moses_tokenize(hyps, "de"), moses_tokenize(refs, "de")
    oracle_lc = bleu_by_definition(_lower(tok_hyps), _lower(tok_refs))
    oracle_cased = bleu_by_definition(tok_hyps, tok_refs)
    assert s.tok_bleu_lc == pytest.approx(oracle_lc, abs=1e-6)
    assert s.tok_bleu == pytest.approx(oracle_cased, abs=1e-6)  # the cased figure is still the cased one
    assert oracle_lc - oracle_cased > 20  # casing moves this score: skipping the lowercasing would fail above
    assert s.as_dict()["tok_bleu_lc"] == s.tok_bleu_lc and s.tok_bleu_compound is None
    # on text without capitals the two agree; lowercasing only merges tokens, so it never scores lower
    low = translation_scores(_lower(hyps), _lower(refs), "de")
    assert low.tok_bleu_lc == pytest.approx(low.tok_bleu, abs=1e-9)
    assert s.tok_bleu_lc >= s.tok_bleu


def test_lowercasing_is_unicode_and_the_signature_says_so():
    # one error: the capital Ü. multi-bleu.perl -lc reads bytes and would leave it; str.lower() does not
    hyps, refs = ["Über den Fluss fährt ein Boot ."], ["über den Fluss fährt ein Boot ."]
    s = translation_scores(hyps, refs, "de", compound_split=True)
    assert s.tok_bleu == pytest.approx(100 * (6 / 7 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25, abs=1e-9)  # by hand
    assert s.tok_bleu_lc == pytest.approx(100.0, abs=1e-9)
    assert "|case:lc|" in s.tok_bleu_lc_signature and "|tok:none|" in s.tok_bleu_lc_signature
    assert s.tok_bleu_lc_signature.endswith("|moses:de")
    assert "|case:mixed|" in s.tok_bleu_signature and "|case:mixed|" in s.tok_bleu_compound_signature
    assert s.tok_bleu_lc_signature.replace("case:lc", "case:mixed") == s.tok_bleu_signature  # only the case differs
    assert list(s.as_dict()) == ["bleu", "chrf", "tok_bleu", "tok_bleu_lc", "tok_bleu_compound"]


def test_evaluate_prints_and_reports_lowercased_bleu(tmp_path, capsys):
    """The committed tiny en -> "de" model writes upper case; half the references here are lower case."""
    sources = (V1 / "input.en").read_text(encoding="utf-8").splitlines()[:20]
    refs = [s.upper() if i % 2 else s for i, s in enumerate(sources)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.en").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (data / "test.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    out = tmp_path / "hyps.de"
    args = ["evaluate", "--checkpoint", V1 / "checkpoint", "--split", "test", f"data.dir={data}"]

    assert main([str(a) for a in [*args, "--output", out]]) == 0
    printed = capsys.readouterr().out
    hyps = out.read_text(encoding="utf-8").splitlines()
    tok_hyps, tok_refs = moses_tokenize(hyps, "de"), moses_tokenize(refs, "de")
    oracle_lc = bleu_by_definition(_lower(tok_hyps), _lower(tok_refs))
    oracle_cased = bleu_by_definition(tok_hyps, tok_refs)
    assert oracle_lc - oracle_cased > 10  # the case errors do matter here

    lines = [line for line in printed.splitlines() if line.strip().startswith("tokenized BLEU")]
    assert len(lines) == 3  # cased, lowercased, compounds split (the target is "de")
    (lc_line,) = [line for line in lines if "|case:lc|" in line]
    assert "lowercased" in lc_line and lc_line.rstrip().endswith("(lowercased: the figure Multi30k papers report)")
    assert float(re.search(r"tokenized BLEU\s+([\d.]+)", lc_line).group(1)) == pytest.approx(oracle_lc, abs=0.005)
    assert "sacreBLEU" in printed and lines[0].split()[2] == f"{oracle_cased:.2f}"

    assert main([str(a) for a in [*args, "--json"]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tok_bleu_lc"] == pytest.approx(oracle_lc, abs=1e-6)
    assert report["tok_bleu"] == pytest.approx(oracle_cased, abs=1e-6)
    assert "|case:lc|" in report["signatures"]["tok_bleu_lc"] and report["signatures"]["tok_bleu_lc"].endswith(
        "|moses:de")
