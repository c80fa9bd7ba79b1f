"""Lengths of the synthetic tasks (data.length_distribution) and the length-uniform split test_uniform, against
oracles: outputs and digests written down from the generator before either existed, counts per length, and
exact match recomputed from the outputs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter

import pytest

import tformer
from tformer.cli import main
from tformer.config import DataConfig, load_config
from tformer.data import load_pairs, load_task
from tformer.data.synthetic import exact_match_by_length, synthetic_split
from tformer.errors import ConfigError, DataError

from helpers.models import tiny_config

# written by the generator before data.length_distribution and test_uniform existed (Normal lengths only)
SMALL = DataConfig(task="sort", symbols=6, length_mean=5, length_std=2, max_len=8, train_size=4, valid_size=3,
                   test_size=3, seed=3)
SMALL_PAIRS = {
    "train": [("b e b a a e", "a a b b e e"), ("c d e b d f", "b c d d e f"), ("c c c", "c c c"), ("f", "f")],
    "valid": [("a a c d e b a e", "a a a b c d e e"), ("f b c", "b c f"), ("c a b a", "a a b c")],
    "test": [("b c b c f b", "b b b c c f"), ("d a c b", "a b c d"), ("b b e c e f", "b b c e e f")],
}
# sha256 of the lines 'source<TAB>target' of the default config's splits (DGL's 9000/1000/1000)
DEFAULT_SHA256 = {
    ("copy", "train"): "0df0cead53f71531d345d7e80bbb0dd6445ed649bc7e1ab3403844a463ea871d",
    ("copy", "valid"): "eec16bea274a01b2edeee723d63904c296dae49b3383a6985247ae330ed23ed7",
    ("copy", "test"): "98da9ccd66b47ff736dd6f5bcb7924a67ebf7b211b0d69bcd286bb2ea5dec059",
    ("sort", "train"): "ca043723a020becbeaa2792df21c208576367c711e8c572bc073ad702cfa1f1b",
    ("sort", "valid"): "017b985418a7c513cb5b3ad0685eb5058085bc7af9fb79b968441cb0eda997b9",
    ("sort", "test"): "a61b37d976747ccb2490d9d7bb0061e23ae9d573b665811348098d3fb223e94b",
}


def _texts(pairs):
    return [(" ".join(a), " ".join(b)) for a, b in pairs]


def _digest(pairs) -> str:
    return hashlib.sha256("".join(f"{a}\t{b}\n" for a, b in _texts(pairs)).encode()).hexdigest()


@pytest.mark.parametrize("distribution", [{}, {"length_distribution": "normal"}])
def test_the_normal_default_is_unchanged_byte_for_byte(distribution):
    small = dataclasses.replace(SMALL, **distribution)
    for split, want in SMALL_PAIRS.items():
        assert _texts(synthetic_split(small, split)) == want
    for (task, split), want in DEFAULT_SHA256.items():
        assert _digest(synthetic_split(DataConfig(task=task, **distribution), split)) == want, (task, split)


def test_uniform_lengths_cover_every_length_alike():
    cfg = DataConfig(task="sort", length_distribution="uniform", min_len=4, max_len=26, train_size=9200)
    train = synthetic_split(cfg, "train")
    counts = Counter(len(s) for s, _ in train)
    assert sorted(counts) == list(range(4, 27))  # every length, nothing outside [min_len, max_len]
    assert all(300 <= c <= 500 for c in counts.values()), counts  # 400 expected each; the std is about 20
    assert all(t == sorted(s) for s, t in train)
    # the lengths a Normal(15, 3) would give almost never reach 26; uniform ones do, in validation too
    assert Counter(len(s) for s, _ in synthetic_split(cfg, "valid"))[26] > 20
    # the test split stays DGL's benchmark whatever the training lengths (test_uniform measures every length)
    assert synthetic_split(cfg, "test") == synthetic_split(dataclasses.replace(cfg, length_distribution="normal"),
                                                           "test")
    assert Counter(len(s) for s, _ in synthetic_split(cfg, "test"))[26] < 3
    # seeded as the normal generator is: deterministic, one generator per split, data.seed changes it
    assert train == synthetic_split(cfg, "train")
    assert train == synthetic_split(dataclasses.replace(cfg, valid_size=7, test_size=5), "train")
    assert train != synthetic_split(dataclasses.replace(cfg, seed=2), "train")
    one = DataConfig(task="copy", length_distribution="uniform", min_len=7, max_len=7, train_size=50)
    assert {len(s) for s, _ in synthetic_split(one, "train")} == {7}


def test_test_uniform_is_length_uniform_deterministic_and_apart_from_the_other_splits():
    cfg = DataConfig(task="copy", min_len=2, max_len=30, test_size=2900)  # trained on Normal(15, 3) lengths
    split = synthetic_split(cfg, "test_uniform")
    assert len(split) == 2900 and all(s == t for s, t in split)
    counts = Counter(len(s) for s, _ in split)
    assert sorted(counts) == list(range(2, 31)) and all(60 <= c <= 140 for c in counts.values()), counts
    assert split == synthetic_split(cfg, "test_uniform")
    assert split == synthetic_split(dataclasses.replace(cfg, train_size=10, valid_size=10), "test_uniform")
    assert split != synthetic_split(dataclasses.replace(cfg, seed=2), "test_uniform")
    # a generator of its own: none of its sequences of 8 or more symbols (26^8 of them) is in train, valid or test
    others = {tuple(s) for name in ("train", "valid", "test") for s, _ in synthetic_split(cfg, name)}
    long = [tuple(s) for s, _ in split if len(s) >= 8]
    assert len(long) > 2000 and not others.intersection(long)
    # the same whatever the training distribution: only test_size and the length range shape it
    assert split == synthetic_split(dataclasses.replace(cfg, length_distribution="uniform"), "test_uniform")
    assert _texts(load_pairs(cfg, "test_uniform")) == _texts(split)
    data = load_task(cfg, ("test_uniform",))
    assert list(data.examples) == ["test_uniform"] and len(data.texts["test_uniform"][0]) == 2900


def test_exact_match_by_length_counts_by_reference_length():
    refs = ["a", "b", "a b", "a b", "a b c", "c c c c"]
    hyps = ["a", "a", "a b", "a b c", "a b c", ""]
    assert exact_match_by_length(hyps, refs) == {1: (1, 2), 2: (1, 2), 3: (1, 1), 4: (0, 1)}
    with pytest.raises(ValueError):
        exact_match_by_length(hyps[:2], refs)


@pytest.mark.parametrize("call, error, message", [
    (lambda: load_config(None, ["data.length_distribution=zipf"]), ConfigError,
     "config key 'data.length_distribution': must be one of 'normal', 'uniform'; got 'zipf'"),
    (lambda: DataConfig(length_distribution="zipf"), ConfigError,
     "config key 'data.length_distribution': must be 'normal' or 'uniform', got 'zipf'"),
    (lambda: DataConfig(task="text", dir="x", length_distribution="uniform"), ConfigError,
     "config key 'data.length_distribution': applies to the synthetic tasks (copy, sort, reverse)"),
    (lambda: load_pairs(DataConfig(task="text", dir="x"), "test_uniform"), DataError,
     "split 'test_uniform' exists for the synthetic tasks (copy, sort, reverse) only"),
    (lambda: load_task(DataConfig(), ("test", "dev")), DataError,
     "unknown split 'dev'; choose one of train, valid, test"),
])
def test_bad_settings_and_splits_name_the_key(call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_evaluate_on_test_uniform_end_to_end(tmp_path, capsys):
    cfg = tiny_config(encoder_layers=1, decoder_layers=1)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, length_distribution="uniform", min_len=2,
                                                            max_len=9, test_size=80),
                              train=dataclasses.replace(cfg.train, epochs=20, schedule="constant", lr=3e-3))
    tformer.train(cfg, tmp_path / "run")
    translator = tformer.load(tmp_path / "run", device="cpu")
    result = translator.evaluate("test_uniform")
    want = _texts(synthetic_split(cfg.data, "test_uniform"))
    assert result.split == "test_uniform" and result.metrics["n"] == 80
    assert list(zip(result.sources, result.references)) == want
    exact = [o == r for o, r in zip(result.outputs, result.references)]
    assert 0 < sum(exact) < 80  # trained enough to get some right (about 40%), so the counts below mean something
    assert result.metrics["exact_match"] == pytest.approx(sum(exact) / 80)
    by_length = exact_match_by_length(result.outputs, result.references)
    assert by_length == {n: (sum(e for e, (s, _) in zip(exact, want) if len(s.split()) == n),
                             sum(len(s.split()) == n for s, _ in want)) for n in range(2, 10)}

    assert main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--split", "test_uniform", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["split"] == "test_uniform" and report["exact_match"] == pytest.approx(sum(exact) / 80)
    assert report["exact_match_by_length"] == {str(n): {"exact_match": e / c, "n": c}
                                               for n, (e, c) in by_length.items()}
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--split", "test_uniform"]) == 0
    out = capsys.readouterr().out
    assert "split test_uniform (80 examples)" in out and "by length: 2 " in out and " 9 " in out
