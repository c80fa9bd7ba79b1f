"""The pieces decoding speed rests on, against plain torch: grouped top-k and max over wide rows, the
preallocated self-attention cache against concatenation, and int8 inference against fp32."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.attention.kvbuffer import KVBuffer
from tformer.config import DecodeConfig, ModelConfig
from tformer.decode.common import row_max, row_topk
from tformer.errors import ConfigError
from tformer.inference import translate_ids
from tformer.model import build_model
from tformer.model.quantize import quantize_int8


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), vocab=st.sampled_from([7, 100, 128, 257, 3000, 6000, 8191]), k=st.integers(1, 10),
       seed=st.integers(0, 10_000))
def test_row_topk_and_row_max_equal_torchs(rows, vocab, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 4  # continuous values: no ties
    x[:, : vocab // 3] = float("-inf")  # forbidden tokens, as the rules leave them
    k = min(k, vocab)
    want = x.topk(k, dim=1)
    got = row_topk(x, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    want_max = x.max(dim=1)
    got_max = row_max(x)
    assert torch.equal(got_max[0], want_max.values) and torch.equal(got_max[1], want_max.indices)


def test_row_topk_uses_groups_where_they_pay_and_ties_keep_their_values():
    x = torch.zeros(2, 6000)
    x[0, [17, 4000, 5999]] = 3.0  # a tie across groups: the values are topk's, the indices one of the tied
    values, index = row_topk(x, 3)
    assert torch.equal(values, x.topk(3, dim=1).values)
    assert set(index[0].tolist()) == {17, 4000, 5999}
    assert torch.equal(x.gather(1, index), values)


def test_kv_buffer_equals_concatenation_through_appends_reorders_and_growth():
    g = torch.Generator().manual_seed(0)
    N, H, Dh = 3, 2, 4
    buf, ref = KVBuffer(torch.empty(0), capacity=2), None  # capacity 2: it must grow twice
    for step in range(7):
        k, v = torch.randn(N, H, 1, Dh, generator=g), torch.randn(N, H, 1, Dh, generator=g)
        ref = (k, v) if ref is None else (torch.cat([ref[0], k], 2), torch.cat([ref[1], v], 2))
        keys, values = buf.append(k, v)
        assert torch.equal(keys, ref[0]) and torch.equal(values, ref[1]) and buf.t == step + 1
        rows = torch.randint(0, N, (N + (step % 3) - 1,), generator=g)  # keep, drop and repeat rows
        buf.reorder(rows)
        ref = (ref[0][rows], ref[1][rows])
        N = rows.shape[0]
        assert torch.equal(buf.keys, ref[0]) and torch.equal(buf.values, ref[1])


def _model():
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=64, n_heads=4, d_ff=128, encoder_layers=2, decoder_layers=2, dropout=0.0)
    return build_model(cfg, 40, 40).eval(), cfg


def test_int8_decodes_close_to_fp32_and_every_linear_is_int8():
    model, cfg = _model()
    g = torch.Generator().manual_seed(1)
    sources = [torch.randint(4, 40, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (16,), generator=g)]
    decode = DecodeConfig(strategy="beam", beam_size=3, max_len_a=1.0, max_len_b=4)
    fp32 = translate_ids(model, sources, decode)
    src = torch.tensor([sources[0] + [2]])
    tgt = torch.tensor([[1] + fp32.tokens[0][0]])
    want = model(src, torch.tensor([src.shape[1]]), tgt, torch.tensor([tgt.shape[1]])).real()
    want = torch.log_softmax(model.generator(want), -1)
    quantize_int8(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # every projection is int8
    assert not any(hasattr(m, "in_proj") for m in model.modules())
    got = model(src, torch.tensor([src.shape[1]]), tgt, torch.tensor([tgt.shape[1]])).real()
    got = torch.log_softmax(model.generator(got), -1)
    assert (got - want).abs().max() < 0.15 and not torch.equal(got, want)  # int8: close, not the same
    int8 = translate_ids(model, sources, decode)
    same = sum(a == b for a, b in zip(int8.tokens, fp32.tokens))
    assert same >= len(sources) // 2


def test_int8_is_refused_off_the_cpu():
    model, _ = _model()  # moved to the meta device: off the CPU, and no GPU needed to say so
    with pytest.raises(ConfigError, match="runs on a CPU.*the model is on meta"):
        quantize_int8(model.to("meta"))
