"""Token-budget batching and collation, each against an oracle written out here: the plain greedy loop over
examples sorted by (source, target) length, padding built row by row, torch's own `pad_sequence`, the lengths'
formula (+1 for a special token; ceil(S / frame_skip) for frames)."""

import math

import numpy as np
import pytest
import torch
from helpers.models import assert_follows_input_device
from helpers.oracles import greedy_batch_ends
from torch.nn.utils.rnn import pad_sequence

from tformer.data.batching import (
    Batch,
    BatchPlan,
    collate,
    model_lengths,
    pad_frames,
    pad_sequences,
    token_budget_batches,
)
from tformer.errors import ConfigError

# ------------------------------------------------------------------------------------------ oracles


def _unshuffled(src: list[int], tgt: list[int], max_tokens: int, max_sentences: int = 0) -> list[list[int]]:
    """Indices stably sorted by (source, target) length, cut where the greedy loop cuts."""
    order = sorted(range(len(src)), key=lambda i: (src[i], tgt[i]))
    ends = greedy_batch_ends([max(src[i], tgt[i]) for i in order], max_tokens, max_sentences)
    return [order[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _profiles(batches, src, tgt) -> list[list[tuple[int, int]]]:
    """Each batch as its sorted (S, T) lengths, the batches in sorted order: what a shuffle must keep."""
    return sorted(sorted((src[i], tgt[i]) for i in b) for b in batches)


def _lengths(n: int, high: int, seed: int) -> tuple[list[int], list[int]]:
    g = np.random.default_rng(seed)
    return g.integers(1, high, n).tolist(), g.integers(1, high, n).tolist()


# ------------------------------------------------------------------------------------------ model lengths


def test_model_lengths_of_token_examples_count_the_special_token():
    examples = [([4, 5, 6], [7]), ([8], [9, 10, 11, 12]), ([], [])]
    src, tgt = model_lengths(examples)
    assert src.tolist() == [3 + 1, 1 + 1, 0 + 1] and tgt.tolist() == [1 + 1, 4 + 1, 0 + 1]
    assert src.dtype == np.int64 and tgt.dtype == np.int64


def test_model_lengths_of_an_empty_split_are_empty_integer_arrays():
    src, tgt = model_lengths([])
    assert src.shape == (0,) and tgt.shape == (0,)
    assert src.dtype == np.int64 and tgt.dtype == np.int64  # np.asarray([]) alone would be float64


@pytest.mark.parametrize("frame_skip", [1, 2, 3, 4])
def test_model_lengths_of_frames_are_what_the_frame_encoder_keeps(frame_skip):
    frames = [torch.zeros(s, 3) for s in (1, 5, 6, 7, 12)]
    examples = [(f, [1] * (i + 1)) for i, f in enumerate(frames)]
    src, tgt = model_lengths(examples, frame_skip)
    assert src.tolist() == [math.ceil(f.shape[0] / frame_skip) for f in frames]  # no </s> on frames
    assert tgt.tolist() == [2, 3, 4, 5, 6]
    assert src.dtype == np.int64


def test_model_lengths_of_frames_default_to_every_frame():
    src, _ = model_lengths([(torch.zeros(7, 2), [1]), (torch.zeros(4, 2), [1])])
    assert src.tolist() == [7, 4]


class _Prepared(list):
    """A corpus that knows its lengths: reading an example is an error."""

    def __init__(self, n: int):
        super().__init__([None] * n)
        self.asked = []

    def __iter__(self):
        raise AssertionError("the examples were read")

    def model_lengths(self, frame_skip):
        self.asked.append(frame_skip)
        return np.array([10 * frame_skip]), np.array([7])


def test_model_lengths_ask_a_corpus_that_knows_them_without_reading_it():
    corpus = _Prepared(1)
    src, tgt = model_lengths(corpus, 3)
    assert src.tolist() == [30] and tgt.tolist() == [7] and corpus.asked == [3]
    src, _ = model_lengths(corpus)
    assert src.tolist() == [10] and corpus.asked == [3, 1]


# ------------------------------------------------------------------------------------------ the plan


@pytest.mark.parametrize("n,high,max_tokens,max_sentences", [
    (400, 30, 29, 0),  # the budget equals the longest example: it must still fit, alone
    (400, 30, 60, 0),
    (400, 12, 100, 5),
    (1000, 3, 300, 0),  # batches of hundreds: the packing's window grows past 64 several times
    (1000, 2, 1000, 130),
    (130, 2, 1000, 0),  # one batch, a little over two windows
    (0, 2, 10, 0),
])
def test_unshuffled_batches_are_the_greedy_loop_over_sorted_lengths(n, high, max_tokens, max_sentences):
    src, tgt = _lengths(n, high, seed=n + high)
    want = _unshuffled(src, tgt, max_tokens, max_sentences)
    plan = BatchPlan(src, tgt, max_tokens, max_sentences)
    assert [b.tolist() for b in plan.epoch(shuffle=False)] == want
    assert len(plan) == len(want)
    assert token_budget_batches(src, tgt, max_tokens, max_sentences, shuffle=False) == want


def test_a_batch_fills_the_budget_exactly():
    # 12 examples of size 5 in a budget of 30: 6 x 5 = 30 fits, so two batches of six
    assert token_budget_batches([5] * 12, [4] * 12, 30, shuffle=False) == [list(range(6)), list(range(6, 12))]
    assert token_budget_batches([1] * 200, [1] * 200, 200, shuffle=False) == [list(range(200))]


def test_the_target_side_counts_too():
    # sources of 1, targets of 10: a budget of 20 takes two sentences, not twenty
    assert token_budget_batches([1] * 4, [10] * 4, 20, shuffle=False) == [[0, 1], [2, 3]]
    assert token_budget_batches([10] * 4, [1] * 4, 20, shuffle=False) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("seed,epoch", [(0, 0), (3, 1), (7, 12)])
def test_a_shuffled_epoch_keeps_each_batch_of_lengths_and_moves_examples_only_within_a_length(seed, epoch):
    """Shuffling permutes equal-(S, T) examples and then the batches: each batch holds the same lengths as in
    the unshuffled plan, and examples of different lengths never trade places."""
    src, tgt = _lengths(300, 10, seed=1)
    for max_tokens, max_sentences in [(20, 0), (45, 0), (60, 4)]:
        want = _unshuffled(src, tgt, max_tokens, max_sentences)
        got = [b.tolist() for b in BatchPlan(src, tgt, max_tokens, max_sentences).epoch(seed, epoch)]
        assert _profiles(got, src, tgt) == _profiles(want, src, tgt)
        assert sorted(i for b in got for i in b) == list(range(len(src)))


@pytest.mark.parametrize("side", ["target", "source"])
def test_lengths_differing_on_one_side_only_are_different_buckets(side):
    # one side all equal, the other alternates 1 and 9: a shuffle that mixed them would put a 9 among 1s
    src, tgt = [5] * 40, [1, 9] * 20
    if side == "source":
        src, tgt = tgt, src
    want = _unshuffled(src, tgt, 20)
    for epoch in range(5):
        got = [b.tolist() for b in BatchPlan(src, tgt, 20).epoch(0, epoch)]
        assert _profiles(got, src, tgt) == _profiles(want, src, tgt)


def test_two_examples_of_one_length_come_in_either_order():
    orders = {tuple(BatchPlan([3, 3], [4, 4], 100).epoch(0, e)[0].tolist()) for e in range(20)}
    assert orders == {(0, 1), (1, 0)}


def test_every_example_of_every_length_bucket_moves_within_and_between_batches():
    # five (S, T) buckets of 40 examples, interleaved; all of size 3, so a budget of 30 makes batches of 10
    kinds = [(1, 3), (2, 3), (3, 1), (3, 2), (3, 3)]
    src, tgt = [kinds[i % 5][0] for i in range(200)], [kinds[i % 5][1] for i in range(200)]
    plan = BatchPlan(src, tgt, 30)
    positions = {i: set() for i in range(200)}
    mates = {i: set() for i in range(200)}
    for e in range(30):
        batches = [b.tolist() for b in plan.epoch(1, e)]
        assert sorted(len(b) for b in batches) == [10] * 20
        for b in batches:
            assert len({(src[i], tgt[i]) for i in b}) == 1  # a bucket fills whole batches here
            for position, i in enumerate(b):
                positions[i].add(position)
                mates[i].add(frozenset(b))
    assert all(len(p) > 1 for p in positions.values())  # no example pinned to one place in its batch
    assert all(len(m) > 20 for m in mates.values())  # other batch mates nearly every epoch


def test_batches_come_in_a_shuffled_order_a_function_of_seed_and_epoch():
    src, tgt = _lengths(300, 30, seed=2)
    plan = BatchPlan(src, tgt, 60)
    base = [b.tolist() for b in plan.epoch(shuffle=False)]
    # the default is a shuffled epoch 0 of seed 0
    assert [b.tolist() for b in plan.epoch()] == [b.tolist() for b in plan.epoch(0, 0, True)]
    assert [b.tolist() for b in plan.epoch()] != base
    assert [b.tolist() for b in plan.epoch()] != [b.tolist() for b in plan.epoch(1, 0)]
    assert [b.tolist() for b in plan.epoch()] != [b.tolist() for b in plan.epoch(0, 1)]
    # the batches themselves are permuted, not only their members: the longest batch moves
    longest = [max(max(src[i], tgt[i]) for i in b) for b in base]
    assert any([max(max(src[i], tgt[i]) for i in b) for b in plan.epoch(0, e)] != longest for e in range(3))


def test_token_budget_batches_defaults_are_shuffled_epoch_0_of_seed_0_without_a_sentence_cap():
    src, tgt = _lengths(300, 10, seed=3)
    plan = BatchPlan(src, tgt, 100)
    assert token_budget_batches(src, tgt, 100) == [b.tolist() for b in plan.epoch(0, 0, True)]
    assert token_budget_batches(src, tgt, 100, seed=4, epoch=2) == [b.tolist() for b in plan.epoch(4, 2, True)]
    assert token_budget_batches(src, tgt, 100, 0, 4, 2, False) == _unshuffled(src, tgt, 100)
    assert max(len(b) for b in token_budget_batches(src, tgt, 100)) > 1  # no cap of one sentence
    assert _profiles(token_budget_batches(src, tgt, 100), src, tgt) == _profiles(_unshuffled(src, tgt, 100), src,
                                                                                  tgt)


def test_a_plan_keeps_four_bytes_per_example_and_its_batches_are_integer_views():
    src, tgt = _lengths(500, 20, seed=4)
    plan = BatchPlan(np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64), 80)
    assert plan.order.nbytes == 4 * 500
    for b in plan.epoch(2, 3) + plan.epoch(shuffle=False):
        assert b.dtype == np.int32
    assert all(isinstance(i, int) for b in token_budget_batches(src, tgt, 80) for i in b)


def test_an_over_long_example_is_named_with_what_to_do():
    # sizes 3, 9 (target side), 8 (= the budget: fits), 12
    with pytest.raises(ConfigError, match=r"^example 1 has 9 tokens \(with <s>/</s>\), more than train\.max_tokens=8; "
                                          r"raise train\.max_tokens or drop over-long examples$"):
        BatchPlan([3, 2, 8, 12], [1, 9, 8, 3], 8)
    with pytest.raises(ConfigError, match=r"^example 3 has 12 tokens"):
        BatchPlan([3, 2, 8, 12], [1, 8, 8, 3], 8)
    assert len(BatchPlan([3, 2, 8], [1, 8, 8], 8)) == 3


# ------------------------------------------------------------------------------------------ padding, collation


def _padded_rows(seqs, pad, first=None, last=None):
    rows = [([first] if first is not None else []) + list(s) + ([last] if last is not None else []) for s in seqs]
    width = max(len(r) for r in rows)
    return [r + [pad] * (width - len(r)) for r in rows], [len(r) for r in rows]


@pytest.mark.parametrize("first,last", [(None, None), (1, None), (None, 2), (1, 2)])
def test_pad_sequences_is_first_then_the_ids_then_last_then_padding(first, last):
    seqs = [[4, 5, 6], [7], [], np.array([8, 9])]
    out, lengths = pad_sequences(seqs, pad=3, first=first, last=last)
    want, want_lengths = _padded_rows(seqs, 3, first, last)
    assert out.tolist() == want and lengths == want_lengths
    assert out.dtype == torch.long


def test_pad_sequences_gives_long_ids_whatever_the_type_of_the_pad_id():
    out, _ = pad_sequences([[4, 5], [6]], pad=np.int32(0), last=np.int32(2))
    assert out.dtype == torch.long and out.tolist() == [[4, 5, 2], [6, 2, 0]]


def test_pad_frames_equals_torch_pad_sequence_and_follows_the_frames():
    g = torch.Generator().manual_seed(0)
    frames = [torch.randn(s, 4, generator=g, dtype=torch.float64) for s in (3, 7, 1)]
    out = assert_follows_input_device(pad_frames, frames)
    torch.testing.assert_close(out, pad_sequence(frames, batch_first=True), rtol=0, atol=0)
    assert out.shape == (3, 7, 4) and out.dtype == torch.float64
    one = [torch.randn(2, 5, generator=g)]
    torch.testing.assert_close(pad_frames(one), one[0][None], rtol=0, atol=0)


def test_collate_of_frames_pads_with_zeros_and_counts_input_frames():
    g = torch.Generator().manual_seed(1)
    frames = [torch.randn(s, 3, generator=g) for s in (6, 2)]
    batch = collate([(frames[0], [5, 6]), (frames[1], [7])], np.array([4, 9]), pad=0, bos=1, eos=2)
    torch.testing.assert_close(batch.src, pad_sequence(frames, batch_first=True), rtol=0, atol=0)
    assert batch.src_lengths.tolist() == [6, 2]
    assert batch.tgt_in.tolist() == [[1, 5, 6], [1, 7, 0]] and batch.tgt_out.tolist() == [[5, 6, 2], [7, 2, 0]]
    assert batch.tgt_lengths.tolist() == [3, 2]
    assert batch.indices == [4, 9] and all(type(i) is int for i in batch.indices)


def test_collate_of_tokens_uses_the_given_pad_bos_and_eos():
    b = collate([([4, 5, 6], [7]), ([8], [9, 10])], [3, 0], pad=9, bos=5, eos=6)
    want_src, src_lengths = _padded_rows([[4, 5, 6], [8]], 9, last=6)
    want_in, tgt_lengths = _padded_rows([[7], [9, 10]], 9, first=5)
    want_out, _ = _padded_rows([[7], [9, 10]], 9, last=6)
    assert b.src.tolist() == want_src and b.tgt_in.tolist() == want_in and b.tgt_out.tolist() == want_out
    assert b.src_lengths.tolist() == src_lengths and b.tgt_lengths.tolist() == tgt_lengths
    assert (b.n_src_tokens, b.n_tgt_tokens) == (4 + 2, 2 + 3)
    assert b.indices == [3, 0]


def test_batch_to_moves_every_tensor_and_keeps_the_indices():
    b = collate([([4, 5, 6], [7]), ([8], [9, 10])], [3, 0], pad=0, bos=1, eos=2)
    moved = b.to("meta")
    assert isinstance(moved, Batch) and moved.indices == [3, 0]
    for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
        before, after = getattr(b, name), getattr(moved, name)
        assert after.device.type == "meta" and after.shape == before.shape and after.dtype == before.dtype, name


def test_plans_index_examples_in_int32_while_every_position_fits_it():
    """Positions 0 .. n-1 fit int32 while n - 1 <= its largest value; one example more and they need int64."""
    from tformer.data.batching import index_dtype

    top = int(np.iinfo(np.int32).max)
    for n in (0, 1, 500, top, top + 1):
        assert index_dtype(n) is np.int32
    for n in (top + 2, 2**32, 3**31):
        assert index_dtype(n) is np.int64
