"""TUPE (positions as an attention bias) and the continuous-feature front end.

Oracles: the paper's formulas written out per head with plain loops, T5's bucket arithmetic worked by hand,
the dense kernel for the graph kernel, the full forward for step-by-step decoding.
"""

import math

import pytest
import torch

from helpers.search import run_beam, run_greedy
from tformer.attention.graph import graph_attention
from tformer.attention.kernels import dense_attention
from tformer.config import ConfigError, ModelConfig
from tformer.masks import PositionBias, bipartite_graph, packed_positions, padding_mask, self_graph
from tformer.model import build_model
from tformer.model.embeddings import stack_frames
from tformer.positions import RelativeBias, TupeBias, relative_bucket
from tformer.structures import FULL, Structure


def _cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, ffn_dropout=0.0, positions="tupe")
    base.update(kw)
    return ModelConfig(**base)


def _batch(lengths, vocab=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    ids = torch.randint(4, vocab, (len(lengths), int(lengths.max())), generator=g)
    return ids.masked_fill(~padding_mask(lengths), 0), lengths


# --------------------------------------------------------------------------- the bias


def test_bias_is_the_papers_formula_per_head():
    torch.manual_seed(0)
    D, H, L = 32, 4, 7
    m = TupeBias(D, H, max_positions=16)
    torch.nn.init.normal_(m.norm.weight)
    torch.nn.init.normal_(m.q_proj.bias)
    got = m(L, L)  # (H, L, L)
    Dh = D // H
    p = torch.nn.functional.layer_norm(m.table.weight[:L], (D,), m.norm.weight, m.norm.bias)
    u_q, u_k = p @ m.q_proj.weight.T + m.q_proj.bias, p @ m.k_proj.weight.T + m.k_proj.bias  # (L, D)
    for h in range(H):
        for i in range(L):
            for j in range(L):
                want = torch.dot(u_q[i, h * Dh:(h + 1) * Dh], u_k[j, h * Dh:(h + 1) * Dh]) / math.sqrt(2 * Dh)
                assert torch.allclose(got[h, i, j], want, atol=1e-5)


def test_zero_position_projections_leave_content_scores_scaled_by_sqrt_2d():
    torch.manual_seed(1)
    cfg = _cfg(encoder_layers=1)
    m = build_model(cfg, 20, 20).eval()
    for proj in (m.src_bias.q_proj, m.src_bias.k_proj):
        torch.nn.init.zeros_(proj.weight)
        torch.nn.init.zeros_(proj.bias)
    src, lengths = _batch([6, 4])
    assert torch.equal(m.src_bias(6, 6), torch.zeros(4, 6, 6))
    enc = m.encode(src, lengths, need_weights=True)
    x = m.src_embed(src).x  # no positions in the embeddings
    assert torch.allclose(x, m.src_embed.tokens(src) * math.sqrt(32))
    attn = m.encoder.layers[0].self_attn
    q, k, _ = attn.in_proj(x).chunk(3, -1)
    q, k = (t.view(2, 6, 4, 8).transpose(1, 2) for t in (q, k))  # (B, H, S, Dh)
    scores = q @ k.transpose(-1, -2) / math.sqrt(2 * 8)
    scores = scores.masked_fill(~padding_mask(lengths)[:, None, None, :], float("-inf"))
    torch.testing.assert_close(enc.attentions[0], scores.softmax(-1))


def test_bias_shapes_and_decoding_rows():
    torch.manual_seed(2)
    m = TupeBias(32, 4, max_positions=64, untie_first=True, relative=RelativeBias(4, 8, 16, bidirectional=False))
    full = m(10, 10)
    assert full.shape == (4, 10, 10)
    assert m(3, 10).shape == (4, 3, 10)
    for t in range(10):  # a decoding step's row equals the row of the whole-sequence table
        torch.testing.assert_close(m(1, t + 1, q_offset=t), full[:, t : t + 1, : t + 1])


def test_untied_first_token_replaces_row_and_column_only():
    torch.manual_seed(3)
    tied = TupeBias(32, 4, max_positions=16, relative=RelativeBias(4, 8, 16, True))
    untied = TupeBias(32, 4, max_positions=16, untie_first=True, relative=RelativeBias(4, 8, 16, True))
    untied.load_state_dict({**tied.state_dict(), "first": torch.tensor([[1.0, 2, 3, 4], [-1.0, -2, -3, -4]])})
    a, b = tied(6, 6), untied(6, 6)
    assert torch.equal(b[:, 1:, 1:], a[:, 1:, 1:])
    assert torch.equal(b[:, 0, :], torch.tensor([1.0, 2, 3, 4])[:, None].expand(4, 6))  # [0, 0] is the row's
    assert torch.equal(b[:, 1:, 0], torch.tensor([-1.0, -2, -3, -4])[:, None].expand(4, 5))
    b.sum().backward()
    assert untied.first.grad is not None and torch.all(untied.first.grad > 0)


@pytest.mark.parametrize("relative,bucket", [
    (0, 0), (-1, 1), (-7, 7), (-8, 8), (-11, 8), (-12, 9), (-16, 10), (-64, 14), (-127, 15), (-128, 15),
    (-5000, 15), (1, 17), (7, 23), (8, 24), (12, 25), (16, 26), (200, 31),
])
def test_bidirectional_buckets_on_known_distances(relative, bucket):
    # T5's scheme, 32 buckets, max distance 128: 16 per direction, distances < 8 exact, then
    # 8 + floor(log(d / 8) / log(128 / 8) * 8), capped at 15; keys after the query offset by 16
    assert relative_bucket(torch.tensor([relative]), True, 32, 128).item() == bucket


@pytest.mark.parametrize("relative,bucket", [
    (0, 0), (-15, 15), (-16, 16), (-31, 16 + int(math.log(31 / 16) / math.log(8) * 16)), (-32, 21),
    (-127, 31), (-128, 31), (-10**6, 31), (5, 0),
])
def test_causal_buckets_on_known_distances(relative, bucket):
    # causal: all 32 buckets look back; distances < 16 exact; later keys (masked anyway) share bucket 0
    assert relative_bucket(torch.tensor([relative]), False, 32, 128).item() == bucket


def test_relative_term_depends_on_distance_only():
    rel = RelativeBias(2, 8, 20, bidirectional=True)
    pos = torch.arange(30)
    table = rel(pos, pos)  # (2, 30, 30)
    for d in (-25, -3, 0, 4, 29):
        diag = torch.diagonal(table, offset=d, dim1=1, dim2=2)  # entries with key - query = d
        assert torch.all(diag == diag[:, :1])


def test_config_rejects_impossible_relative_settings():
    with pytest.raises(ConfigError, match="relative_max_distance"):
        ModelConfig(relative_buckets=32, relative_max_distance=10)


# --------------------------------------------------------------------------- graph kernel == dense kernel


@pytest.mark.parametrize("method", ["segments", "blocks", "edges"])
@pytest.mark.parametrize("causal", [False, True])
def test_positional_bias_through_graph_kernel_equals_dense(method, causal):
    torch.manual_seed(4)
    lengths = torch.tensor([5, 1, 9, 9, 3])
    B, H, Dh, L = len(lengths), 4, 8, int(lengths.max())
    table = torch.randn(H, L, L, dtype=torch.float64, requires_grad=True)
    q, k, v = (torch.randn(B, H, L, Dh, dtype=torch.float64, requires_grad=True) for _ in range(3))
    real = padding_mask(lengths)
    mask = real[:, None, None, :] & (torch.ones(L, L, dtype=torch.bool).tril() if causal else True)
    mask = mask | (~real[:, None, :, None] & torch.eye(L, dtype=torch.bool))  # padding rows see themselves
    want, _ = dense_attention(q, k, v, mask, table[None], scale=0.3)
    pack = lambda x: x.transpose(1, 2)[real][None].transpose(1, 2)  # (1, H, N, Dh)  # noqa: E731
    graph = self_graph(lengths, FULL, causal=causal)
    got, _ = graph_attention(pack(q), pack(k), pack(v), graph, PositionBias(table), scale=0.3, method=method)
    torch.testing.assert_close(got, pack(want), rtol=1e-10, atol=1e-10)
    g_want = torch.autograd.grad(pack(want).sum(), (q, table))
    g_got = torch.autograd.grad(got.sum(), (q, table))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_edge_positions_of_segment_graphs():
    lengths = torch.tensor([3, 2])
    g = self_graph(lengths, Structure(window=1), causal=False)
    pq, pk = g.local_positions()
    pos = packed_positions(lengths)
    assert torch.equal(pq, pos[g.query]) and torch.equal(pk, pos[g.key])
    cross = bipartite_graph(torch.tensor([2, 1]), torch.tensor([3, 4]))
    pq, pk = cross.local_positions()
    assert torch.equal(pq, packed_positions(torch.tensor([2, 1]))[cross.query])
    assert torch.equal(pk, packed_positions(torch.tensor([3, 4]))[cross.key])


@pytest.mark.parametrize("positions", ["tupe", "tupe-r"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_tupe_model_graph_equals_dense(positions, norm):
    torch.manual_seed(5)
    cfg = _cfg(positions=positions, norm=norm, untie_first=True, relative_buckets=8, relative_max_distance=6)
    dense = build_model(cfg, 20, 20)
    graph = build_model(ModelConfig(**{**cfg.__dict__, "attention": "graph"}), 20, 20)
    graph.load_state_dict(dense.state_dict())
    src, sl = _batch([7, 3, 12], seed=1)
    tgt, tl = _batch([4, 9, 2], seed=2)
    a = dense(src, sl, tgt, tl).real()
    b = graph(src, sl, tgt, tl).real()
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # a random projection, not a.pow(2).sum(): behind a post-norm LayerNorm the sum of squares is nearly
    # constant, its gradients nearly cancel, and float32 leaves ~3% noise in them (float64 agrees to 1e-14)
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3))
    ga = torch.autograd.grad((a * w).sum(), list(dense.parameters()), allow_unused=True)
    gb = torch.autograd.grad((b * w).sum(), list(graph.parameters()), allow_unused=True)
    for (name, _), x, y in zip(dense.named_parameters(), ga, gb):
        assert (x is None) == (y is None) == (name == "generator.bias"), name  # the generator is not applied
        if x is not None:
            torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=name)
    assert dense.src_bias.relative is not None or positions == "tupe"
    assert ga[[n for n, _ in dense.named_parameters()].index("src_bias.first")].abs().sum() > 0


