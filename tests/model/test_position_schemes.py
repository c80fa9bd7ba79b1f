"""Positions beyond TUPE: T5's relative buckets alone, ALiBi, rotary (RoPE), no positions in the decoder, and
randomised positions over any of them. Oracles: the ALiBi paper's slopes and formula written out, Hugging Face
T5's bucketing, RoPE as a complex-number rotation and as Hugging Face Llama's, the uncached forward (every
decoding step), the dense kernel (graph and SDPA), each sentence alone (batching), the default positions (an
index 0 .. L-1), translation invariance (relative schemes), an uninterrupted run (resume)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from helpers.models import (assert_kernels_and_batching_agree, assert_steps_equal_full_forward, padded_batch,
                            tiny_config)
from tformer.api import build_model
from tformer.config import Config, ModelConfig
from tformer.errors import ConfigError
from tformer.export import check_exportable
from tformer.positions import (ALiBiBias, RandomPositions, RelativeBias, RelativeOnlyBias, alibi_slopes, relative_bucket,
                               rotary_angles, rotate)

pytestmark = pytest.mark.device

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
    """The angles and the rotation both come from Hugging Face: LlamaRotaryEmbedding with the config's rope_theta
    (theta_i = rope_theta^(-2i/Dh)) and apply_rotary_pos_emb, for several bases; tformer's side is what a model
    built with that model.rotary_base rotates its queries and keys by."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    torch.manual_seed(4)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)  # (B, H, L, Dh)
    positions = torch.tensor([0, 1, 2, 5, 13, 37])
    rotated = {}
    for base in (500.0, 10000.0, 1e6):
        hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=base))
        cos, sin = hf(q, positions[None].expand(2, -1))  # (B, L, Dh) each
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        model = build_model(_cfg("rotary", d_model=64, rotary_layout="halves", rotary_base=base), 11)
        rot = model._rotary("encoder", positions, torch.device("cpu"))  # what its self-attention applies
        torch.testing.assert_close(rot(q), want_q, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rot(k), want_k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rotate(q, *rotary_angles(positions, 16, base=base), "halves"), want_q,
                                   rtol=1e-5, atol=1e-5)
        rotated[base] = want_q
    assert not torch.allclose(rotated[500.0], rotated[10000.0], atol=1e-2)  # the base matters at these positions
    assert not torch.allclose(rotated[1e6], rotated[10000.0], atol=1e-2)


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


def _kinds(schemes):
    return [(p, d, k) for p, d in schemes for k in ("vanilla", "universal")]


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


def test_rotary_universal_decoding_reads_halted_keys_at_their_positions():
    """The universal transformer recomputes a halted position's keys at later ACT steps from its final state
    (DecoderCache.anchors): with rotary those keys must be turned by their own positions, not the query's.
    Halting early (a high halting bias) makes positions halt at different steps, so the recomputed keys are read."""
    torch.manual_seed(3)
    m = build_model(_cfg("rotary", kind="universal", act_bias_init=2.0, max_steps=4), 20, 20).eval()
    for stack in (m.encoder, m.decoder):
        torch.nn.init.normal_(stack.halt.weight, std=2.0)  # positions halt after different numbers of steps
        torch.nn.init.constant_(stack.halt.bias, 0.5)
    src, sl = padded_batch([7, 4], seed=2)
    tgt, tl = padded_batch([6, 3], seed=3)
    with torch.no_grad():
        steps = m(src, sl, tgt, tl).ponder[1].steps
    assert len(set(steps[steps > 0].tolist())) > 1  # the halted-keys path is exercised
    assert_steps_equal_full_forward(m)


# ------------------------------------------------------------------------------------------ randomised positions


def test_random_positions_are_sorted_distinct_in_range_and_seeded():
    for length, high in [(1, 8), (5, 8), (8, 8), (20, 256), (30, 16)]:
        drawn = RandomPositions(high, 1, 7, 0, 0)(length)
        assert drawn.shape == (length,) and drawn.dtype == torch.long
        assert torch.all(drawn[1:] > drawn[:-1])  # sorted and distinct
        assert 0 <= int(drawn.min()) and int(drawn.max()) < max(high, length)
    a = [RandomPositions(256, 1, step, 0, 0)(20) for step in (5, 6)]
    assert torch.equal(a[0], RandomPositions(256, 1, 5, 0, 0)(20))  # the same key, the same draw
    assert not torch.equal(a[0], a[1])  # another update, another draw
    assert not torch.equal(a[0], RandomPositions(256, 2, 5, 0, 0)(20))  # another seed
    assert not torch.equal(a[0], RandomPositions(256, 1, 5, 1, 0)(20))  # another process
    draws = torch.cat([RandomPositions(64, 1, s, 0, 0)(10) for s in range(400)])
    counts = torch.bincount(draws, minlength=64).float()  # uniform over the range: 62.5 expected per position
    assert counts.min() > 30 and counts.max() < 100


