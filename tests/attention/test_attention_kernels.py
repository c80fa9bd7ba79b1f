"""The attention package's contracts against independent oracles: the kernels by name and their errors; the
dense kernel against softmax(q k^T scale + bias) v written out; which path SDPA takes (a spy on torch's op);
multi-head attention (scale, dropout, rotary, caches, projections) against its formula from the weights; the
key/value buffer against concatenation and an allocation count; the graph kernel's plans and choices against
hand arithmetic, and every kernel's tensors on its inputs' device (conftest's meta-device oracle).

Notation: B batch, H heads, T queries, S keys, Dh head dim, D model dim, E edges."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from helpers.models import assert_follows_input_device
from tformer.attention import KERNELS, MultiHeadAttention, dense_attention, get_kernel, sdpa_attention
from tformer.attention import kernels as kernels_module
from tformer.attention.graph import graph_attention
from tformer.attention.kvbuffer import KVBuffer
from tformer.dropout import dropout
from tformer.masks import causal_mask

# ------------------------------------------------------------------------------------------ the registry


def test_kernels_by_name_and_an_unknown_name_lists_the_choices():
    assert get_kernel("dense") is dense_attention
    assert get_kernel("sdpa") is sdpa_attention
    assert get_kernel("graph") is graph_attention
    assert list(KERNELS) == ["dense", "sdpa", "graph"]
    with pytest.raises(ValueError, match=r"^unknown attention kernel 'flash'; choose one of dense, sdpa, graph$"):
        get_kernel("flash")
    with pytest.raises(ValueError, match=r"^unknown attention kernel 'flash'; choose one of dense, sdpa, graph$"):
        MultiHeadAttention(16, 4, kernel="flash")


def test_impossible_head_counts_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"^d_model=30 is not divisible by n_heads=4$"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match=r"^n_heads=4 is not a multiple of kv_heads=3$"):
        MultiHeadAttention(24, 4, kv_heads=3)


# ------------------------------------------------------------------------------------------ dense and SDPA


def _by_hand(q, k, v, mask=None, bias=None, scale=None):
    """softmax(q . k * scale + bias) v, one query row at a time, float64 loops: (out, weights)."""
    B, H, T, Dh = q.shape
    S = k.shape[2]
    scale = 1 / math.sqrt(Dh) if scale is None else scale
    out, weights = torch.zeros(B, H, T, Dh, dtype=torch.float64), torch.zeros(B, H, T, S, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                s = torch.tensor([float((q[b, h, t] * k[b, h, j]).sum()) * scale for j in range(S)],
                                 dtype=torch.float64)
                if bias is not None:
                    s = s + bias.expand(B, H, T, S)[b, h, t]
                allowed = torch.ones(S, dtype=torch.bool) if mask is None else mask.expand(B, H, T, S)[b, h, t]
                e = torch.where(allowed, torch.exp(s - s[allowed].max()), torch.zeros(()))
                weights[b, h, t] = e / e.sum()
                out[b, h, t] = (weights[b, h, t, :, None] * v[b, h]).sum(0)
    return out, weights


@pytest.mark.parametrize("kernel", [dense_attention, sdpa_attention])
@pytest.mark.parametrize("n_queries,B", [(1, 2), (8, 2), (9, 2), (12, 2), (1, 16), (4, 16), (9, 16), (1, 48)])  # either
def test_kernels_are_softmax_of_scaled_scores_plus_bias_written_out(kernel, n_queries, B):  # side of SDPA_CPU_*
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, 3, L, 4, dtype=torch.float64, generator=g) for L in (n_queries, 6, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2] * (B // 2))[:, None, None, :]  # (B, 1, 1, S)
    bias = torch.randn(1, 3, n_queries, 6, dtype=torch.float64, generator=g)
    for kwargs in ({}, {"scale": 0.3}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias, "scale": 2.0}):
        want, want_w = _by_hand(q, k, v, **kwargs)
        got, w = kernel(q, k, v, **kwargs)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        assert w is None  # weights only on request
        got, w = kernel(q, k, v, **kwargs, need_weights=True)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", [dense_attention, sdpa_attention])
def test_kernel_dropout_drops_weights_and_rescales_the_rest(kernel):
    """With one-hot values (v_j = e_j) each output row is its dropped weight row: 0 or w / (1 - p)."""
    L, p = 64, 0.5
    q, k = torch.randn(1, 1, L, L), torch.randn(1, 1, L, L)
    v = torch.eye(L)[None, None]
    want, _ = _by_hand(q.double(), k.double(), v.double())
    got, _ = kernel(q, k, v, dropout_p=p)
    kept = got != 0
    torch.testing.assert_close(got[kept].double(), want[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    assert 0.4 < 1 - kept.float().mean().item() < 0.6


class _SdpaSpy:
    """Records the calls of torch's scaled_dot_product_attention (and makes them)."""

    def __init__(self, monkeypatch):
        self.calls, self._real = [], F.scaled_dot_product_attention
        monkeypatch.setattr(F, "scaled_dot_product_attention", self)

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self._real(*args, **kwargs)


