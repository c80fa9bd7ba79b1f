"""SpecAugment's masks against the distribution the paper defines (Park et al. 2019, section 2), drawn many times.

One mask of a kind: width w ~ U{0 .. W}, start ~ U{0 .. n - w}, n the values (frequency) or the utterance's real
frames (time, W = min(width, floor(ratio x frames))). The draws are seeded, so each test is deterministic; the
chi-square bound below holds for the right distribution with a wide margin and fails for a shifted one.
"""

import collections

import torch

from tformer.config import TrainConfig
from tformer.data.specaugment import SpecAugment


def bands(mask_1d: torch.Tensor) -> list[tuple[int, int]]:
    """(start, width) of each run of True in a 1-D bool tensor."""
    runs, start = [], None
    for i, v in enumerate(mask_1d.tolist() + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def chi_square(counts: collections.Counter, expected: dict) -> float:
    assert set(counts) <= set(expected), sorted(set(counts) - set(expected))  # nothing outside the support
    return sum((counts.get(cell, 0) - e) ** 2 / e for cell, e in expected.items())


def assert_uniform_bands(observed: collections.Counter, n: int, widest: int, draws: int) -> None:
    """`observed` (start, width) of single masks over `draws` draws follow w ~ U{0..widest}, start ~ U{0..n-w}."""
    expected = {(s, w): draws / (widest + 1) / (n - w + 1) for w in range(1, widest + 1) for s in range(n - w + 1)}
    dof = len(expected)
    assert chi_square(observed, expected) < dof + 6 * (2 * dof) ** 0.5, observed  # ~6 sigma above its mean
    empty = draws - sum(observed.values())  # width 0 masks nothing
    assert abs(empty - draws / (widest + 1)) < 6 * (draws / (widest + 1)) ** 0.5


def test_a_frequency_mask_has_a_uniform_width_and_a_uniform_start():
    aug = SpecAugment(freq_masks=1, freq_mask_width=5, time_masks=0)
    n, draws, observed = 6, 0, collections.Counter()
    for step in range(150):
        m = aug.masks(torch.tensor([3] * 20), 3, n, 7, step)  # (20, 3, 6): 20 utterances, 3 frames, 6 values
        for b in range(20):
            assert torch.equal(m[b, 0], m[b, 1]) and torch.equal(m[b, 0], m[b, 2])  # one band on every frame
            observed.update(bands(m[b, 0]))
            draws += 1
    assert_uniform_bands(observed, n, 5, draws)


def test_a_time_mask_has_a_uniform_width_up_to_its_share_and_a_uniform_start():
    aug = SpecAugment(freq_masks=0, time_masks=1, time_mask_width=8, time_mask_ratio=0.5)
    counts = torch.tensor([10, 16, 7, 10])  # widest span: min(8, 5) = 5, min(8, 8) = 8, min(8, 3) = 3
    observed = [collections.Counter() for _ in counts]
    draws = 600
    for step in range(draws):
        m = aug.masks(counts, 16, 2, 3, step)  # (4, 16, 2)
        for b in range(4):
            assert torch.equal(m[b, :, 0], m[b, :, 1])  # a span masks every value of its frames
            observed[b].update(bands(m[b, :, 0]))
    for b, (c, widest) in enumerate(zip(counts.tolist(), (5, 8, 3, 5))):
        assert_uniform_bands(observed[b], c, widest, draws)


def test_several_masks_are_a_union_and_frequency_and_time_masks_add_up():
    aug = SpecAugment(freq_masks=2, freq_mask_width=3, time_masks=2, time_mask_width=3, time_mask_ratio=1.0)
    most_bands = most_spans = 0
    for step in range(100):
        m = aug.masks(torch.tensor([20]), 20, 20, 0, step)[0]  # (20 frames, 20 values)
        full_values, full_frames = m.all(0), m.all(1)  # bands (every frame) and spans (every value)
        assert torch.equal(m, full_values[None] | full_frames[:, None])  # nothing but bands and spans
        most_bands, most_spans = max(most_bands, int(full_values.sum())), max(most_spans, int(full_frames.sum()))
    assert most_bands > 3 and most_spans > 3  # two masks of at most 3 cover more than one could


def test_masked_values_become_zero_by_default():
    aug = SpecAugment(freq_masks=1, freq_mask_width=4, time_masks=1, time_mask_width=4, time_mask_ratio=1.0)
    frames, counts = torch.randn(3, 9, 8) + 5, torch.tensor([9, 5, 2])
    mask = aug.masks(counts, 9, 8, 1, 2)
    out = aug(frames, counts, 1, 2)
    assert mask.any() and torch.equal(out[mask], torch.zeros(int(mask.sum())))
    assert torch.equal(out[~mask], frames[~mask])


def test_from_config_takes_each_setting_and_none_when_nothing_is_masked():
    t = TrainConfig(freq_masks=3, freq_mask_width=11, time_masks=4, time_mask_width=13, time_mask_ratio=0.3)
    assert SpecAugment.from_config(t) == SpecAugment(3, 11, 4, 13, 0.3)
    assert SpecAugment.from_config(TrainConfig(freq_masks=1)) == SpecAugment(1, 27, 0, 40, 0.2)
    assert SpecAugment.from_config(TrainConfig(time_masks=1)) == SpecAugment(0, 27, 1, 40, 0.2)
    assert SpecAugment.from_config(TrainConfig()) is None


def test_masks_are_drawn_on_the_cpu_and_applied_on_the_frames_device():
    aug = SpecAugment(freq_masks=2, freq_mask_width=3, time_masks=2, time_mask_width=3, time_mask_ratio=1.0)
    counts = torch.tensor([9, 4])
    want = aug.masks(counts, 9, 6, 4, 1)
    with torch.device("meta"):  # a default device elsewhere (a GPU user's) changes nothing
        assert torch.equal(aug.masks(counts, 9, 6, 4, 1), want)
    frames, fill = torch.empty(2, 9, 6, device="meta"), torch.zeros(6)  # frames on another device than the masks
    out = aug(frames, counts, 4, 1, fill=fill)
    assert out.device.type == "meta" and out.shape == frames.shape
    assert aug(torch.ones(2, 9, 6, dtype=torch.float64), counts, 4, 1, fill=fill).dtype == torch.float64