def test_shifted_positions_are_consecutive_from_a_uniform_start():
    starts = []
    for step in range(300):
        drawn = RandomPositions(40, 1, step, 0, 0, draw="shift")(11)
        assert torch.equal(drawn, torch.arange(11) + drawn[0])  # consecutive: the distances of inference
        assert 0 <= int(drawn[0]) and int(drawn[-1]) < 40
        starts.append(int(drawn[0]))
    assert set(starts) == set(range(30))  # every start 0 .. high - L is drawn
    assert torch.equal(RandomPositions(8, 1, draw="shift")(12), torch.arange(12))  # longer than the range
    with pytest.raises(ValueError, match="unknown draw 'spread'; choose one of sorted, shift"):
        RandomPositions(8, draw="spread")


def _index(offset: int):
    return lambda n, device="cpu": torch.arange(n, device=device) + offset


@pytest.mark.parametrize("positions,decoder,kind", _kinds(SCHEMES + [("sinusoidal", ""), ("learned", ""),
                                                                     ("tupe-r", "")]))
def test_positions_index_of_the_slots_is_the_default(positions, decoder, kind):
    """An index 0 .. L-1 gives the forward without one; shifted by 5, the relative schemes (no absolute term)
    give it too, and the absolute ones do not."""
    torch.manual_seed(6)
    m = build_model(_cfg(positions, decoder, kind=kind), 20, 20).eval()
    src, sl = padded_batch([7, 4, 2], seed=8)
    tgt, tl = padded_batch([5, 6, 1], seed=9)
    with torch.no_grad():
        want = m(src, sl, tgt, tl).real()
        torch.testing.assert_close(m(src, sl, tgt, tl, positions=_index(0)).real(), want, rtol=1e-5, atol=1e-6)
        shifted = m(src, sl, tgt, tl, positions=_index(5)).real()
    relative = {positions, decoder or positions} <= {"relative", "alibi", "rotary", "none"}
    assert torch.allclose(shifted, want, rtol=1e-4, atol=1e-5) == relative


@pytest.mark.parametrize("positions,decoder,kind", _kinds(SCHEMES + [("sinusoidal", ""), ("tupe-r", "")]))
def test_random_positions_reach_every_kernel_alike(positions, decoder, kind):
    """Under one draw of randomised positions the graph (packed) and SDPA kernels give the dense one's states,
    and the draw changes them (the positions are read)."""
    torch.manual_seed(4)
    cfg = _cfg(positions, decoder, attention="dense", kind=kind)
    dense = build_model(cfg, 20, 20).eval()
    src, sl = padded_batch([9, 2, 5, 7, 1, 4, 6], seed=5)
    tgt, tl = padded_batch([7, 1, 4, 3, 2, 6, 5], seed=6)
    with torch.no_grad():
        want = dense(src, sl, tgt, tl, positions=RandomPositions(64, 1, 2, 0, 0)).real()
        assert not torch.allclose(want, dense(src, sl, tgt, tl).real(), atol=1e-4)
        for attention in ("sdpa", "graph"):
            other = build_model(dataclasses.replace(cfg, attention=attention), 20, 20).eval()
            other.load_state_dict(dense.state_dict())
            got = other(src, sl, tgt, tl, positions=RandomPositions(64, 1, 2, 0, 0)).real()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def test_random_positions_are_the_bias_of_the_drawn_positions():
    """ALiBi under an index: the bias the first layer adds is -m |p_i - p_j| at the drawn positions p."""
    torch.manual_seed(5)
    m = build_model(_cfg("alibi"), 20, 20).eval()
    src, sl = padded_batch([6], seed=1)
    index = RandomPositions(50, 3)(6)
    side = m.source(src, sl, index)
    distance = (index[:, None] - index[None, :]).abs().float()
    torch.testing.assert_close(side.bias[0], -alibi_slopes(4)[:, None, None] * distance)


def test_random_positions_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="train.random_positions.*max_positions=64.*at least 256"):
        Config.from_yaml("copy", ["model.positions=learned", "model.max_positions=64", "train.random_positions=256"])
    with pytest.raises(ConfigError, match="train.random_positions.*untie_first"):
        Config.from_yaml("copy", ["model.positions=tupe", "model.untie_first=true", "train.random_positions=64"])
    Config.from_yaml("copy", ["model.positions=relative", "train.random_positions=10000"])  # no table to outgrow