def test_sdpa_leaves_few_unmasked_queries_weights_and_cpu_dropout_to_the_dense_kernel(monkeypatch):
    """On a CPU: fewer than 9 queries without a mask (a decoding step) over at least 128 rows x heads, weights on
    request, or dropout run as the dense kernel's matmuls; anything else calls torch's fused op (a step of
    one sentence, or a few, too)."""
    spy = _SdpaSpy(monkeypatch)
    k = v = torch.randn(64, 3, 5, 4)  # 64 rows x 3 heads: 192 >= 128
    mask = torch.ones(64, 1, 1, 5, dtype=torch.bool)

    def calls(T, rows=64, **kwargs):
        spy.calls.clear()
        sdpa_attention(torch.randn(rows, 3, T, 4), k[:rows], v[:rows], **kwargs)
        return len(spy.calls)

    assert calls(8) == 0 and calls(1) == 0
    assert calls(9) == 1 and calls(30) == 1
    assert calls(1, rows=43) == 0 and calls(1, rows=42) == 1 and calls(8, rows=2) == 1  # 129 and 126 rows x heads
    assert calls(1, mask=mask) == 1 and calls(8, rows=2, mask=mask[:2]) == 1  # a mask: SDPA at any length (but folded)
    assert calls(12, need_weights=True) == 0 and calls(12, mask=mask, need_weights=True) == 0
    assert calls(12, dropout_p=0.1) == 0 and calls(12, mask=mask, dropout_p=1e-3) == 0
    assert calls(12, dropout_p=0.0) == 1


def test_a_reduced_precision_step_over_few_rows_sums_in_float64_through_sdpa(monkeypatch):
    """bf16 on a CPU sums attention in float64 (sums_in_fp64): over a step's few rows x heads through SDPA's one
    call, given float64, its result rounded once, equal to the dense kernel's; over many rows, the dense kernel."""
    spy = _SdpaSpy(monkeypatch)
    g = torch.Generator().manual_seed(3)
    for rows, mask in ((2, None), (2, torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]),
                       (64, None)):
        q = torch.randn(rows, 3, 1, 4, generator=g).bfloat16()
        k, v = (torch.randn(rows, 3, 5, 4, generator=g, dtype=torch.float64) for _ in "kv")  # a step's fp64 cache
        bias = torch.randn(1, 3, 1, 5, generator=g)
        spy.calls.clear()
        with torch.inference_mode():  # (sums_in_fp64: at inference)
            got, _ = sdpa_attention(q, k, v, mask=mask, bias=bias)
            want, _ = dense_attention(q, k, v, mask=mask, bias=bias)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
        assert len(spy.calls) == (rows < 43)  # 2 x 3 rows x heads: SDPA; 64 x 3: the dense kernel
        if spy.calls:
            assert spy.calls[0]["attn_mask"].dtype == torch.float64


def test_sdpa_off_the_cpu_hands_torch_the_mask_bias_dropout_and_scale(monkeypatch):
    """Off a CPU (the meta device here: shapes only) even one query and dropout go to torch's op, which gets
    the dropout probability, the scale, and the bias with -inf where the mask forbids."""
    spy = _SdpaSpy(monkeypatch)
    q, k, v = (torch.randn(2, 3, L, 4, device="meta") for L in (1, 5, 5))
    out, w = sdpa_attention(q, k, v, dropout_p=0.25, scale=0.5)
    assert out.shape == (2, 3, 1, 4) and w is None
    assert len(spy.calls) == 1
    assert spy.calls[0]["dropout_p"] == 0.25 and spy.calls[0]["scale"] == 0.5 and spy.calls[0]["attn_mask"] is None
    # the bias and mask are combined on the CPU, where values can be read
    bias = torch.randn(2, 3, 1, 5)
    mask = torch.tensor([True, True, False, True, False])[None, None, None].expand(2, 1, 1, 5)
    spy.calls.clear()
    sdpa_attention(*(torch.randn(2, 3, L, 4) for L in (9, 5, 5)), mask=mask, bias=bias.expand(2, 3, 9, 5))
    got = spy.calls[0]["attn_mask"]
    want = torch.where(mask, bias, torch.tensor(float("-inf")))
    assert torch.equal(got, want.expand(2, 3, 9, 5))
    spy.calls.clear()
    sdpa_attention(*(torch.randn(2, 3, L, 4) for L in (9, 5, 5)), mask=mask)
    assert spy.calls[0]["attn_mask"] is mask
    spy.calls.clear()
    sdpa_attention(*(torch.randn(2, 3, L, 4) for L in (9, 5, 5)), bias=bias)
    assert spy.calls[0]["attn_mask"] is bias


# ------------------------------------------------------------------------------------------ multi-head attention


def _heads(x, width):
    """(B, L, n * width) -> (B, n, L, width)."""
    return x.view(x.shape[0], x.shape[1], -1, width).transpose(1, 2)


def _mha_by_formula(mha, x, memory=None, k_given=None, v_given=None, mask=None, rotate=None, rotate_keys=True,
                    drop=None, bias=None):
    """out_proj(concat_h softmax(q_h k_g(h)^T * scale + bias) v_g(h)) with q, k, v from the in-projection's
    rows; `rotate` applied to the queries (and to the projected keys when rotate_keys); `drop` to the weights."""
    D, H, Dh, G = mha.d_model, mha.n_heads, mha.head_dim, mha.kv_heads
    W, b = mha.in_proj.weight, mha.in_proj.bias
    source = x if memory is None else memory
    q = _heads(x @ W[:D].T + b[:D], Dh)  # (B, H, T, Dh)
    k = _heads(source @ W[D:D + G * Dh].T + b[D:D + G * Dh], Dh) if k_given is None else k_given
    v = _heads(source @ W[D + G * Dh:].T + b[D + G * Dh:], Dh) if v_given is None else v_given
    if rotate is not None:
        q = rotate(q)
        k = rotate(k) if rotate_keys else k
    group = torch.arange(H) // (H // G)  # the key/value head of each query head
    k, v = k[:, group], v[:, group]  # (B, H, S, Dh)
    scale = 1 / math.sqrt(Dh) if mha.scale is None else mha.scale
    scores = q @ k.transpose(-1, -2) * scale + (0 if bias is None else bias)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, -1)
    out = (w if drop is None else drop(w)) @ v  # (B, H, T, Dh)
    return mha.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], D)), w


