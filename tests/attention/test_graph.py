"""The graph kernel against the dense kernel as oracle: outputs, gradients, weights, bias, dropout, empty nodes."""

import pytest
import torch

from tformer.attention.graph import graph_attention
from tformer.attention.kernels import dense_attention
from tformer.masks import Graph, bipartite_graph, graph_from_mask, padding_mask, self_graph
from tformer.structures import FULL, Structure

METHODS = ["segments", "blocks", "edges"]
H, Dh = 3, 8


def _qkv(B, T, S, dtype=torch.float64):
    make = lambda L: torch.randn(B, L, H, Dh, dtype=dtype).transpose(1, 2).requires_grad_()  # (B, H, L, Dh)
    return make(T), make(S), make(S)


def _block_mask(graph: Graph, B: int, T: int, S: int) -> torch.Tensor:
    """The graph's (B, T, S) mask when node b*T+t only meets nodes b*S+s (padded storage)."""
    return graph.dense().view(B, T, B, S)[torch.arange(B), :, torch.arange(B)]


def _dense_oracle(q, k, v, mask, bias=None):
    """Dense attention; rows without a key get 0 (the graph kernel's rule), never NaN."""
    rows = mask.any(-1, keepdim=True)  # (B, T, 1)
    safe = mask | ~rows  # give empty rows every key, then zero them
    out, w = dense_attention(q, k, v, mask=safe[:, None], bias=bias, need_weights=True)
    return out * rows[:, None], w * mask[:, None]