@pytest.mark.parametrize("attention", ["dense", "sdpa", "graph"])
def test_tupe_decoding_steps_equal_the_full_forward(attention):
    torch.manual_seed(6)
    cfg = _cfg(positions="tupe-r", untie_first=True, relative_buckets=8, relative_max_distance=5,
               attention=attention)
    m = build_model(cfg, 20, 20).eval()
    src, sl = _batch([6, 8], seed=3)
    tgt, tl = _batch([9, 9], seed=4)
    with torch.no_grad():
        full = m.generator(m(src, sl, tgt, tl).padded())  # (B, T, V)
        cache = m.init_cache(m.encode(src, sl))
        for t in range(9):
            logits, cache = m.decode_step(tgt[:, t], cache)
            torch.testing.assert_close(logits, full[:, t], rtol=1e-4, atol=1e-5)


def test_tupe_beam_and_greedy_same_on_graph_and_dense():
    torch.manual_seed(7)
    cfg = _cfg(positions="tupe-r", decoder_positions="tupe", relative_buckets=8, relative_max_distance=5)
    dense = build_model(cfg, 20, 20).eval()
    graph = build_model(ModelConfig(**{**cfg.__dict__, "attention": "graph"}), 20, 20).eval()
    graph.load_state_dict(dense.state_dict())
    src, sl = _batch([6, 9, 2], seed=5)
    limit = torch.tensor([8, 8, 8])
    with torch.no_grad():
        outs = []
        for m in (dense, graph):
            cache = m.init_cache(m.encode(src, sl))
            outs.append((run_greedy(m.decode_step, cache, limit),
                         run_beam(m.decode_step, cache, limit, 3, 0.6, nbest=3)))
    assert outs[0][0].tokens == outs[1][0].tokens
    assert outs[0][1].tokens == outs[1][1].tokens
    for x, y in zip(outs[0][1].scores, outs[1][1].scores):
        assert x == pytest.approx(y, abs=1e-4)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi"])