def _turn(x):
    """A stand-in for RoPE: any fixed, position-dependent map of (..., L, Dh) that is not the identity."""
    L, Dh = x.shape[-2:]
    return x.flip(-1) * (1 + torch.arange(L, dtype=x.dtype)[:, None] * torch.arange(Dh, dtype=x.dtype) / 10)


@pytest.mark.parametrize("kv_heads", [0, 2])
@pytest.mark.parametrize("kernel", ["dense", "sdpa"])
def test_multi_head_attention_is_its_formula_with_scale_mask_weights_and_rotary(kernel, kv_heads):
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 4, kernel=kernel, scale=0.3, kv_heads=kv_heads).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = causal_mask(5)[None, None]
    got = mha(x, mask=mask, need_weights=True)
    want, want_w = _mha_by_formula(mha, x, mask=mask)
    torch.testing.assert_close(got.out, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.weights, want_w, rtol=1e-5, atol=1e-6)
    assert mha(x).weights is None
    bias = torch.randn(1, 4, 5, 5)  # (1, H, T, S), a positional bias
    torch.testing.assert_close(mha(x, mask=mask, bias=bias).out, _mha_by_formula(mha, x, mask=mask, bias=bias)[0],
                               rtol=1e-5, atol=1e-6)
    # rotary: self-attention turns queries and keys, and the keys come back turned (what a cache keeps)
    got = mha(x, rotary=_turn)
    torch.testing.assert_close(got.out, _mha_by_formula(mha, x, rotate=_turn)[0], rtol=1e-5, atol=1e-6)
    W, b, D = mha.in_proj.weight, mha.in_proj.bias, 16
    G = mha.kv_heads
    torch.testing.assert_close(got.kv[0], _turn(_heads(x @ W[D:D + G * 4].T + b[D:D + G * 4], 4)))
    torch.testing.assert_close(got.kv[1], _heads(x @ W[D + G * 4:].T + b[D + G * 4:], 4))
    # cross-attention (memory, or keys given whole): the queries alone are turned
    got = mha(x, memory=memory, rotary=_turn)
    torch.testing.assert_close(got.out, _mha_by_formula(mha, x, memory, rotate=_turn, rotate_keys=False)[0],
                               rtol=1e-5, atol=1e-6)
    k, v = torch.randn(2, G, 3, 4), torch.randn(2, G, 3, 4)
    got = mha(x, static_kv=(k, v), rotary=_turn)
    want = _mha_by_formula(mha, x, k_given=k, v_given=v, rotate=_turn, rotate_keys=False)[0]
    torch.testing.assert_close(got.out, want, rtol=1e-5, atol=1e-6)
    assert got.kv[0] is k and got.kv[1] is v