def test_training_with_random_positions_resumes_exactly(tmp_path):
    """Randomised positions are drawn from the seed and the update: a run stopped after 3 updates and resumed
    ends with the weights of an uninterrupted one; another seed draws others and ends elsewhere."""
    from tformer import load, train

    def cfg(steps, seed=1):
        c = tiny_config(positions="relative", relative_buckets=8, relative_max_distance=6)
        return dataclasses.replace(c, train=dataclasses.replace(c.train, random_positions=64, max_steps=steps,
                                                                epochs=100, seed=seed, log_every=1))

    def weights(run):
        return load(run, which="latest", device="cpu").model.state_dict()

    train(cfg(6), tmp_path / "whole")
    train(cfg(3), tmp_path / "part")
    train(cfg(6), tmp_path / "part", resume=True)
    whole, part = weights(tmp_path / "whole"), weights(tmp_path / "part")
    assert all(torch.equal(whole[k], part[k]) for k in whole)
    train(dataclasses.replace(cfg(6), train=dataclasses.replace(cfg(6).train, random_positions=0)), tmp_path / "off")
    off = weights(tmp_path / "off")
    assert not all(torch.equal(whole[k], off[k]) for k in whole)  # the draws changed the updates


def paper_sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Vaswani et al. 2017, section 3.5, written out: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same).
    positions (N,) -> (N, D) float64."""
    pe = torch.zeros(len(positions), d_model, dtype=torch.float64)
    for row, p in enumerate(positions.tolist()):
        for i in range(d_model // 2):
            angle = p / 10000.0 ** (2 * i / d_model)
            pe[row, 2 * i], pe[row, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


def test_the_length_recipe_trains_with_random_positions_and_reads_longer_inputs(tmp_path, monkeypatch):
    """copy_lengths (the study's best setting) trains on lengths <= 20 with positions drawn from 0..255, and its
    model decodes a 60-token input, three times longer than any it trained on, into letters. Oracles: the paper's
    sinusoids written out, for the position vectors training draws (some past 40) and for what the encoder reads
    of the 60-token input (all 60 tokens and </s>, at positions 0 .. 60: nothing cut, nothing clamped)."""
    import tformer.model.embeddings as embeddings
    from tformer import load, train

    cfg = Config.from_yaml("copy_lengths", ["train.max_steps=3", "train.eval_every=3", "data.train_size=500",
                                            "data.valid_size=20", "data.test_size=20", "train.threads=1"])
    assert (cfg.train.random_positions, cfg.train.random_draw, cfg.data.max_len) == (256, "sorted", 20)
    assert cfg.model.positions == "sinusoidal" and cfg.train.random_positions >= 10 * cfg.data.max_len
    D = cfg.model.d_model
    seen = []  # (positions (N,), vectors (N, D)) of the training batches' embeddings
    vectors = embeddings.position_vectors

    def recorded(module, positions):
        out = vectors(module, positions)
        if torch.is_grad_enabled() and isinstance(positions, torch.Tensor):  # a training batch's drawn positions
            seen.append((positions.detach().reshape(-1).cpu(), out.detach().reshape(-1, D).cpu()))  # (a GPU's too)
        return out

    monkeypatch.setattr(embeddings, "position_vectors", recorded)
    train(cfg, tmp_path / "run")
    monkeypatch.setattr(embeddings, "position_vectors", vectors)
    drawn = [int(p.max()) for p, _ in seen]  # the last position of each batch
    assert drawn and max(drawn) > 2 * cfg.data.max_len, drawn  # drawn well past the training lengths
    for p, got in seen:
        torch.testing.assert_close(got.double(), paper_sinusoids(p, D), rtol=0, atol=1e-5)

    t = load(tmp_path / "run", which="latest", device="cpu")
    letters = list("abcdefghij" * 6)
    read = []  # (ids, embeddings) of every source the encoder reads
    handle = t.model.src_embed.register_forward_hook(lambda m, args, out: read.append((args[0], out.x)))
    [out] = t.translate([" ".join(letters)])
    handle.remove()
    assert set(out.text.split()) <= set("abcdefghijklmnopqrstuvwxyz")
    [(ids, x)] = read  # (1, S), (1, S, D): one encoder call
    vocab = t.source_tokenizer.vocab
    assert ids[0].tolist() == [vocab.stoi[c] for c in letters] + [vocab.eos]  # the whole input, then </s>
    tokens = t.model.src_embed.tokens.weight.detach()[ids[0]].double()  # (S, D)
    want = tokens * math.sqrt(D) + paper_sinusoids(torch.arange(len(letters) + 1), D)  # (S, D)
    torch.testing.assert_close(x[0].double(), want, rtol=0, atol=1e-4)  # positions 21 .. 60 as the formula says