def test_sequences_longer_than_every_table_run(positions):
    torch.manual_seed(8)
    cfg = _cfg(positions=positions, max_positions=16, relative_buckets=8, relative_max_distance=8)
    m = build_model(cfg, 20, 20).eval()
    src, sl = _batch([70, 40], seed=6)
    tgt, tl = _batch([50, 20], seed=7)
    out = m(src, sl, tgt, tl).real()
    assert out.shape == (70, 32) and torch.isfinite(out).all()


# --------------------------------------------------------------------------- the frame front end


def test_stacking_arithmetic_by_hand():
    frames = torch.arange(10.0)[None, :, None]  # (1, 10, 1): frame i holds the value i
    out, counts = stack_frames(frames, torch.tensor([10]), stack=4, skip=3)
    # ceil(10 / 3) = 4 model frames starting at 0, 3, 6, 9; the last repeats frame 9 past the end
    assert counts.tolist() == [4]
    assert out[0].tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9], [9, 9, 9, 9]]
    out, counts = stack_frames(torch.randn(2, 7, 80), torch.tensor([7, 5]), stack=4, skip=3)
    assert out.shape == (2, 3, 320) and counts.tolist() == [3, 2]  # the source's 4 x 80 -> 320


def test_stacking_never_reads_padding():
    frames = torch.arange(12.0).view(1, 12, 1).repeat(2, 1, 1)
    frames[1, 5:] = 1000.0  # padding of the second utterance (5 real frames)
    out, counts = stack_frames(frames, torch.tensor([12, 5]), stack=3, skip=2)
    assert counts.tolist() == [6, 3]
    assert out[1, :3].tolist() == [[0, 1, 2], [2, 3, 4], [4, 4, 4]]


