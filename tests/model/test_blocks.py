"""Modern blocks as options: RMSNorm, gated FFNs (SwiGLU, GEGLU), QK-norm, grouped-query and multi-query attention.
Oracles: their formulas written out from first principles (and torch.nn.RMSNorm where this torch has it),
multi-head attention with the key/value heads copied per group, the uncached forward, the dense kernel, each
sentence alone; defaults unchanged."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.models import assert_kernels_and_batching_agree, assert_steps_equal_full_forward, padded_batch
from tformer.api import build_model
from tformer.attention import MultiHeadAttention
from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.export import check_exportable
from tformer.model.layers import FeedForward
from tformer.norms import RMSNorm

pytestmark = pytest.mark.device

OPTIONS = [dict(norm_layer="rmsnorm"), dict(norm_layer="rmsnorm", norm="pre"), dict(ffn="glu", activation="silu"),
           dict(ffn="glu", activation="gelu"), dict(qk_norm=True),
           dict(kv_heads=1), dict(kv_heads=2),
           dict(norm_layer="rmsnorm", norm="pre", ffn="glu", activation="silu", qk_norm=True, kv_heads=2)]


def _cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, d_ff=48, encoder_layers=2, decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, ffn_dropout=0.0)
    return ModelConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------ the formulas


def test_rmsnorm_is_its_formula_and_torchs():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    torch.testing.assert_close(norm(x.float()).double(), want, rtol=1e-6, atol=1e-6)
    if hasattr(torch.nn, "RMSNorm"):  # torch >= 2.4
        theirs = torch.nn.RMSNorm(16, eps=1e-6)
        theirs.load_state_dict(norm.state_dict())
        torch.testing.assert_close(norm(x.float()), theirs(x.float()))


@pytest.mark.parametrize("activation, act", [("silu", lambda z: z * torch.sigmoid(z)),
                                             ("gelu", lambda z: 0.5 * z * (1 + torch.erf(z / math.sqrt(2))))])
def test_gated_ffn_is_shazeers_formula(activation, act):
    """FFN_GLU(x) = (act(x W + b) * (x V + c)) W2 + b2: SwiGLU with swish, GEGLU with gelu."""
    torch.manual_seed(1)
    ffn = FeedForward(8, 12, activation, 0.0, glu=True)
    x = torch.randn(2, 3, 8)
    W, V = ffn.linear1.weight[:12], ffn.linear1.weight[12:]
    b, c = ffn.linear1.bias[:12], ffn.linear1.bias[12:]
    want = (act(x @ W.T + b) * (x @ V.T + c)) @ ffn.linear2.weight.T + ffn.linear2.bias
    torch.testing.assert_close(ffn(x), want, rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in ffn.parameters()) == 8 * 24 + 24 + 12 * 8 + 8


def test_qk_norm_attention_is_its_formula():
    """softmax((rms(q) g_q) . (rms(k) g_k) / sqrt(Dh)) v per head, q, k, v from the in-projection."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 4, kernel="dense", qk_norm=True).eval()
    with torch.no_grad():
        mha.q_norm.weight.normal_()
        mha.k_norm.weight.normal_()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)

    def heads(t):  # (B, L, D) -> (B, H, L, Dh)
        return t.view(t.shape[0], t.shape[1], 4, 4).transpose(1, 2)

    def rms(t, g):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    W, b = mha.in_proj.weight, mha.in_proj.bias
    for kv_from in (x, memory):  # self-attention, cross-attention
        q = rms(heads(x @ W[:16].T + b[:16]), mha.q_norm.weight)
        k = rms(heads(kv_from @ W[16:32].T + b[16:32]), mha.k_norm.weight)
        v = heads(kv_from @ W[32:].T + b[32:])
        out = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v  # sqrt(Dh) = 2
        want = mha.out_proj(out.transpose(1, 2).reshape(2, 5, 16))
        got = mha(x) if kv_from is x else mha(x, memory)
        torch.testing.assert_close(got.out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_attention_is_multi_head_with_each_groups_keys_copied(kv_heads):
    """G key/value heads = multi-head attention whose key and value heads h are copies of the G heads' h // (H/G);
    with G = H it is multi-head attention itself."""
    torch.manual_seed(6)
    gqa = MultiHeadAttention(16, 4, kernel="dense", kv_heads=kv_heads).eval()
    mha = MultiHeadAttention(16, 4, kernel="dense").eval()
    group, Dh = 4 // kv_heads, 4
    with torch.no_grad():
        W, b = gqa.in_proj.weight, gqa.in_proj.bias
        kw, kb = W[16:16 + kv_heads * Dh], b[16:16 + kv_heads * Dh]
        vw, vb = W[16 + kv_heads * Dh:], b[16 + kv_heads * Dh:]
        copies = torch.arange(4).div(group, rounding_mode="floor")  # the key/value head of each query head
        rows = (copies[:, None] * Dh + torch.arange(Dh)).reshape(-1)  # (H Dh,)
        mha.in_proj.weight.copy_(torch.cat([W[:16], kw[rows], vw[rows]]))
        mha.in_proj.bias.copy_(torch.cat([b[:16], kb[rows], vb[rows]]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    for args in ((x,), (x, memory)):
        got, want = gqa(*args, mask=mask if len(args) == 1 else None), mha(*args, mask=mask if len(args) == 1 else None)
        torch.testing.assert_close(got.out, want.out, rtol=1e-5, atol=1e-6)
        assert got.kv[0].shape[1] == kv_heads  # what a cache keeps: G heads
    assert gqa.in_proj.weight.shape == (16 + 2 * kv_heads * Dh, 16)


def test_the_decoders_cache_holds_the_key_value_heads_only():
    torch.manual_seed(7)
    m = build_model(_cfg(kv_heads=1), 20, 20).eval()
    src, sl = padded_batch([5, 3], seed=1)
    with torch.no_grad():
        cache = m.init_cache(m.encode(src, sl))
        _, cache = m.decode_step(torch.tensor([1, 1]), cache)
        _, cache = m.decode_step(torch.tensor([5, 6]), cache)
    k, v = cache.self_kv[0]
    assert k.shape[1] == v.shape[1] == 1 and k.shape[2] == 2  # (N, G, t, Dh)
    assert cache.cross[0][0].shape[1] == 1


def test_kv_heads_must_divide_the_heads():
    with pytest.raises(ConfigError, match="'model.kv_heads': must divide model.n_heads=4"):
        _cfg(kv_heads=3)


def test_defaults_are_unchanged():
    m = build_model(_cfg(), 20, 20)
    assert isinstance(m.encoder.layers[0].res_attn.norm, torch.nn.LayerNorm)
    assert m.decoder.layers[0].self_attn.q_norm is None and m.decoder.layers[0].ffn.glu is False
    assert not [k for k in m.state_dict() if "q_norm" in k or "k_norm" in k]


@pytest.mark.parametrize("option", [dict(norm_layer="rmsnorm"), dict(ffn="glu"), dict(qk_norm=True), dict(kv_heads=2)])
def test_export_refuses_them_by_name(option):
    key, value = next(iter(option.items()))
    with pytest.raises(ConfigError, match=f"model.{key}={value}"):
        check_exportable(_cfg(**option))


# ------------------------------------------------------------------------------------------ in the model


@pytest.mark.parametrize("kind", ["vanilla", "universal"])
@pytest.mark.parametrize("attention", ["dense", "sdpa", "graph"])
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_decoding_steps_equal_the_full_forward(option, attention, kind):
    torch.manual_seed(3)
    m = build_model(_cfg(attention=attention, kind=kind, **option), 20, 20).eval()
    assert_steps_equal_full_forward(m)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_graph_and_sdpa_equal_dense_and_batching_changes_nothing(option):
    torch.manual_seed(4)
    dense = build_model(_cfg(attention="dense", **option), 20, 20).eval()
    assert_kernels_and_batching_agree(dense, lambda cfg: build_model(cfg, 20, 20))


def test_a_gated_rmsnorm_qknorm_model_trains():
    """One update with every option on lowers the loss on its own batch (gradients reach every new parameter)."""
    torch.manual_seed(5)
    m = build_model(_cfg(**OPTIONS[-1]), 20, 20)
    src, sl = padded_batch([6, 5, 4], seed=7)
    tgt, tl = padded_batch([6, 5, 4], seed=8)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(2):
        out = m(src, sl, tgt, tl)
        loss = F.cross_entropy(m.generator(out.real()), tgt[out.mask])
        opt.zero_grad()
        loss.backward()
        if not losses:
            for name, p in m.named_parameters():
                if "norm" in name or "linear1" in name:
                    assert p.grad is not None and p.grad.abs().sum() > 0, name
        opt.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]