def _compare(q, k, v, graph, mask, method, bias_dense=None, bias_edges=None):
    want, want_w = _dense_oracle(q, k, v, mask, bias_dense)
    per_edge = method != "segments"
    got, got_w = graph_attention(q, k, v, mask=graph, method=method, bias=bias_edges, need_weights=per_edge)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    g = torch.randn_like(want)
    grads_want = torch.autograd.grad((want * g).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * g).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    if per_edge:  # weights per edge == the dense weights at that (query, key)
        B, _, T, S = want_w.shape
        qn, kn = graph.query, graph.key
        dense_at_edges = want_w.permute(0, 2, 3, 1)[qn // T, qn % T, kn % S]  # (E, H)
        torch.testing.assert_close(got_w, dense_at_edges, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["complete", "causal", "bipartite"])
def test_seed_graphs_equal_dense_attention(kind, method):
    for trial in range(3):
        B = 4
        lq = torch.randint(1, 9, (B,))
        lq[0] = 1  # a sentence of length 1, every time
        lk = lq if kind != "bipartite" else torch.randint(1, 9, (B,))
        T, S = int(lq.max()), int(lk.max())
        q, k, v = _qkv(B, T, S)
        if kind == "bipartite":
            graph = bipartite_graph(lq, lk, torch.arange(B) * T, torch.arange(B) * S, B * T, B * S)
        else:
            graph = self_graph(lq, FULL, causal=kind == "causal", offsets=torch.arange(B) * T, n_nodes=B * T)
        mask = padding_mask(lq, T)[:, :, None] & padding_mask(lk, S)[:, None, :]  # (B, T, S)
        if kind == "causal":
            mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
        assert torch.equal(_block_mask(graph, B, T, S), mask)  # the graph is the mask
        _compare(q, k, v, graph, mask, method)


def test_packed_batch_equals_padded_batch():
    """Packed (B = 1, no padding) graph attention gives the padded dense result at every real token."""
    lengths = torch.tensor([3, 1, 7, 5])
    B, L, N = 4, 7, int(lengths.sum())
    q, k, v = _qkv(B, L, L)
    real = padding_mask(lengths, L)  # (B, L)
    pack = lambda x: x.transpose(1, 2)[real][None].transpose(1, 2)  # (1, H, N, Dh)
    want, _ = dense_attention(q, k, v, mask=(real[:, None, :] & torch.ones(L, L, dtype=torch.bool).tril())[:, None])
    for method in METHODS:
        got, _ = graph_attention(pack(q), pack(k), pack(v), mask=self_graph(lengths, FULL, causal=True),
                                 method=method)
        assert got.shape == (1, H, N, Dh)
        torch.testing.assert_close(got, pack(want), atol=1e-12, rtol=1e-10)


STRUCTURES = [Structure(window=1), Structure(window=2, dilation=2), Structure(dilation=3),
              Structure(window=1, global_tokens=2), Structure(global_tokens=1, window=3)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("structure", STRUCTURES, ids=lambda s: s.describe())
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_structures_equal_dense_with_the_equivalent_mask(structure, causal, method):
    lengths = torch.tensor([9, 1, 12, 5])
    B, L = 4, 12
    q, k, v = _qkv(B, L, L)
    graph = self_graph(lengths, structure, causal, offsets=torch.arange(B) * L, n_nodes=B * L)
    real = padding_mask(lengths, L)
    mask = real[:, :, None] & real[:, None, :] & structure.mask(L, causal)  # (B, L, L)
    assert torch.equal(_block_mask(graph, B, L, L), mask)
    _compare(q, k, v, graph, mask, method)


def test_structure_patterns():
    w = Structure(window=2).mask(6)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(w, (i - j).abs() <= 2)
    i9, j9 = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    assert torch.equal(Structure(window=2, dilation=2).mask(9), ((i9 - j9).abs() <= 4) & ((i9 - j9) % 2 == 0))
    g = Structure(window=1, global_tokens=2).mask(6)
    assert torch.equal(g, ((i - j).abs() <= 1) | (i < 2) | (j < 2))
    assert torch.equal(Structure(window=1).mask(6, causal=True), ((i - j) <= 1) & (j <= i))
    # a decoding step sees the last row of the causal pattern
    for s in STRUCTURES:
        for t in range(7):
            assert torch.equal(s.row(t), s.mask(t + 1, causal=True)[t].nonzero()[:, 0])
    # edges grow linearly in length for a window
    assert Structure(window=4).edges(4096).shape[0] == 9 * 4096 - 2 * (1 + 2 + 3 + 4)


def test_user_edge_lists_from_a_file_and_a_function(tmp_path):
    f = tmp_path / "edges.txt"
    f.write_text("# query key\n0 0\n1 0\n2 1\n2 2\n5 4\n", encoding="utf-8")
    s = Structure(edges_from=str(f))
    assert s.edges(3).tolist() == [[0, 0], [1, 0], [2, 1], [2, 2]]  # pairs past the length are dropped
    assert Structure(edges_from="test_graph:_every_other").edges(4).tolist() == [[0, 0], [2, 0], [2, 2]]
    # the file's graph == dense attention with the file's mask; node 1 and 3.. have no edges: zeros
    lengths = torch.tensor([6, 3])
    q, k, v = _qkv(2, 6, 6)
    graph = self_graph(lengths, s, False, offsets=torch.arange(2) * 6, n_nodes=12)
    real = padding_mask(lengths, 6)
    mask = real[:, :, None] & real[:, None, :] & s.mask(6)
    for method in METHODS:
        _compare(q, k, v, graph, mask, method)


def _every_other(length):
    return [(i, j) for i in range(0, length, 2) for j in range(0, i + 1, 2)]


@pytest.mark.parametrize("text, message", [("0 0\n1 x\n", "edges.txt:2: expected two non-negative integers"),
                                           ("# nothing\n", "has no edges")])
def test_bad_edge_files_say_where(tmp_path, text, message):
    from tformer.config import StructureConfig
    from tformer.structures import build_structure

    f = tmp_path / "edges.txt"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        build_structure(StructureConfig(edges=str(f)))
    with pytest.raises(ValueError, match="cannot import"):
        build_structure(StructureConfig(edges="no_such_module_xyz:fn"))
    with pytest.raises(ValueError, match="does not exist"):
        build_structure(StructureConfig(edges=str(tmp_path / "missing.txt")))


@pytest.mark.parametrize("method", METHODS)
def test_node_without_incoming_edges_gets_zeros_not_nan(method):
    mask = torch.tensor([[[True, False, True], [False, False, False], [False, True, False]]])  # (1, 3, 3)
    graph = graph_from_mask(mask)
    if method == "segments":  # the same graph as one segment whose pattern leaves query 1 empty
        from tformer.masks import Segments

        pairs = mask[0].nonzero()
        one = torch.tensor([3])
        graph = Graph(3, 3, segments=Segments(torch.tensor([0]), one, torch.tensor([0]), one, lambda a, b: pairs))
    q, k, v = _qkv(1, 3, 3)
    out, _ = graph_attention(q, k, v, mask=graph, method=method)
    assert torch.all(out[:, :, 1] == 0) and not out.isnan().any()
    out.sum().backward()
    assert not any(t.grad.isnan().any() for t in (q, k, v))
    _compare(*_qkv(1, 3, 3), graph, mask, method)


@pytest.mark.parametrize("method", ["blocks", "edges"])
def test_per_edge_bias_equals_dense_bias(method):
    lengths = torch.tensor([5, 2, 8])
    B, L = 3, 8
    q, k, v = _qkv(B, L, L)
    graph = self_graph(lengths, Structure(window=2), True, offsets=torch.arange(B) * L, n_nodes=B * L)
    bias_dense = torch.randn(B, H, L, L, dtype=torch.float64)
    qn, kn = graph.query, graph.key
    bias_edges = bias_dense.permute(0, 2, 3, 1)[qn // L, qn % L, kn % L].clone().requires_grad_()  # (E, H)
    real = padding_mask(lengths, L)
    mask = real[:, :, None] & real[:, None, :] & Structure(window=2).mask(L, True)
    _compare(q, k, v, graph, mask, method, bias_dense=bias_dense, bias_edges=bias_edges)
    out, _ = graph_attention(q, k, v, mask=graph, bias=bias_edges, method=method)
    (grad,) = torch.autograd.grad(out.sum(), bias_edges)  # a learned bias (TUPE) gets gradients
    assert grad.abs().sum() > 0


def test_auto_method_picks_segments_for_sentences_and_blocks_for_long_windows():
    from tformer.attention.graph import choose_method

    assert choose_method(self_graph(torch.tensor([12, 30, 7]), FULL, causal=True)) == "segments"
    assert choose_method(self_graph(torch.tensor([2048]), Structure(window=16), causal=False)) == "blocks"
    scattered = graph_from_mask(torch.rand(1, 300, 300) < 0.01)
    assert choose_method(scattered) == "edges"
    # with a per-edge bias or weights, the segments method steps aside
    assert choose_method(self_graph(torch.tensor([12, 30]), FULL, causal=True), per_edge=True) == "blocks"


@pytest.mark.parametrize("method", METHODS)
def test_attention_dropout_drops_edges_and_rescales(method):
    """With one-hot values the output row is the (dropped) weight row: entries are 0 or w / (1 - p)."""
    L, p = 64, 0.5
    graph = self_graph(torch.tensor([L]), FULL, causal=False)
    q, k = torch.randn(1, 1, L, L), torch.randn(1, 1, L, L)
    v = torch.eye(L)[None, None]  # value of key j = e_j
    want, _ = dense_attention(q, k, v)  # (1, 1, L, L): the weights themselves
    torch.manual_seed(3)
    got, _ = graph_attention(q, k, v, mask=graph, dropout_p=p, method=method)
    kept = got != 0
    torch.testing.assert_close(got[kept], want[kept] / (1 - p))
    assert 0.4 < 1 - kept.float().mean().item() < 0.6


def test_impossible_shapes_fail_clearly():
    graph = self_graph(torch.tensor([3, 2]), FULL, causal=False)  # 5 nodes
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="5 query and 5 key nodes, but the inputs have 1 x 6"):
        graph_attention(q, q, q, mask=graph)
    with pytest.raises(ValueError, match="needs a Graph"):
        graph_attention(q, q, q, mask=torch.ones(6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="bias must be"):
        graph_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5], mask=graph, bias=torch.zeros(3, 2))
