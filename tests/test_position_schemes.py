"""Positions beyond TUPE: T5's relative buckets alone, ALiBi, rotary (RoPE), and no positions in the decoder.
Oracles: the ALiBi paper's slopes and formula written out, Hugging Face T5's bucketing, RoPE as a complex-number
rotation and as Hugging Face Llama's, the uncached forward (every decoding step), the dense kernel (graph and
SDPA), each sentence alone (batching)."""

from __future__ import annotations


import pytest
import torch

from conftest import assert_kernels_and_batching_agree, assert_steps_equal_full_forward, padded_batch
from tformer.api import build_model
from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.export import check_exportable
from tformer.positions import (ALiBiBias, RelativeBias, RelativeOnlyBias, alibi_slopes, relative_bucket, rotary_angles,
                               rotate)

SCHEMES = [("relative", ""), ("alibi", ""), ("sinusoidal", "none"), ("alibi", "relative"), ("relative", "none"),
           ("rotary", ""), ("sinusoidal", "rotary")]


def _cfg(positions: str, decoder_positions: str = "", **kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, ffn_dropout=0.0, positions=positions, decoder_positions=decoder_positions,
                relative_buckets=8, relative_max_distance=6)
    return ModelConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------ the formulas


def paper_slopes(n: int) -> list[float]:
    """ALiBi's get_slopes, as the paper's code writes it (ofirpress/attention_with_linear_biases)."""
    import math

    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12, 16])
def test_alibi_slopes_are_the_papers(heads):
    assert alibi_slopes(heads).tolist() == pytest.approx(paper_slopes(heads), rel=1e-7)
    if heads == 8:
        assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]  # 1/2 ... 1/256, the paper's example


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBiBias(4)
    m = alibi_slopes(4)
    full = bias(5, 5)  # (H, Lq, Lk)
    step = bias(1, 5, q_offset=4)  # a decoding step: the query at position 4
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert full[h, i, j] == pytest.approx(-m[h] * abs(i - j))
            assert step[h, 0, i] == pytest.approx(-m[h] * (4 - i))
    assert not list(bias.state_dict())  # nothing to save: a formula


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_equal_hugging_face_t5(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-200, 201)  # key - query
    for buckets, max_distance in ((32, 128), (8, 6), (16, 40)):
        want = T5Attention._relative_position_bucket(distance, bidirectional=bidirectional, num_buckets=buckets,
                                                     max_distance=max_distance)
        assert torch.equal(relative_bucket(distance, bidirectional, buckets, max_distance), want)


def test_relative_bias_has_no_absolute_term():
    """bias[h, i, j] = value[bucket(j - i), h]: shifting queries and keys together changes nothing."""
    torch.manual_seed(0)
    bias = RelativeOnlyBias(RelativeBias(4, 8, 6, bidirectional=True))
    full = bias(12, 12)
    for i in range(12):
        for j in range(12):
            b = relative_bucket(torch.tensor(j - i), True, 8, 6)
            torch.testing.assert_close(full[:, i, j], bias.relative.values.weight[b])
    torch.testing.assert_close(full[:, 3:, 3:], full[:, :-3, :-3])
    torch.testing.assert_close(bias(1, 9, q_offset=8)[:, 0], full[:, 8, :9])