@pytest.mark.parametrize("positions", ["sinusoidal", "tupe-r"])
@pytest.mark.parametrize("attention", ["sdpa", "graph"])
def test_frame_encoder_masks_come_from_frame_counts(positions, attention):
    torch.manual_seed(9)
    cfg = _cfg(source="features", feature_dim=6, frame_stack=3, frame_skip=2, positions=positions,
               attention=attention, relative_buckets=8, relative_max_distance=6)
    m = build_model(cfg, 4, 20).eval()
    frames = torch.randn(3, 11, 6)
    counts = torch.tensor([11, 4, 7])
    frames[1, 4:], frames[2, 7:] = 50.0, -50.0  # padding: must not matter
    enc = m.encode(frames, counts)
    assert enc.mask.tolist() == padding_mask(torch.tensor([6, 2, 4]), 6).tolist()
    alone = [m.encode(frames[i : i + 1, : counts[i]], counts[i : i + 1]) for i in range(3)]
    memory = enc.memory[0] if enc.packed else enc.memory[enc.mask]
    torch.testing.assert_close(memory, torch.cat([a.memory[0, : int(a.mask.sum())] for a in alone]),
                               rtol=1e-5, atol=1e-5)


def test_frame_encoder_rejects_wrong_shapes():
    m = build_model(_cfg(source="features", feature_dim=6), 4, 20)
    with pytest.raises(ValueError, match="model.feature_dim=6"):
        m.encode(torch.randn(2, 5, 7), torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="float frames"):
        m.encode(torch.ones(2, 5, dtype=torch.long), torch.tensor([5, 5]))


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi"])
def test_long_feature_sequence_beyond_every_table_runs(positions):
    torch.manual_seed(10)
    cfg = _cfg(source="features", feature_dim=80, frame_stack=4, frame_skip=3, positions=positions,
               max_positions=64, relative_buckets=16, relative_max_distance=32)
    m = build_model(cfg, 4, 20).eval()
    with torch.no_grad():
        enc = m.encode(torch.randn(1, 3000, 80), torch.tensor([3000]))  # 1000 model frames, table of 64
    assert enc.memory.shape == (1, 1000, 32) and torch.isfinite(enc.memory).all()
