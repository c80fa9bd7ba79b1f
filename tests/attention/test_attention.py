"""Our attention against torch.nn.MultiheadAttention (copied weights) and kernel against kernel."""

import pytest
import torch

from tformer.attention import MultiHeadAttention, dense_attention, sdpa_attention
from tformer.masks import causal_mask, encoder_mask, padding_mask


def _pair(d=32, h=4):
    ours = MultiHeadAttention(d, h, dropout=0.0, kernel="dense")
    ref = torch.nn.MultiheadAttention(d, h, dropout=0.0, batch_first=True)
    with torch.no_grad():
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours.eval(), ref.eval()


@pytest.mark.parametrize("kernel", ["dense", "sdpa"])
def test_self_attention_with_padding_matches_torch(kernel):
    ours, ref = _pair()
    ours.set_kernel(kernel)
    x = torch.randn(3, 7, 32)
    lengths = torch.tensor([7, 4, 1])
    real = padding_mask(lengths, 7)  # True = token
    got = ours(x, mask=encoder_mask(real)).out
    want, _ = ref(x, x, x, key_padding_mask=~real, need_weights=False)  # torch: True = ignore
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["dense", "sdpa"])
def test_causal_self_attention_matches_torch(kernel):
    ours, ref = _pair()
    ours.set_kernel(kernel)
    x = torch.randn(2, 6, 32)
    got = ours(x, mask=causal_mask(6)[None, None]).out
    want, _ = ref(x, x, x, attn_mask=~causal_mask(6), need_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cross_attention_and_weights_match_torch():
    ours, ref = _pair()
    q, mem = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    real = padding_mask(torch.tensor([9, 3]), 9)
    a = ours(q, memory=mem, mask=encoder_mask(real), need_weights=True)
    want, want_w = ref(q, mem, mem, key_padding_mask=~real, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(a.out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.weights, want_w, atol=1e-6, rtol=1e-5)
    assert torch.all(a.weights[1, :, :, 3:] == 0)  # padded keys get no weight


@pytest.mark.parametrize("n_queries", [1, 5, 12])  # below and above SDPA_CPU_MIN_QUERIES
def test_dense_and_sdpa_agree_with_mask_and_bias(n_queries):
    q, k, v = torch.randn(2, 4, n_queries, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    mask = padding_mask(torch.tensor([9, 6]), 9)[:, None, None, :]
    bias = torch.randn(1, 4, n_queries, 9)
    for kwargs in ({}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}, {"scale": 0.1}):
        want, _ = dense_attention(q, k, v, **kwargs)
        got, _ = sdpa_attention(q, k, v, **kwargs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_weights_on_request_sum_to_one_and_respect_the_structure():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    _, w = sdpa_attention(q, k, v, mask=causal_mask(4)[None, None], need_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 4))
    assert torch.all(w.triu(1) == 0)  # nothing from the future


def test_split_kv_projection_equals_fused_projection():
    ours, _ = _pair()
    x = torch.randn(2, 5, 32)
    self_out = ours(x).out
    cross_out = ours(x, memory=x).out  # same keys/values source through the split path
    torch.testing.assert_close(self_out, cross_out, atol=1e-6, rtol=1e-6)