def test_rotary_is_a_complex_rotation_per_pair():
    """Interleaved pairs (x_2i, x_2i+1) as complex numbers, multiplied by exp(i p theta_i), theta_i =
    10000^(-2i/Dh)."""
    torch.manual_seed(3)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # (B, H, L, Dh)
    positions = torch.tensor([0, 1, 2, 7, 100])
    cos, sin = rotary_angles(positions, 8)
    got = rotate(x.float(), cos, sin, "interleaved")
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    z = torch.view_as_complex(x.reshape(2, 3, 5, 4, 2).contiguous())  # (B, H, L, Dh/2)
    want = torch.view_as_real(z * torch.exp(1j * positions.double()[:, None] * theta)).reshape(2, 3, 5, 8)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_rotary_in_halves_is_hugging_face_llamas():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(4)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)
    cos, sin = rotary_angles(torch.arange(6), 16, base=500.0)
    want_q, want_k = apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    torch.testing.assert_close(rotate(q, cos, sin, "halves"), want_q)
    torch.testing.assert_close(rotate(k, cos, sin, "halves"), want_k)


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_rotary_scores_depend_on_the_distance_only(layout):
    """q_i . k_j after rotation is unchanged when both positions move by the same shift."""
    torch.manual_seed(5)
    q, k = torch.randn(6, 8), torch.randn(6, 8)
    scores = []
    for shift in (0, 3, 250):
        cos, sin = rotary_angles(torch.arange(6) + shift, 8)
        scores.append(rotate(q, cos, sin, layout) @ rotate(k, cos, sin, layout).T)  # (6, 6)
    torch.testing.assert_close(scores[1], scores[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(scores[2], scores[0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(scores[0], q @ k.T, atol=1e-3)  # positions do change the scores


def test_rotary_self_attention_is_its_formula():
    """softmax(rot(q) . rot(k) / sqrt(Dh)) v, with q, k, v from the in-projection and rot the rows' positions."""
    from tformer.attention import MultiHeadAttention
    from tformer.positions import Rotary

    torch.manual_seed(6)
    mha = MultiHeadAttention(16, 4, kernel="dense").eval()
    x = torch.randn(2, 5, 16)
    cos, sin = rotary_angles(torch.arange(5), 4)
    rot = Rotary(cos, sin, "interleaved")
    W, b = mha.in_proj.weight, mha.in_proj.bias

    def heads(t):
        return t.view(2, 5, 4, 4).transpose(1, 2)  # (B, H, L, Dh)

    q, k, v = (heads(x @ W[i * 16:(i + 1) * 16].T + b[i * 16:(i + 1) * 16]) for i in range(3))
    out = torch.softmax(rot(q) @ rot(k).transpose(-1, -2) / 2.0, dim=-1) @ v
    want = mha.out_proj(out.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(mha(x, rotary=rot).out, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ settings


def test_rotary_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="head size d_model / n_heads must be even"):
        _cfg("rotary", d_model=12, n_heads=4)
    with pytest.raises(ConfigError, match="rotary is not yet available in the universal transformer"):
        _cfg("rotary", kind="universal")


def test_no_positions_in_an_encoder_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="model.positions.*bag of tokens.*decoder_positions=none"):
        _cfg("none")
    _cfg("sinusoidal", "none")  # a decoder may


@pytest.mark.parametrize("positions,decoder", [("alibi", ""), ("relative", ""), ("sinusoidal", "none"),
                                               ("rotary", "")])
def test_export_refuses_them_by_name(positions, decoder):
    with pytest.raises(ConfigError, match=f"{decoder or positions}"):
        check_exportable(_cfg(positions, decoder))


# ------------------------------------------------------------------------------------------ in the model


def _kinds(schemes):  # rotary is refused in the universal transformer (test_rotary_settings_that_cannot_work...)
    return [(p, d, k) for p, d in schemes for k in ("vanilla", "universal") if not ("rotary" in (p, d) and k != "vanilla")]


@pytest.mark.parametrize("attention", ["dense", "sdpa", "graph"])
@pytest.mark.parametrize("positions,decoder,kind", _kinds(SCHEMES))
def test_decoding_steps_equal_the_full_forward(positions, decoder, attention, kind):
    torch.manual_seed(1)
    m = build_model(_cfg(positions, decoder, attention=attention, kind=kind), 20, 20).eval()
    assert_steps_equal_full_forward(m)


@pytest.mark.parametrize("positions,decoder,kind", _kinds(SCHEMES))
def test_graph_and_sdpa_equal_dense_and_batching_changes_nothing(positions, decoder, kind):
    torch.manual_seed(4)
    dense = build_model(_cfg(positions, decoder, attention="dense", kind=kind), 20, 20).eval()
    assert_kernels_and_batching_agree(dense, lambda cfg: build_model(cfg, 20, 20))


def test_decoder_without_positions_still_tells_order_apart():
    """A causal decoder with no positions is not blind to order: the same tokens in another order give other
    states (the prefix each position sees differs); an encoder without positions would not tell them apart."""
    torch.manual_seed(2)
    m = build_model(_cfg("sinusoidal", "none"), 20, 20).eval()
    src, sl = padded_batch([5], seed=7)
    tgt = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a = m(src, sl, tgt, torch.tensor([4])).real()
        b = m(src, sl, tgt.flip(1), torch.tensor([4])).real()
    assert not torch.allclose(a, b.flip(0), atol=1e-4)