@pytest.mark.parametrize("kernel", ["dense", "sdpa"])
def test_attention_dropout_in_training_only(kernel):
    """Evaluation ignores the dropout rate; training drops the weights with tformer.dropout (same seed, same
    mask) and rescales the rest."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 4, dropout=0.5, kernel=kernel)
    x = torch.randn(2, 9, 16)
    mha.eval()
    torch.testing.assert_close(mha(x).out, _mha_by_formula(mha, x)[0], rtol=1e-5, atol=1e-6)
    mha.train()
    torch.manual_seed(5)
    got = mha(x).out
    torch.manual_seed(5)
    want = _mha_by_formula(mha, x, drop=lambda w: dropout(w, 0.5))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, _mha_by_formula(mha, x)[0], atol=1e-3)
    default = MultiHeadAttention(16, 4).train()  # no dropout unless asked for
    torch.testing.assert_close(default(x).out, _mha_by_formula(default, x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [0, 1])
def test_cached_steps_equal_the_causal_forward_with_tuple_and_buffer_caches(kv_heads):
    torch.manual_seed(3)
    mha = MultiHeadAttention(16, 4, kernel="dense", kv_heads=kv_heads).eval()
    x = torch.randn(3, 6, 16)
    full = mha(x, mask=causal_mask(6)[None, None]).out  # (B, T, D)
    past, buffer = None, KVBuffer(x, capacity=2)
    for t in range(6):
        a = mha(x[:, t:t + 1], past=past)
        b = mha(x[:, t:t + 1], past=buffer)
        torch.testing.assert_close(a.out[:, 0], full[:, t], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.out[:, 0], full[:, t], rtol=1e-5, atol=1e-6)
        assert b.kv is buffer and a.kv[0].shape == (3, mha.kv_heads, t + 1, 4)
        assert torch.equal(a.kv[0], buffer.keys) and torch.equal(a.kv[1], buffer.values)
        past = a.kv
    # two positions at once after a cached prefix: the tuple cache is concatenated along the positions
    prefix = mha(x[:, :4], mask=causal_mask(4)[None, None]).kv
    rest = mha(x[:, 4:], past=prefix, mask=causal_mask(6)[None, None, 4:])
    torch.testing.assert_close(rest.out, full[:, 4:], rtol=1e-5, atol=1e-6)


def test_projection_parts_are_the_in_projections_rows_also_in_int8():
    """"q" is rows [0, D), "kv" rows [D, D + 2 G Dh), "qkv" all of them; after int8 quantisation each part is
    close to its float rows, and the float matrix is gone."""
    torch.manual_seed(4)
    mha = MultiHeadAttention(16, 4, kv_heads=2).eval()  # D = 16, G Dh = 8
    x = torch.randn(2, 5, 16)
    W, b = mha.in_proj.weight.detach().clone(), mha.in_proj.bias.detach().clone()
    rows = {"q": slice(0, 16), "kv": slice(16, 32), "qkv": slice(0, 32)}
    want = {part: x @ W[r].T + b[r] for part, r in rows.items()}
    for part in rows:
        torch.testing.assert_close(mha.project(x, part), want[part], rtol=1e-5, atol=1e-6)
    k, v = mha.project_kv(x)
    torch.testing.assert_close(k, _heads(want["kv"][..., :8], 4))
    torch.testing.assert_close(v, _heads(want["kv"][..., 8:], 4))
    float_out = mha(x).out
    mha.quantize_int8()
    assert not hasattr(mha, "in_proj")
    for part in rows:
        got = mha.project(x, part)
        assert got.shape == want[part].shape
        assert (got - want[part]).abs().max() < 0.05 and not torch.equal(got, want[part])
    assert (mha(x).out - float_out).abs().max() < 0.05


# ------------------------------------------------------------------------------------------ the key/value buffer


def _counting(like: torch.Tensor) -> list[int]:
    """Make `like.new_empty` record the size of every allocation; returns the record."""
    sizes, real = [], like.new_empty

    def new_empty(numel, **kwargs):
        sizes.append(numel)
        return real(numel, **kwargs)

    like.new_empty = new_empty
    return sizes


def test_kv_buffer_allocates_only_when_it_grows_and_doubles_its_capacity():
    """A step writes in place and a reorder gathers into the second buffer: after the first reorder nothing is
    allocated until the capacity (2, then 4, 8, ...) is full. Each allocation holds capacity x 2 x N x H x Dh.
    Nothing is resized behind its back (torch warns when an `out=` tensor has the wrong shape)."""
    warnings.simplefilter("error")
    g = torch.Generator().manual_seed(0)
    N, H, Dh = 3, 2, 4
    like = torch.empty(0)
    sizes = _counting(like)
    buf, ref = KVBuffer(like, capacity=2), None
    for step in range(9):
        k, v = torch.randn(N, H, 1, Dh, generator=g), torch.randn(N, H, 1, Dh, generator=g)
        ref = (k, v) if ref is None else (torch.cat([ref[0], k], 2), torch.cat([ref[1], v], 2))
        buf.append(k, v)
        keys, values = buf  # the buffer unpacks as (keys, values)
        assert torch.equal(keys, ref[0]) and torch.equal(values, ref[1])
        rows = torch.randperm(N, generator=g)
        buf.reorder(rows)
        ref = (ref[0][rows], ref[1][rows])
        assert torch.equal(buf.keys, ref[0]) and torch.equal(buf.values, ref[1])
        assert buf.data.shape == (step + 1, 2, N, H, Dh)
    unit = 2 * N * H * Dh
    # capacity 2: the store and the reorder's store; grown at t = 2, 4, 8: one new store and, at the next
    # reorder, its twin
    assert [s // unit for s in sizes if s] == [2, 2, 4, 4, 8, 8, 16, 16]
    assert all(s % unit == 0 for s in sizes)


def test_kv_buffer_default_capacity_and_row_changes():
    like = torch.empty(0, dtype=torch.float64)
    sizes = _counting(like)
    buf = KVBuffer(like)
    k = torch.randn(2, 1, 1, 3, dtype=torch.float64)
    assert buf.reorder(torch.tensor([1, 0])) is buf and buf.t == 0  # nothing yet: nothing to reorder
    buf.append(k, -k)
    assert [s for s in sizes if s] == [16 * 2 * 2 * 3]  # room for 16 positions
    assert buf.keys.dtype == torch.float64
    buf.reorder(torch.tensor([1, 1, 0]))  # a hypothesis repeated: 3 rows from 2
    assert buf.rows == 3 and torch.equal(buf.keys, k[[1, 1, 0]]) and torch.equal(buf.values, -k[[1, 1, 0]])
    k2 = torch.randn(3, 1, 1, 3, dtype=torch.float64)
    keys, values = buf.append(k2, 2 * k2)
    assert torch.equal(keys, torch.cat([k[[1, 1, 0]], k2], 2)) and torch.equal(values, torch.cat([-k[[1, 1, 0]], 2 * k2], 2))


def test_kv_buffer_follows_its_inputs_device():
    g = torch.Generator().manual_seed(1)
    ks = [torch.randn(2, 2, 1, 3, generator=g) for _ in range(3)]
    like, rows = torch.empty(0), torch.tensor([1, 0, 1])

    def run():
        buf = KVBuffer(like, capacity=2)
        buf.append(ks[0], ks[0])
        buf.append(ks[1], ks[1])
        buf.reorder(rows[:2])
        buf.append(ks[2], ks[2])
        buf.reorder(rows)
        return buf.keys, buf.values

    assert_follows_input_device(run)


# ------------------------------------------------------------------------------------------ the graph kernel

from tformer.attention.graph import (block_size, best_plan, choose_method, plan_blocks,  # noqa: E402
                                     segment_plan)
from tformer.masks import Graph, PositionBias, Segments, bipartite_graph, graph_from_mask  # noqa: E402
from tformer.structures import FULL  # noqa: E402

METHODS = ["segments", "blocks", "edges"]


def _pairs(rows):
    """(E, 2) int64 position pairs, made on the CPU whatever the default device."""
    return torch.tensor(rows, dtype=torch.long, device="cpu").view(-1, 2)


def _lower_but_row_1(lq: int, lk: int) -> torch.Tensor:
    """Causal pairs, except that query 1 sees no key: a pattern with an empty row."""
    return _pairs([(i, j) for i in range(lq) for j in range(min(i + 1, lk)) if i != 1])


def _edges(n_queries, n_keys, pairs):
    """A graph from an edge list [(query, key), ...] (no segments)."""
    p = _pairs(pairs)
    return Graph(n_queries, n_keys, p[:, 0].contiguous(), p[:, 1].contiguous())


def _dense_oracle(q, k, v, graph, bias=None):
    """Dense attention over the graph's (B T, Bk S) mask, rows without an edge 0: (out (B, H, T, Dh),
    weights (B, H, T, S) at the edges)."""
    B, H, T, Dh = q.shape
    Bk, _, S, _ = k.shape
    mask = graph.dense()  # (B T, Bk S)
    qn = q.transpose(1, 2).reshape(1, B * T, H, Dh).transpose(1, 2)  # (1, H, B T, Dh): every node at once
    kn, vn = (x.transpose(1, 2).reshape(1, Bk * S, H, Dh).transpose(1, 2) for x in (k, v))
    rows = mask.any(-1, keepdim=True)
    out, w = dense_attention(qn, kn, vn, mask=(mask | ~rows)[None, None], bias=bias, need_weights=True)
    out = out * rows
    return out.transpose(1, 2).reshape(B, T, H, Dh).transpose(1, 2), w[0]


def _qkv(B, T, S, Bk=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    Bk = B if Bk is None else Bk
    return (torch.randn(n, 2, L, 4, dtype=dtype, generator=g) for n, L in ((B, T), (Bk, S), (Bk, S)))


def test_graph_kernel_errors_say_what_is_wrong():
    graph = bipartite_graph(torch.tensor([3, 2]), torch.tensor([2, 2]))  # 5 query, 4 key nodes, 10 edges
    q, k, v = _qkv(1, 5, 4)
    with pytest.raises(ValueError, match=r"^the graph kernel needs a Graph as its structure \(tformer\.masks\), "
                                         r"got Tensor$"):
        graph_attention(q, k, v, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^the graph kernel needs a Graph .*, got NoneType$"):
        graph_attention(q, k, v)
    with pytest.raises(ValueError, match=r"^graph has 5 query and 4 key nodes, but the inputs have 1 x 5 queries "
                                         r"and 2 x 4 keys$"):
        graph_attention(q, *list(_qkv(2, 4, 4))[1:], mask=graph)
    with pytest.raises(ValueError, match=r"^graph has 5 query and 4 key nodes, but the inputs have 1 x 4 queries "
                                         r"and 1 x 4 keys$"):
        graph_attention(q[:, :, :4], k, v, mask=graph)
    with pytest.raises(ValueError, match=r"^positional bias has 3 heads, the inputs 2$"):
        graph_attention(q, k, v, mask=graph, bias=PositionBias(torch.zeros(3, 4, 5)))
    with pytest.raises(ValueError, match=r"^graph bias must be \(edges, heads\) = \(10, 2\), got \(10, 3\)$"):
        graph_attention(q, k, v, mask=graph, bias=torch.zeros(10, 3))
    message = r"^the segments method needs a graph built from segments, and no per-edge bias or weights$"
    with pytest.raises(ValueError, match=message):
        graph_attention(q, k, v, mask=graph, bias=torch.zeros(10, 2, dtype=torch.float64), method="segments")
    with pytest.raises(ValueError, match=message):
        graph_attention(q, k, v, mask=graph, need_weights=True, method="segments")
    with pytest.raises(ValueError, match=message):
        graph_attention(q, k, v, mask=_edges(5, 4, [(0, 0)]), method="segments")
    with pytest.raises(ValueError, match=r"^unknown graph method 'dense'; choose auto, segments, blocks or edges$"):
        graph_attention(q, k, v, mask=graph, method="dense")


@pytest.mark.parametrize("method", ["auto", "blocks", "edges"])
def test_graph_weights_bias_and_scale_against_dense_on_hypotheses_against_their_memory(method):
    """Six hypotheses (B = 6) against three sentences' memory (Bk = 3, two hypotheses each), a per-edge bias
    and a scale: outputs and per-edge weights are the dense kernel's at the graph's mask; weights only when
    asked for."""
    q, k, v = _qkv(6, 2, 5, Bk=3, seed=1)
    lengths = torch.tensor([5, 3, 4])
    hyp = torch.arange(6) // 2  # the sentence of each hypothesis
    graph = bipartite_graph(torch.full((6,), 2), lengths[hyp], torch.arange(6) * 2, hyp * 5, 12, 15)
    bias_dense = torch.randn(12, 15, 2, dtype=torch.float64)  # (query node, key node, head)
    bias = bias_dense[graph.query, graph.key]  # (E, H)
    for scale in (None, 0.7):
        want, want_w = _dense_oracle(q * (1 if scale is None else scale * 2), k, v, graph,
                                     bias=bias_dense.permute(2, 0, 1)[None])  # scale: 1/sqrt(4) by default
        got, w = graph_attention(q, k, v, mask=graph, bias=bias, scale=scale, method=method, need_weights=True)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(w, want_w[:, graph.query, graph.key].t(), rtol=1e-10, atol=1e-12)
        got, w = graph_attention(q, k, v, mask=graph, bias=bias, scale=scale, method=method)
        assert w is None
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_graph_kernel_follows_its_inputs_device(method):
    lengths = torch.tensor([3, 1, 5, 0])
    B, L = 4, 5
    q, k, v = _qkv(B, L, L, dtype=torch.float32, seed=2)
    offsets = torch.arange(B) * L
    table = torch.randn(2, L, L)
    packed = [x.transpose(1, 2)[torch.arange(L)[None] < lengths[:, None]][None].transpose(1, 2)
              for x in (q, k, v)]  # (1, H, N, Dh)

    def full():  # padded storage: each sentence a complete block
        return Graph(B * L, B * L, segments=Segments(offsets, lengths, offsets, lengths))

    def patterned():  # packed sentences under a pattern with an empty row
        o = torch.cumsum(lengths, 0) - lengths
        return Graph(9, 9, segments=Segments(o, lengths, o, lengths, _lower_but_row_1))

    for make, qkv in ((full, (q, k, v)), (patterned, packed)):
        assert_follows_input_device(lambda: graph_attention(*qkv, mask=make(), method=method))
        assert_follows_input_device(lambda: graph_attention(*qkv, mask=make(), method=method,
                                                            bias=PositionBias(table), scale=0.5))
        if method != "segments":
            assert_follows_input_device(lambda: graph_attention(*qkv, mask=make(), method=method,
                                                                need_weights=True))
    if method != "segments":  # an edge list whose query blocks need 4, 2 and 1 key blocks: three groups
        q3, k3, v3 = _qkv(1, 24, 32, dtype=torch.float32, seed=3)
        pairs = [(0, 0), (0, 8), (0, 16), (1, 24), (8, 0), (9, 8), (16, 0)]
        bias = torch.randn(7, 2)
        assert_follows_input_device(lambda: graph_attention(q3, k3, v3, mask=_edges(24, 32, pairs), bias=bias,
                                                            method=method, need_weights=True))


def test_block_size_is_the_power_of_two_nearest_half_the_keys_per_query():
    """b in (8, 16, 32, 64) nearest (in log2) to max(1, E / Nq / 2)."""
    cases = {(4, 2): 8, (1, 22): 8, (1, 24): 16, (1, 32): 16, (2, 64): 32, (1, 64): 32, (1, 90): 32,
             (1, 100): 64, (1, 256): 64, (3, 1024): 64}
    for (n_queries, keys), b in cases.items():
        graph = graph_from_mask(torch.ones(n_queries, keys, dtype=torch.bool))  # E = Nq x keys
        assert block_size(graph) == b, (n_queries, keys)
    assert block_size(_edges(0, 5, [])) == 8  # no queries: the smallest


def test_block_plans_group_query_blocks_by_need_within_a_factor_of_two():
    """Query blocks (b = 8) needing 4, 2 and 1 key blocks make three groups (2 is not more than half of 4), each
    padded to its need: 8 x (32 + 16 + 8) score entries; blocks needing 3 and 2 share one group of 3."""
    pairs = [(0, 0), (0, 8), (0, 16), (1, 24), (8, 0), (9, 8), (16, 0)]
    plan = plan_blocks(_edges(24, 32, pairs), 8)
    assert (plan.b, plan.n_qb, plan.n_kb, plan.cost) == (8, 3, 4, 8 * (32 + 16 + 8))
    assert [tuple(g.k_blocks.shape) for g in plan.groups] == [(1, 1), (1, 2), (1, 4)]
    assert [g.q_blocks.tolist() for g in plan.groups] == [[2], [1], [0]]
    assert [g.k_blocks.tolist() for g in plan.groups] == [[[0]], [[0, 1]], [[0, 1, 2, 3]]]
    assert [g.edge_ids.tolist() for g in plan.groups] == [[6], [4, 5], [0, 1, 2, 3]]
    assert all(g.empty is not None for g in plan.groups)  # rows 2..7 of each block have no edge
    assert plan.groups[2].empty.view(-1).tolist() == [False, False] + [True] * 6
    # positions of each edge in its group's (G, b, M) scores, and the additive mask: 0 there, -1e30 elsewhere
    assert plan.groups[2].edge_pos.tolist() == [0, 8, 16, 32 + 24]
    additive = plan.groups[2].additive.view(-1)
    assert additive.shape == (8 * 32,) and torch.all((additive == 0) | (additive == -1e30))
    assert (additive == 0).nonzero()[:, 0].tolist() == [0, 8, 16, 56]
    # needs 3 and 2: one group of both blocks (G = n_qb: all query blocks, all edges), padded to 3
    pairs = [(q, 8 * kb) for q in range(8) for kb in range(3)] + [(8 + q, 8 * kb) for q in range(8) for kb in range(2)]
    plan = plan_blocks(_edges(16, 24, pairs), 8)
    assert plan.cost == 2 * 8 * 24 and len(plan.groups) == 1
    (g,) = plan.groups
    assert g.q_blocks is None and g.edge_ids is None and g.empty is None
    assert g.k_blocks.tolist() == [[0, 1, 2], [0, 1, 3]]  # slot 3 of block 1 pads with the all-zero block n_kb = 3
    # needs 8, 4 and 3: 8 alone; then 4 is the largest left, and 3 (more than half of 4) joins it
    needs = [(0, 8 * kb) for kb in range(8)] + [(8, 8 * kb) for kb in range(4)] + [(16, 8 * kb) for kb in range(3)]
    plan = plan_blocks(_edges(24, 64, needs), 8)
    assert [(g.q_blocks.tolist(), tuple(g.k_blocks.shape)) for g in plan.groups] == [([1, 2], (2, 4)), ([0], (1, 8))]
    assert plan.cost == 2 * 8 * 32 + 8 * 64
    # one group of the first query block only: the second has no edge (its outputs 0)
    plan = plan_blocks(_edges(16, 8, [(0, 0), (1, 1), (1, 5)]), 8)
    assert len(plan.groups) == 1 and plan.groups[0].q_blocks.tolist() == [0] and plan.groups[0].edge_ids is None
    q, k, v = _qkv(1, 16, 8, seed=6)
    got = graph_attention(q, k, v, mask=_edges(16, 8, [(0, 0), (1, 1), (1, 5)]), method="blocks")[0]
    torch.testing.assert_close(got, _dense_oracle(q, k, v, _edges(16, 8, [(0, 0), (1, 1), (1, 5)]))[0],
                               rtol=1e-10, atol=1e-12)
    assert torch.all(got[:, :, 2:] == 0)
    # the kernel on these plans is exact
    q, k, v = _qkv(1, 16, 24, seed=4)
    want, _ = _dense_oracle(q, k, v, _edges(16, 24, pairs))
    torch.testing.assert_close(graph_attention(q, k, v, mask=_edges(16, 24, pairs), method="blocks")[0], want,
                               rtol=1e-10, atol=1e-12)


def test_choose_method_at_its_thresholds():
    """Segments while they compute at most 4 score entries per edge; else blocks while their plan computes at
    most 16 entries per edge; else edges (and edges for a graph without any)."""
    diagonal = lambda lq, lk: _pairs([(i, i) for i in range(min(lq, lk))])  # noqa: E731
    one = lambda n: torch.tensor([n])  # noqa: E731
    four_by_five = Graph(4, 5, segments=Segments(one(0), one(4), one(0), one(5), lambda lq, lk: _pairs(
        [(0, 0), (1, 1), (2, 2), (3, 3), (3, 4)])))  # 20 entries, 5 edges: exactly 4 per edge
    assert choose_method(four_by_five) == "segments"
    five_by_five = Graph(5, 5, segments=Segments(one(0), one(5), one(0), one(5), diagonal))  # 25 > 4 x 5
    assert choose_method(five_by_five) == "blocks"  # one 8 x 8 tile: 64 <= 16 x 5
    # one query block against 17 key blocks of 8: 8 x 136 = 1088 entries, = 16 x 68 edges
    pairs = [(q, 8 * kb + q) for kb in range(17) for q in range(4)]
    assert choose_method(_edges(8, 136, pairs)) == "blocks"
    assert choose_method(_edges(8, 136, pairs[:-1])) == "edges"  # 1088 > 16 x 67
    assert choose_method(_edges(3, 3, [])) == "edges"
    assert choose_method(bipartite_graph(torch.tensor([2, 3]), torch.tensor([4, 4]))) == "segments"
    assert choose_method(bipartite_graph(torch.tensor([2, 3]), torch.tensor([4, 4])), per_edge=True) == "blocks"


def test_plans_are_made_once_per_graph_and_shared():
    graph = bipartite_graph(torch.tensor([2, 3]), torch.tensor([4, 1]))
    assert segment_plan(graph) is segment_plan(graph)
    assert best_plan(graph) is best_plan(graph)
    assert choose_method(graph) == choose_method(graph) == "segments"
    assert choose_method(graph, True) == "blocks"
    assert {"segments", "blocks"} <= set(graph.plans)


def test_segment_plans_are_views_for_consecutive_sentences_and_indices_otherwise():
    packed = segment_plan(bipartite_graph(torch.tensor([3, 3, 3, 2]), torch.tensor([4, 4, 4, 1])))
    assert [(g.lq, g.lk, g.q_rows, g.k_rows) for g in packed.groups] == [(2, 1, (9, 1), (12, 1)),
                                                                       (3, 4, (0, 3), (0, 3))]
    assert packed.order.tolist() == [9, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8]  # groups in shape order
    assert (packed.entries, packed.edges) == (2 * 1 + 3 * 12, 2 * 1 + 3 * 12)
    in_order = segment_plan(bipartite_graph(torch.tensor([3, 3]), torch.tensor([4, 4])))
    assert in_order.order is None and in_order.groups[0].q_rows == (0, 2) and in_order.groups[0].mask is None
    padded = segment_plan(Graph(8, 8, segments=Segments(torch.tensor([0, 4]), torch.tensor([3, 3]),
                                                        torch.tensor([0, 4]), torch.tensor([3, 3]),
                                                        _lower_but_row_1)))
    (g,) = padded.groups
    assert g.q_rows.tolist() == [[0, 1, 2], [4, 5, 6]] and torch.equal(g.k_rows, g.q_rows)
    assert padded.order.tolist() == [0, 1, 2, 4, 5, 6]
    assert g.mask.tolist() == [[True, False, False], [True, False, False], [True, True, True]]  # row 1: placeholder
    assert g.empty.tolist() == [False, True, False]
    assert (padded.entries, padded.edges) == (18, 2 * 4)
    # two shapes under the pattern: 2 x 2 (1 pair, row 1 empty) and two 3 x 3 (4 pairs each)
    o, lengths = torch.tensor([0, 3, 5]), torch.tensor([3, 2, 3])
    mixed = segment_plan(Graph(8, 8, segments=Segments(o, lengths, o, lengths, _lower_but_row_1)))
    assert [(g.lq, g.lk) for g in mixed.groups] == [(2, 2), (3, 3)]
    assert (mixed.entries, mixed.edges) == (4 + 2 * 9, 1 + 2 * 4)
    assert mixed.order.tolist() == [3, 4, 0, 1, 2, 5, 6, 7]


@pytest.mark.parametrize("method", METHODS)
def test_sentences_without_keys_or_queries_get_zeros(method):
    """Cross-attention where a sentence has no keys (its queries get 0) or no queries, on every method."""
    lq, lk = torch.tensor([2, 0, 3, 1]), torch.tensor([3, 2, 0, 2])
    graph = bipartite_graph(lq, lk, torch.arange(4) * 3, torch.arange(4) * 3, 12, 12)
    q, k, v = _qkv(4, 3, 3, seed=5)
    want, _ = _dense_oracle(q, k, v, graph)
    got, _ = graph_attention(q, k, v, mask=graph, method=method)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.all(got[2] == 0) and torch.all(got[0, :, 2] == 0)
    # under a pattern, a sentence without keys is never handed to it
    lower = lambda a, b: _pairs([(i, j) for i in range(a) for j in range(min(i + 1, b))])  # noqa: E731
    patterned = Graph(12, 12, segments=Segments(torch.arange(4) * 3, lq, torch.arange(4) * 3, lk, lower))
    got, _ = graph_attention(q, k, v, mask=patterned, method=method)
    torch.testing.assert_close(got, _dense_oracle(q, k, v, patterned)[0], rtol=1e-10, atol=1e-12)
    assert torch.all(got[2] == 0)
    # no sentence has a key: every output 0 (the segments method once failed on its empty list of shapes)
    graph = bipartite_graph(lq, torch.zeros(4, dtype=torch.long), torch.arange(4) * 3, torch.arange(4) * 3, 12, 12)
    got, _ = graph_attention(q, k, v, mask=graph, method=method)
    assert got.shape == q.shape and torch.all(got == 0)


def test_auto_runs_segments_unless_values_per_edge_are_involved(monkeypatch):
    """auto: the segments method for sentences, also with a positional bias (a block of it per shape); blocks
    or edges when a per-edge bias or the weights are involved, or when the queries are not positions 0.. of
    their sentences (a decoding step's restricted graph), where a positional bias is gathered per edge."""
    import tformer.attention.graph as graph_module

    ran = []
    for name in ("segment_attention", "block_attention", "edge_attention"):
        real = getattr(graph_module, name)
        monkeypatch.setattr(graph_module, name, lambda *a, _real=real, _name=name, **kw: (ran.append(_name),
                                                                                            _real(*a, **kw))[1])

    def method(*args, **kwargs):
        ran.clear()
        out = graph_attention(*args, **kwargs)
        assert len(ran) == 1
        return ran[0].split("_")[0], out

    lengths = torch.tensor([5, 3])
    o = torch.tensor([0, 5])
    table = torch.randn(2, 5, 5, dtype=torch.float64)
    q, k, v = (x.transpose(1, 2).reshape(1, 10, 2, 4).transpose(1, 2) for x in _qkv(2, 5, 5, seed=7))  # (1, H, 10, Dh)
    q, k, v = q[:, :, :8], k[:, :, :8], v[:, :, :8]  # packed: sentences of 5 and 3
    sentences = lambda: Graph(8, 8, segments=Segments(o, lengths, o, lengths))  # noqa: E731
    assert method(q, k, v, mask=sentences())[0] == "segment"
    assert method(q, k, v, mask=sentences(), bias=PositionBias(table))[0] == "segment"
    assert method(q, k, v, mask=sentences(), need_weights=True)[0] == "block"
    assert method(q, k, v, mask=sentences(), bias=PositionBias(table), need_weights=True)[0] == "block"
    assert method(q, k, v, mask=sentences(), bias=torch.zeros(34, 2, dtype=torch.float64))[0] == "block"
    # the queries at positions 1 and 4 of the first sentence and 2 of the second, against their sentences
    rows = torch.tensor([1, 4, 7])
    step = sentences().restrict(rows)
    assert not step.aligned
    name, (got, _) = method(q[:, :, rows], k, v, mask=step, bias=PositionBias(table))
    assert name in ("block", "edge")
    position = torch.tensor([1, 4, 2])
    mask = torch.tensor([[True] * 5 + [False] * 3] * 2 + [[False] * 5 + [True] * 3])  # (3, 8)
    key_position = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    bias = table[:, position][:, :, key_position]  # (H, 3, 8)
    want, _ = _by_hand(q[:, :, rows], k, v, mask=mask[None, None], bias=bias[None], scale=0.5)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_graph_kernel_subtracts_the_maximum_score_large_scores_stay_finite(method):
    """float32 scores near 200 (exp overflows past 88): the softmax is still exact."""
    q, k, v = (x.float() for x in _qkv(2, 5, 5, seed=8))
    lengths = torch.tensor([5, 3])
    graph = bipartite_graph(lengths, lengths, torch.tensor([0, 5]), torch.tensor([0, 5]), 10, 10)
    scale = 200 / float((q.double() @ k.double().transpose(-1, -2)).abs().max())
    want, _ = _dense_oracle(q.double() * scale * 2, k.double(), v.double(), graph)
    got, _ = graph_attention(q, k, v, mask=graph, method=method, scale=scale)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_the_three_executions_called_directly_default_to_scale_1_no_dropout_no_weights():
    """edge_attention, block_attention and segment_attention on flattened nodes (N, H, Dh): scale 1 and no
    dropout unless given; blocks returns weights only when asked."""
    from tformer.attention.graph import block_attention, edge_attention, segment_attention

    lengths = torch.tensor([3, 5])
    graph = bipartite_graph(lengths, lengths)  # packed: 8 query and 8 key nodes
    q, k, v = _qkv(1, 8, 8, seed=9)
    want, want_w = _dense_oracle(q * 2, k, v, graph)  # the oracle's scale is 1/sqrt(4): 2 q makes it 1
    nodes = lambda x: x[0].transpose(0, 1)  # noqa: E731  (1, H, N, Dh) -> (N, H, Dh)
    want, want_w = nodes(want), want_w[:, graph.query, graph.key].t()
    out, w = edge_attention(nodes(q), nodes(k), nodes(v), graph)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)
    out, w = block_attention(nodes(q), nodes(k), nodes(v), graph, best_plan(graph))
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    assert w is None
    out = segment_attention(nodes(q), nodes(k), nodes(v), segment_plan(graph))
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)


def test_an_empty_batch_gives_an_empty_output():
    none = torch.zeros(0, dtype=torch.long)
    q = torch.randn(1, 2, 0, 4)
    out, _ = graph_attention(q, q, q, mask=bipartite_graph(none, none))
    assert out.shape == (1, 2, 0, 4)


@pytest.mark.parametrize("method", METHODS[1:])
def test_queries_after_the_last_one_with_keys_get_zeros(method):
    """The last query blocks hold no edge at all (trailing positions that read nothing): their outputs are 0 and
    the rest equal the dense oracle, on the edge-list methods."""
    pairs = [(i, j) for i in range(10) for j in range(8) if (i + j) % 3]  # queries 0-9 read keys; 10-39 none
    graph = _edges(40, 8, pairs)
    q, k, v = _qkv(1, 40, 8, seed=7)
    want, _ = _dense_oracle(q, k, v, graph)
    got, _ = graph_attention(q, k, v, mask=graph, method=method)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.all(got[:, :, 10:] == 0)
