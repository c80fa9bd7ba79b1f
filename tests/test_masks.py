"""Masks on small cases written out by hand. Polarity: True = may attend."""

import torch

from tformer.masks import causal_mask, decoder_mask, encoder_mask, padding_mask

T, F = True, False


def test_padding_mask():
    assert padding_mask(torch.tensor([3, 1, 0])).tolist() == [[T, T, T], [T, F, F], [F, F, F]]
    assert padding_mask(torch.tensor([2]), max_len=4).tolist() == [[T, T, F, F]]


def test_causal_mask():
    assert causal_mask(3).tolist() == [[T, F, F], [T, T, F], [T, T, T]]


def test_encoder_mask_broadcasts_over_heads_and_queries():
    m = encoder_mask(padding_mask(torch.tensor([2, 3])))
    assert m.shape == (2, 1, 1, 3)
    assert m[0, 0, 0].tolist() == [T, T, F]


def test_decoder_mask_is_causal_and_hides_padding():
    m = decoder_mask(padding_mask(torch.tensor([3, 2])))
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].tolist() == [[T, F, F], [T, T, F], [T, T, T]]
    assert m[1, 0].tolist() == [[T, F, F], [T, T, F], [T, T, F]]  # the padded key is never seen
