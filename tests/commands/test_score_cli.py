"""Scoring files and streams (`Translator.score_file`, `score_iterable`, `tformer score`) against the list
form `Translator.score` (itself held to the cached decoder token by token in test_api): the same numbers
whatever the chunking, gzip or standard input, in both output formats; every bad line named with its file
and line before anything is written."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tformer
from helpers.oracles import REL, assert_same_scores
from tformer.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1"
LINES = (V1 / "input.en").read_text(encoding="utf-8").splitlines()
TARGETS = ["DOG", "", "A BIG RED DOG", "MAN MAN", "CAT RUNS", "SMALL", "THE WOMAN EATS", "RED"]
PAIRS = list(zip(LINES[: len(TARGETS)], TARGETS))


@pytest.fixture(scope="module")
def translator():
    return tformer.load(V1 / "checkpoint", device="cpu")


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "tformer", "score", "--checkpoint", V1 / "checkpoint",
                           *map(str, args)], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=300)


def _tsv(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    return path


def test_streams_give_what_the_list_form_gives(translator):
    """Whatever the chunking and batching: the same tokens and alignments, log-probabilities within the
    promised float32 rounding (conftest.assert_same_scores; the shapes of the padded batches change)."""
    want = translator.score([s for s, _ in PAIRS], [t for _, t in PAIRS], alignment=True)
    for chunk_size in (1, 3, 5, len(PAIRS)):
        assert_same_scores(list(translator.score_iterable(iter(PAIRS), chunk_size=chunk_size, alignment=True)), want)
    for batch in (dict(batch_size=1), dict(batch_size=3), dict(batch_tokens=20), dict(batch_size=20,
                                                                                        batch_type="tokens")):
        assert_same_scores(translator.score([s for s, _ in PAIRS], [t for _, t in PAIRS], alignment=True, **batch),
                           want)
    assert want[1].tokens == ["</s>"] and len(want[1].token_log_probs) == 1  # an empty target: </s> alone
    for s in want:
        assert len(s.token_log_probs) == len(s.tokens) and s.log_prob == pytest.approx(sum(s.token_log_probs))
        assert [j for _, j in s.alignment] == list(range(len(s.tokens) - 1))


def test_score_file_writes_tsv_and_jsonl(translator, tmp_path):
    want = translator.score([s for s, _ in PAIRS], [t for _, t in PAIRS], alignment=True)
    src = tmp_path / "pairs.tsv.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("".join(f"{s}\t{t}\n" for s, t in PAIRS))
    assert translator.score_file(src, tmp_path / "out.tsv", chunk_size=3) == len(PAIRS)
    rows = [line.split("\t") for line in (tmp_path / "out.tsv").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(PAIRS) and all(len(r) == 2 for r in rows)
    for (total, per_token), s in zip(rows, want):  # 4 decimals of values from chunks of 3 (see above)
        assert float(total) == pytest.approx(s.log_prob, abs=5e-5 + REL * (abs(s.log_prob) + len(s.tokens)))
        assert [float(x) for x in per_token.split()] == pytest.approx(s.token_log_probs, abs=5e-5 + REL * 20)
    translator.score_file(src, tmp_path / "out.tsv", pieces=True, alignment=True)
    rows = [line.split("\t") for line in (tmp_path / "out.tsv").read_text(encoding="utf-8").splitlines()]
    for row, s in zip(rows, want):
        assert len(row) == 4 and row[2].split(" ") == s.tokens
        assert row[3] == " ".join(f"{i}-{j}" for i, j in s.alignment)
    translator.score_file(src, tmp_path / "out.jsonl", format="jsonl")
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert records == [{"log_prob": s.log_prob, "tokens": s.tokens, "token_log_probs": s.token_log_probs}
                       for s in want]  # full precision


@pytest.mark.parametrize("content, message", [
    (b"a dog\tDOG\na cat CAT\n", r"pairs\.tsv, line 2: no tab; each line must be 'source<TAB>target'"),
    (b"a dog\tDOG\tDOG\n", r"pairs\.tsv, line 1: 2 tabs"),
    (b"a dog\tDOG\n \tCAT\n", r"pairs\.tsv, line 2 \(source\) is empty"),
    (b"a dog\tDOG\nthe cat\tCAT \xe9\n", r"pairs\.tsv, line 2, byte 13 of the line: not valid UTF-8"),
    (b"a dog\tDOG\n" + b"dog " * 1100 + b"\tDOG\n", r"pairs\.tsv, line 2 \(source\): \d+ source pieces"),
    (b"a dog\t" + b"DOG " * 300 + b"\n", r"pairs\.tsv, line 1 \(target\): 1200 target pieces .*max_source_tokens"),
    (b"", r"pairs\.tsv is empty: nothing to score"),
])
def test_every_bad_line_is_named_before_anything_is_written(translator, tmp_path, content, message):
    (tmp_path / "pairs.tsv").write_bytes(content)
    (tmp_path / "old.tsv").write_text("earlier\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        translator.score_file(tmp_path / "pairs.tsv", tmp_path / "old.tsv")
    assert (tmp_path / "old.tsv").read_text(encoding="utf-8") == "earlier\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.tsv", "pairs.tsv"]  # no temporary file left


def test_bad_arguments(translator, tmp_path):
    with pytest.raises(ConfigError, match="format must be one of tsv, jsonl"):
        translator.score_file(_tsv(tmp_path), tmp_path / "o", format="csv")
    with pytest.raises(ConfigError, match="scoring takes no option 'beam'"):
        list(translator.score_iterable(PAIRS, beam=4))
    with pytest.raises(DataError, match="the input, line 2: a pair"):
        list(translator.score_iterable([("a", "A"), "b\tB"]))
    with pytest.raises(DataError, match="score_iterable takes an iterable"):
        translator.score_iterable("a\tb")


def test_the_command_reads_files_and_standard_input(translator, tmp_path):
    want = translator.score([s for s, _ in PAIRS], [t for _, t in PAIRS])
    tsv = [f"{s.log_prob:.4f}\t" + " ".join(f"{x:.4f}" for x in s.token_log_probs) for s in want]
    r = cli("--input", _tsv(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == tsv
    r = cli("--format", "jsonl", "--batch-tokens", "30", stdin=_tsv(tmp_path).read_text(encoding="utf-8"))
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    for g, s in zip(got, want):  # other batches: within the promised rounding
        assert g["log_prob"] == pytest.approx(s.log_prob, rel=REL, abs=REL * len(s.tokens))
    assert [g["tokens"] for g in got] == [s.tokens for s in want]
    r = cli("--pieces", "--output", tmp_path / "out.tsv", stdin="a dog\tDOG\n")
    assert r.returncode == 0 and r.stdout == ""
    assert (tmp_path / "out.tsv").read_text(encoding="utf-8").split("\t")[2] == "▁ D O G </s>\n"
    r = cli("--output", tmp_path / "out.tsv", stdin="a dog\tDOG\nno tab here\n")
    assert r.returncode == 2
    assert "tformer score: error: standard input, line 2: no tab" in r.stderr
    assert (tmp_path / "out.tsv").read_text(encoding="utf-8").split("\t")[2] == "▁ D O G </s>\n"  # untouched
