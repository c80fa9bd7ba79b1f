"""Synthetic tasks, vocabularies, token-budget batching and collation."""

import pytest
import torch

from tformer.config import DataConfig
from tformer.data import Vocab, collate, load_task, token_budget_batches
from tformer.data.synthetic import synthetic_split


def test_synthetic_tasks_are_deterministic_with_dgl_sizes():
    cfg = DataConfig(task="sort")
    train = synthetic_split(cfg, "train")
    assert len(train) == 9000 and len(synthetic_split(cfg, "valid")) == 1000
    assert train == synthetic_split(cfg, "train")  # same seed, same data
    assert train != synthetic_split(DataConfig(task="sort", seed=2), "train")
    assert all(t == sorted(s) for s, t in train)
    lengths = torch.tensor([len(s) for s, _ in train], dtype=torch.float)
    assert 14.0 < lengths.mean() < 15.0 and lengths.min() >= 1 and lengths.max() <= 30  # floor(N(15, 3))
    assert set(tok for s, _ in train for tok in s) == set("abcdefghijklmnopqrstuvwxyz")
    copy = synthetic_split(DataConfig(task="copy", symbols=30, train_size=50), "train")
    assert all(s == t for s, t in copy) and len(copy) == 50


def test_vocab_round_trip(tmp_path):
    v = Vocab.build([["x", "y"], ["y", "z"]])
    assert v.itos == ["<pad>", "<s>", "</s>", "<unk>", "x", "y", "z"]
    assert v.encode(["z", "q"]) == [6, Vocab.unk]
    assert v.decode([4, 0, 5, Vocab.eos, 6]) == ["x", "y"]
    v.save(tmp_path / "v.txt")
    assert Vocab.load(tmp_path / "v.txt") == v
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="must start with"):
        Vocab.load(tmp_path / "bad.txt")


def _lengths(n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 60, (n,), generator=g).tolist()
    tgt = [max(1, s + d) for s, d in zip(src, torch.randint(-5, 6, (n,), generator=g).tolist())]
    return src, tgt


@pytest.mark.parametrize("max_tokens,max_sentences", [(64, 0), (300, 0), (1000, 7)])
def test_token_budget_never_exceeded_and_each_example_once(max_tokens, max_sentences):
    src, tgt = _lengths()
    for epoch in range(3):
        batches = token_budget_batches(src, tgt, max_tokens, max_sentences, seed=5, epoch=epoch)
        for b in batches:
            assert len(b) * max(max(src[i], tgt[i]) for i in b) <= max_tokens
            assert not max_sentences or len(b) <= max_sentences
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(len(src)))


def test_batch_order_is_a_function_of_seed_and_epoch():
    src, tgt = _lengths()
    a = token_budget_batches(src, tgt, 300, seed=5, epoch=0)
    assert a == token_budget_batches(src, tgt, 300, seed=5, epoch=0)
    assert a != token_budget_batches(src, tgt, 300, seed=5, epoch=1)
    assert a != token_budget_batches(src, tgt, 300, seed=6, epoch=0)
    spread = [max(src[i] for i in b) - min(src[i] for i in b) for b in a]
    assert sum(spread) / len(spread) < 3  # bucketed: similar lengths share a batch


def test_over_long_example_is_reported():
    with pytest.raises(ValueError, match="example 1 has 90 tokens"):
        token_budget_batches([5, 90], [5, 5], 64)


def test_collate_adds_specials_and_pads():
    b = collate([([4, 5, 6], [7]), ([8], [9, 10])], [0, 1], pad=0, bos=1, eos=2)
    assert b.src.tolist() == [[4, 5, 6, 2], [8, 2, 0, 0]]
    assert b.tgt_in.tolist() == [[1, 7, 0], [1, 9, 10]]
    assert b.tgt_out.tolist() == [[7, 2, 0], [9, 10, 2]]
    assert b.src_lengths.tolist() == [4, 2] and b.tgt_lengths.tolist() == [2, 3]


def test_text_task_reads_files_and_reports_errors(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.src").write_text("a b c\nd e\n")
        (tmp_path / f"{split}.tgt").write_text("x y\nz\n")
    data = load_task(DataConfig(task="text", dir=str(tmp_path)))
    assert (data.texts["valid"][0][1], data.texts["valid"][1][1]) == ("d e", "z")
    assert data.examples["train"][0] == ([4, 5, 6], [4, 5])
    (tmp_path / "valid.tgt").write_text("x y\n")
    with pytest.raises(ValueError, match="has 2 lines but .*valid.tgt has 1"):
        load_task(DataConfig(task="text", dir=str(tmp_path)))
    (tmp_path / "valid.tgt").write_text("x y\n\n")
    with pytest.raises(ValueError, match=r"valid.tgt, line 2: empty line"):
        load_task(DataConfig(task="text", dir=str(tmp_path)))
    (tmp_path / "valid.tgt").write_bytes(b"x y\nz \xff\n")
    with pytest.raises(ValueError, match=r"valid.tgt, line 2, byte 3 of the line: not valid UTF-8"):
        load_task(DataConfig(task="text", dir=str(tmp_path)))


def test_reverse_is_copy_backwards_on_the_same_draws():
    """reverse draws exactly what copy draws from the same seed (the same sources, every split) and its targets
    are those sources backwards; test_uniform and `tformer data reverse` exist for it as for copy."""
    import dataclasses

    copy = DataConfig(task="copy", train_size=50, valid_size=20, test_size=20, seed=3)
    reverse = dataclasses.replace(copy, task="reverse")
    for split in ("train", "valid", "test", "test_uniform"):
        c, r = synthetic_split(copy, split), synthetic_split(reverse, split)
        assert [s for s, _ in r] == [s for s, _ in c]
        assert all(t == s[::-1] for s, t in r)
    assert any(s != s[::-1] for s, _ in r)  # not only palindromes
