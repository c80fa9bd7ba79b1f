"""tformer.positions, function by function: the tables, their growth and clamping, the attention biases' inputs
and devices, RoPE's angles, randomised positions' devices, the builders.

Oracles: the formulas written out element by element in float64 with `math` (Vaswani et al.'s sinusoids,
Hugging Face Marian's halves, Marian's C++ / tensor2tensor timescales, RoPE's angles), the rows of a learned
table indexed by hand, Hugging Face T5's bucketing, the TUPE formula on explicitly clamped positions, the
device oracle of conftest (a tensor made without `device=` lands on 'meta')."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from helpers.models import assert_follows_input_device
from tformer.positions import (ALiBiBias, LearnedPositions, RandomPositions, RelativeBias, RelativeOnlyBias, Rotary,
                               SinusoidalPositions, TupeBias, alibi_slopes, build_attention_bias, build_positions,
                               clamp_positions, relative_bucket, rotary_angles, rotate, sinusoidal_table)

FAR = [0, 1, 2, 7, 1000, 54321]  # positions checked; the last ones test float64 angles (float32 is off by ~1e-4)


def sinusoid_by_hand(p: int, d_model: int, layout: str) -> list[float]:
    """One row of the table, written out in float64. interleaved: Vaswani et al. 2017, PE[p, 2i] = sin(p w_i),
    PE[p, 2i+1] = cos(p w_i), w_i = 10000^(-2i/D); halves: Hugging Face's MarianSinusoidalPositionalEmbedding,
    the first ceil(D/2) columns sin(p w_j), the rest cos(p w_j), same w; marian: tensor2tensor's timing signal
    (Marian's C++), sines then cosines of w_i = 10000^(-i / max(D/2 - 1, 1)); fairseq: marian's row p + 2
    (fairseq's SinusoidalPositionalEmbedding numbers positions from padding_idx + 1 = 2)."""
    if layout == "fairseq":
        return sinusoid_by_hand(p + 2, d_model, "marian")
    if layout == "interleaved":
        return [(math.sin if c % 2 == 0 else math.cos)(p / 10000.0 ** (2 * (c // 2) / d_model))
                for c in range(d_model)]
    if layout == "halves":
        sentinel = (d_model + 1) // 2
        return ([math.sin(p / 10000.0 ** (2 * j / d_model)) for j in range(sentinel)]
                + [math.cos(p / 10000.0 ** (2 * j / d_model)) for j in range(d_model - sentinel)])
    n = d_model // 2
    log_increment = math.log(10000.0) / max(n - 1, 1)
    w = [math.exp(-i * log_increment) for i in range(n)]
    return [math.sin(p * x) for x in w] + [math.cos(p * x) for x in w]


# ------------------------------------------------------------------------------------------ sinusoids


@pytest.mark.parametrize("layout,d_model", [("interleaved", 8), ("interleaved", 7), ("interleaved", 2),
                                            ("halves", 8), ("halves", 7), ("halves", 5), ("marian", 8),
                                            ("marian", 4), ("marian", 2)])
def test_sinusoidal_table_is_the_formula_at_far_positions(layout, d_model):
    table = sinusoidal_table(FAR[-1] + 1, d_model, layout)
    assert table.shape == (FAR[-1] + 1, d_model) and table.dtype == torch.float32
    want = torch.tensor([sinusoid_by_hand(p, d_model, layout) for p in FAR], dtype=torch.float64)
    torch.testing.assert_close(table[FAR].double(), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_sinusoidal_table_is_float32_whatever_the_default_dtype(default):
    """A program that sets another default dtype (float64 for a check, bfloat16 to save memory) still gets the
    float32 table, accurate to float32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        tables = {layout: sinusoidal_table(1001, 6, layout) for layout in ("interleaved", "halves", "marian")}
    finally:
        torch.set_default_dtype(old)
    for layout, table in tables.items():
        assert table.dtype == torch.float32
        want = torch.tensor([sinusoid_by_hand(p, 6, layout) for p in (0, 3, 1000)], dtype=torch.float64)
        torch.testing.assert_close(table[[0, 3, 1000]].double(), want, rtol=0, atol=1e-6)


def test_unknown_sinusoid_layout_names_the_choices():
    with pytest.raises(ValueError, match=r"^unknown sinusoid layout 'odd'; choose one of interleaved, halves, "
                                         r"marian, fairseq$"):
        sinusoidal_table(4, 8, "odd")


@pytest.mark.parametrize("layout", ["interleaved", "halves", "marian", "fairseq"])
def test_sinusoidal_positions_grow_past_their_table_by_the_formula(layout):
    """A table of 4 rows asked for rows 3 .. 5, then 3 .. 12, then 20 .. 99 (past twice its size), then packed
    positions past it: every row is the formula's for its layout."""
    pos = SinusoidalPositions(10, initial_length=4, layout=layout)

    def want(positions):
        return torch.tensor([sinusoid_by_hand(p, 10, layout) for p in positions], dtype=torch.float64)

    torch.testing.assert_close(pos(4).double(), want(range(4)), rtol=0, atol=1e-6)  # the initial table
    torch.testing.assert_close(pos(3, offset=3).double(), want(range(3, 6)), rtol=0, atol=1e-6)
    torch.testing.assert_close(pos(10, offset=3).double(), want(range(3, 13)), rtol=0, atol=1e-6)
    torch.testing.assert_close(pos(80, offset=20).double(), want(range(20, 100)), rtol=0, atol=1e-6)
    index = torch.tensor([5, 0, 250, 250, 17])
    torch.testing.assert_close(pos.at(index).double(), want(index.tolist()), rtol=0, atol=1e-6)
    assert pos.at(torch.tensor([], dtype=torch.long)).shape == (0, 10)  # no positions, no rows
    assert pos.at(torch.tensor([[1, 2], [3, 300]])).shape == (2, 2, 10)
    empty = SinusoidalPositions(10, initial_length=0, layout=layout)  # no rows until asked
    torch.testing.assert_close(empty(3).double(), want(range(3)), rtol=0, atol=1e-6)


def test_sinusoidal_positions_default_to_the_papers_layout():
    pos = SinusoidalPositions(6)
    want = torch.tensor([sinusoid_by_hand(p, 6, "interleaved") for p in range(5)], dtype=torch.float64)
    torch.testing.assert_close(sinusoidal_table(5, 6).double(), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(pos(5).double(), want, rtol=0, atol=1e-6)
    built = build_positions("sinusoidal", 6, 16)
    torch.testing.assert_close(built(5).double(), want, rtol=0, atol=1e-6)
    marian = build_positions("sinusoidal", 6, 16, "marian")
    torch.testing.assert_close(marian(2000).double()[1999], torch.tensor(sinusoid_by_hand(1999, 6, "marian"),
                                                                     dtype=torch.float64), rtol=0, atol=1e-6)


def test_sinusoidal_positions_save_nothing_and_grow_on_the_modules_device():
    """The table is a formula: no checkpoint holds it (one saved after the table grew loads into a fresh
    model), and a table grown on demand stays on the module's device."""
    pos = SinusoidalPositions(6, initial_length=4)
    pos(50)
    assert not list(pos.state_dict())
    SinusoidalPositions(6, initial_length=4).load_state_dict(pos.state_dict())
    meta = SinusoidalPositions(6, initial_length=4).to("meta")
    assert meta(9, offset=3).device.type == "meta"


# ------------------------------------------------------------------------------------------ learned tables


def test_learned_positions_are_the_table_rows_and_the_last_past_it(caplog):
    torch.manual_seed(0)
    pos = LearnedPositions(4, max_positions=8)
    rows = pos.table.weight.detach()
    torch.testing.assert_close(pos(3, offset=2), rows[2:5])
    with caplog.at_level(logging.WARNING, logger="tformer"):
        torch.testing.assert_close(pos(4, offset=6), rows[[6, 7, 7, 7]])  # positions 6 .. 9: 8 and 9 clamp
        torch.testing.assert_close(pos.at(torch.tensor([8, 0, 12])), rows[[7, 0, 7]])
        torch.testing.assert_close(pos.at(torch.tensor([8])), rows[[7]])  # one past the table: its last row
        pos(30)
    records = [r for r in caplog.records if r.name == "tformer"]
    assert len(records) == 1, "warned once per table"
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage() == ("a sequence of 10 positions is longer than the learned position table "
                                       "(model.max_positions=8): later positions share its last row")


def test_a_table_is_enough_up_to_its_size_and_nothing_warns(caplog):
    torch.manual_seed(0)
    pos = LearnedPositions(4, max_positions=8)
    with caplog.at_level(logging.WARNING, logger="tformer"):
        torch.testing.assert_close(pos(8), pos.table.weight.detach())  # positions 0 .. 7: the whole table
        assert pos.at(torch.tensor([], dtype=torch.long)).shape == (0, 4)
    assert not caplog.records and not pos.warned
    empty = torch.tensor([], dtype=torch.long)
    assert clamp_positions(empty, 8, pos).shape == (0,) and not pos.warned


def test_learned_positions_follow_the_tables_device():
    pos = LearnedPositions(4, max_positions=8)
    assert_follows_input_device(pos, 5, 2)
    assert_follows_input_device(pos, 5)


# ------------------------------------------------------------------------------------------ T5's buckets


@pytest.mark.parametrize("bidirectional,buckets,max_distance", [
    (True, 4, 6), (True, 5, 9), (True, 6, 20), (True, 6, 4), (True, 7, 4), (False, 2, 6), (False, 3, 8),
    (False, 4, 20), (False, 5, 9)])
def test_few_buckets_equal_hugging_face_t5(bidirectional, buckets, max_distance):
    """Small bucket counts, where a direction's exact buckets are one or two (distance 1 is the first log one,
    and with 6 buckets up to distance 4 it is not the last)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-50, 51)  # key - query
    want = T5Attention._relative_position_bucket(distance, bidirectional=bidirectional, num_buckets=buckets,
                                                 max_distance=max_distance)
    assert torch.equal(relative_bucket(distance, bidirectional, buckets, max_distance), want)


@pytest.mark.parametrize("causal", [False, True])
def test_built_relative_bias_is_bidirectional_in_the_encoder_only(causal):
    """bias[h, i, j] = value[bucket(j - i), h] with Hugging Face T5's buckets: both directions in the encoder,
    looking back only in the decoder (later keys all share bucket 0)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(1)
    for kind in ("relative", "tupe-r"):
        bias = build_attention_bias(kind, 16, 2, max_positions=32, untie_first=False, buckets=8, max_distance=12,
                                    causal=causal)
        relative = bias.relative
        got = relative(torch.arange(10), torch.arange(10))  # (H, Lq, Lk)
        distance = torch.arange(10)[None, :] - torch.arange(10)[:, None]
        bucket = T5Attention._relative_position_bucket(distance, bidirectional=not causal, num_buckets=8,
                                                       max_distance=12)
        torch.testing.assert_close(got, relative.values.weight.detach()[bucket].permute(2, 0, 1))


# ------------------------------------------------------------------------------------------ attention biases


def _tupe_by_hand(m: TupeBias, q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    """The TUPE formula per head on the table rows of the positions, each clamped by hand to the last row."""
    D, H = m.table.weight.shape[1], m.n_heads
    Dh = D // H
    rows = m.table.weight.shape[0] - 1

    def heads(proj, positions):
        p = torch.nn.functional.layer_norm(m.table.weight[[min(x, rows) for x in positions]], (D,),
                                           m.norm.weight, m.norm.bias)
        return (p @ proj.weight.T + proj.bias).view(len(positions), H, Dh)  # (L, H, Dh)

    q, k = heads(m.q_proj, q_pos), heads(m.k_proj, k_pos)
    return torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(2 * Dh)


def test_tupe_bias_past_its_table_uses_the_last_row_and_warns_once(caplog):
    torch.manual_seed(2)
    m = TupeBias(16, 2, max_positions=6)
    torch.nn.init.normal_(m.norm.bias)
    q_pos, k_pos = [0, 5, 6, 9], [2, 5, 7, 8, 30]
    with caplog.at_level(logging.WARNING, logger="tformer"), torch.no_grad():
        got = m.at(torch.tensor(q_pos), torch.tensor(k_pos))
        torch.testing.assert_close(m(3, 12, q_offset=9), _tupe_by_hand(m, [9, 10, 11], list(range(12))))
        torch.testing.assert_close(m(1, 7, q_offset=6), _tupe_by_hand(m, [6], list(range(7))))  # just past it
    with torch.no_grad():
        torch.testing.assert_close(got, _tupe_by_hand(m, q_pos, k_pos))
    records = [r for r in caplog.records if r.name == "tformer"]
    assert len(records) == 1 and "model.max_positions=6" in records[0].getMessage()


def test_built_tupe_bias_passes_its_settings():
    """build_attention_bias's TUPE has the table size it is given (positions clamp there), unties the first
    token when asked (row 0 and column 0 start at zero: no bias until trained), and has a relative term for
    tupe-r only."""
    torch.manual_seed(3)
    for kind in ("tupe", "tupe-r"):
        bias = build_attention_bias(kind, 16, 2, max_positions=5, untie_first=True, buckets=8, max_distance=12,
                                    causal=False)
        got = bias(7, 7).detach()  # (H, 7, 7)
        assert torch.equal(got[:, 0, :], torch.zeros(2, 7)) and torch.equal(got[:, :, 0], torch.zeros(2, 7))
        with torch.no_grad():
            want = _tupe_by_hand(bias, list(range(7)), list(range(7)))
            if kind == "tupe-r":
                distance = torch.arange(7)[None, :] - torch.arange(7)[:, None]
                want = want + bias.relative.values.weight[relative_bucket(distance, True, 8, 12)].permute(2, 0, 1)
        torch.testing.assert_close(got[:, 1:, 1:], want[:, 1:, 1:])
        assert (bias.relative is None) == (kind == "tupe")
    tied = build_attention_bias("tupe", 16, 2, max_positions=5, untie_first=False, buckets=8, max_distance=12,
                                causal=True)
    with torch.no_grad():
        torch.testing.assert_close(tied(7, 7), _tupe_by_hand(tied, list(range(7)), list(range(7))))


def test_other_kinds_have_no_attention_bias_and_alibi_is_its_formula():
    for kind in ("sinusoidal", "learned", "rotary", "none"):
        assert build_attention_bias(kind, 16, 2, 32, False, 8, 12, causal=False) is None
    alibi = build_attention_bias("alibi", 16, 4, 32, False, 8, 12, causal=True)
    m = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]  # 2^(-8 (h + 1) / H)
    want = torch.tensor([[[-m[h] * abs(i - j) for j in range(5)] for i in range(3)] for h in range(4)])
    torch.testing.assert_close(alibi(3, 5), want)


def test_alibi_slopes_are_float32_whatever_the_default_dtype():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        slopes = alibi_slopes(4)
    finally:
        torch.set_default_dtype(old)
    assert slopes.dtype == torch.float32 and slopes.tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]


def test_attention_biases_follow_their_modules_device():
    torch.manual_seed(4)
    for bias in (TupeBias(16, 2, 8, untie_first=True, relative=RelativeBias(2, 8, 12, True)), ALiBiBias(2),
                 RelativeOnlyBias(RelativeBias(2, 8, 12, False))):
        with torch.no_grad():
            assert_follows_input_device(bias, 3, 5, 2)
            assert_follows_input_device(bias, 4, 4)


# ------------------------------------------------------------------------------------------ RoPE


def angles_by_hand(positions: list[int], head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p theta_i, theta_i = base^(-2i/Dh), in float64 with math."""
    angle = [[p * base ** (-2 * i / head_dim) for i in range(head_dim // 2)] for p in positions]
    return (torch.tensor([[math.cos(a) for a in row] for row in angle], dtype=torch.float64),
            torch.tensor([[math.sin(a) for a in row] for row in angle], dtype=torch.float64))


def test_rotary_angles_are_the_formula_at_far_positions():
    cos, sin = rotary_angles(torch.tensor(FAR), 8)  # the default base, 10000
    want_cos, want_sin = angles_by_hand(FAR, 8, 10000.0)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (len(FAR), 4)
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=1e-6)
    cos, sin = rotary_angles(torch.tensor(FAR), 6, base=500.0)
    want_cos, want_sin = angles_by_hand(FAR, 6, 500.0)
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=1e-6)


def test_rotary_angles_follow_the_positions_device():
    assert_follows_input_device(rotary_angles, torch.tensor([0, 3, 9]), 8)
    assert_follows_input_device(rotary_angles, torch.tensor([0, 3, 9]), 8, 500.0)


def test_rotate_defaults_to_interleaved_pairs():
    """(x_2i, x_2i+1) -> (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos): RoFormer's pairs unless told otherwise."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # (L=1, Dh=4)
    cos, sin = torch.tensor([[0.6, 0.0]]), torch.tensor([[0.8, 1.0]])
    assert rotate(x, cos, sin)[0].tolist() == pytest.approx([1 * 0.6 - 2 * 0.8, 1 * 0.8 + 2 * 0.6, -4.0, 3.0])


def _rotated_by_hand(x: torch.Tensor, positions: list[int], base: float) -> torch.Tensor:
    """x (L, Dh) with interleaved pairs turned by p theta_i (float64)."""
    cos, sin = angles_by_hand(positions, x.shape[-1], base)
    a, b = x.double()[:, 0::2], x.double()[:, 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def test_rotary_keeps_its_base_and_layout_at_other_positions_and_rows():
    torch.manual_seed(5)
    x = torch.randn(4, 6)  # (L, Dh)
    for base in (500.0, 10000.0):
        rot = Rotary.build(torch.tensor([0, 1, 2, 3]), 6, base, "interleaved")
        torch.testing.assert_close(rot(x).double(), _rotated_by_hand(x, [0, 1, 2, 3], base), rtol=0, atol=1e-5)
        moved = rot.at(torch.tensor([7, 100, 3, 2]))
        torch.testing.assert_close(moved(x).double(), _rotated_by_hand(x, [7, 100, 3, 2], base), rtol=0, atol=1e-5)
        picked = rot.select(torch.tensor([3, 1]))
        torch.testing.assert_close(picked(x[:2]).double(), _rotated_by_hand(x[:2], [3, 1], base), rtol=0,
                                   atol=1e-5)
    halves = Rotary.build(torch.arange(4), 6, 10000.0, "halves").at(torch.tensor([5, 6, 7, 8]))
    cos, sin = angles_by_hand([5, 6, 7, 8], 6, 10000.0)
    a, b = x.double()[:, :3], x.double()[:, 3:]
    torch.testing.assert_close(halves(x).double(), torch.cat([a * cos - b * sin, a * sin + b * cos], -1),
                               rtol=0, atol=1e-5)
    # made from angles alone (no base given): the default base, 10000
    plain = Rotary(*rotary_angles(torch.arange(4), 6), "interleaved").at(torch.tensor([50, 51, 52, 53]))
    torch.testing.assert_close(plain(x).double(), _rotated_by_hand(x, [50, 51, 52, 53], 10000.0), rtol=0, atol=1e-5)


def test_rotary_at_other_positions_stays_on_its_device():
    """Angles moved to other positions (given on the CPU) stay where the rotation is (a GPU model's, here meta)."""
    rot = Rotary.build(torch.arange(4, device="meta"), 6, 10000.0, "interleaved")
    moved = rot.at(torch.tensor([1, 2]))
    assert moved.cos.device.type == moved.sin.device.type == "meta" and moved.cos.shape == (2, 3)


# ------------------------------------------------------------------------------------------ randomised positions


@pytest.mark.parametrize("draw", ["sorted", "shift"])
def test_random_positions_depend_on_their_key_alone(draw):
    """The same key draws the same positions whatever the global random state (a resumed run, other code
    drawing numbers in between); another key draws others."""
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        torch.rand(7)
        rp = RandomPositions(200, 3, 9, 0, 1, draw=draw)
        draws.append([rp(12) for _ in range(3)])
    for a, b in zip(*draws):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(draws[0], draws[0][1:]))  # successive batches differ
    assert not torch.equal(RandomPositions(200, 3, 10, 0, 1, draw=draw)(12), draws[0][0])


@pytest.mark.parametrize("draw", ["sorted", "shift"])
def test_random_positions_are_made_on_the_device_asked(draw):
    drawn = RandomPositions(40, 1, 2, draw=draw)(6, device="meta")
    assert drawn.device.type == "meta" and drawn.shape == (6,)
    assert RandomPositions(40, 1, 2, draw=draw)(6).device.type == "cpu"


# ------------------------------------------------------------------------------------------ builders


def test_build_positions_for_each_kind():
    torch.manual_seed(6)
    learned = build_positions("learned", 4, 8)
    assert isinstance(learned, LearnedPositions) and learned.table.weight.shape == (8, 4)
    torch.testing.assert_close(learned(10)[8:], learned.table.weight.detach()[[7, 7]])  # 8 rows, then the last
    for kind in ("tupe", "tupe-r", "relative", "alibi", "rotary", "none"):
        assert build_positions(kind, 4, 8) is None
    with pytest.raises(ValueError, match=r"^unknown positions 'absolute'; choose one of sinusoidal, learned, tupe, "
                                         r"tupe-r, relative, alibi, rotary, none$"):
        build_positions("absolute", 4, 8)
