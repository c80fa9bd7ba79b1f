"""Token accuracy and exact match against counts written out by hand."""

import pytest
import torch

from tformer.errors import DataError
from tformer.metrics import exact_match, token_accuracy

PAD = 0


def test_token_accuracy_counts_right_argmaxes_at_real_positions_only():
    target = torch.tensor([3, 1, 0, 2, 0])  # two pads
    logits = torch.full((5, 4), -1.0)
    logits[[0, 1, 2, 3, 4], [3, 2, 0, 2, 1]] = 1.0  # right, wrong, (pad, "right"), right, (pad, wrong)
    assert token_accuracy(logits, target, PAD) == (2, 3)
    assert token_accuracy(logits, target, pad=9) == (3, 5)  # no pad id among them: every position counts


def test_exact_match_is_the_share_of_whole_sequences_equal_to_their_reference():
    refs = [[1, 2], [3], [4, 5, 6], []]
    assert exact_match([[1, 2], [3], [4, 5], []], refs) == 0.75
    assert exact_match([[2, 1], [3, 3], [4, 5], [7]], refs) == 0.0
    assert exact_match(refs, refs) == 1.0
    assert exact_match([], []) == 0.0
    with pytest.raises(DataError, match="2 hypotheses for 4 references"):
        exact_match([[1, 2], [3]], refs)
