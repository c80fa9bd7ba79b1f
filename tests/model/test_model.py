"""The encoder-decoder against torch.nn.Transformer with copied weights (dropout off)."""

import pytest
import torch

from tformer.config import ModelConfig
from tformer.masks import padding_mask
from tformer.model import build_model


def _copy_mha(ours, ref):
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.weight.copy_(ref.out_proj.weight)
    ours.out_proj.bias.copy_(ref.out_proj.bias)


def _copy_ffn(ours, ref):
    ours.linear1.load_state_dict(ref.linear1.state_dict())
    ours.linear2.load_state_dict(ref.linear2.state_dict())


def _reference_for(model, cfg: ModelConfig) -> torch.nn.Transformer:
    ref = torch.nn.Transformer(cfg.d_model, cfg.n_heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                               dropout=0.0, batch_first=True, norm_first=cfg.norm == "pre",
                               layer_norm_eps=cfg.layer_norm_eps, activation=cfg.activation)
    with torch.no_grad():
        for o, r in zip(model.encoder.layers, ref.encoder.layers):
            _copy_mha(o.self_attn, r.self_attn)
            _copy_ffn(o.ffn, r)
            o.res_attn.norm.load_state_dict(r.norm1.state_dict())
            o.res_ffn.norm.load_state_dict(r.norm2.state_dict())
        for o, r in zip(model.decoder.layers, ref.decoder.layers):
            _copy_mha(o.self_attn, r.self_attn)
            _copy_mha(o.cross_attn, r.multihead_attn)
            _copy_ffn(o.ffn, r)
            o.res_self.norm.load_state_dict(r.norm1.state_dict())
            o.res_cross.norm.load_state_dict(r.norm2.state_dict())
            o.res_ffn.norm.load_state_dict(r.norm3.state_dict())
        if cfg.norm == "pre":  # pre-norm stacks end with a LayerNorm, as nn.Transformer's do
            model.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
            model.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
        else:  # the paper's post-norm stack has no final norm; nn.Transformer always adds one
            ref.encoder.norm = None
            ref.decoder.norm = None
    return ref.eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("kernel", ["dense", "sdpa"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_decoder_matches_torch_transformer(norm, kernel, activation):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=3, dropout=0.0,
                      attention_dropout=0.0, ffn_dropout=0.0, norm=norm, attention=kernel, activation=activation)
    model = build_model(cfg, 20, 20).eval()
    ref = _reference_for(model, cfg)
    src, tgt = torch.randint(4, 20, (3, 9)), torch.randint(4, 20, (3, 7))
    src_len, tgt_len = torch.tensor([9, 5, 2]), torch.tensor([7, 7, 3])
    s_real, t_real = padding_mask(src_len, 9), padding_mask(tgt_len, 7)
    got = model(src, src_len, tgt, tgt_len).hidden  # (B, T, D)
    with torch.no_grad():
        want = ref(model.src_embed(src).x, model.tgt_embed(tgt).x,
                   tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(7),
                   src_key_padding_mask=~s_real, tgt_key_padding_mask=~t_real, memory_key_padding_mask=~s_real)
    torch.testing.assert_close(got[t_real], want[t_real], atol=1e-5, rtol=1e-5)


def test_tied_and_shared_embeddings():
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1,
                      share_embeddings=True, tie_generator=True)
    m = build_model(cfg, 11, 11)
    assert m.generator.weight is m.tgt_embed.tokens.weight is m.src_embed.tokens.weight
    untied = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, tie_generator=False), 11, 13)
    assert untied.generator.weight is not untied.tgt_embed.tokens.weight
    with pytest.raises(ValueError, match="joint vocabulary"):
        build_model(cfg, 11, 12)


def test_embeddings_are_scaled_by_sqrt_d_and_positions_are_sinusoidal():
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    m = build_model(cfg, 10, 10).eval()
    ids = torch.tensor([[5, 6, 7]])
    x = m.src_embed(ids).x
    pos = torch.arange(3.0)[:, None]
    i = torch.arange(0, 16, 2.0)
    pe = torch.zeros(3, 16)
    pe[:, 0::2] = torch.sin(pos / 10000 ** (i / 16))
    pe[:, 1::2] = torch.cos(pos / 10000 ** (i / 16))
    torch.testing.assert_close(x[0], m.src_embed.tokens.weight[ids[0]] * 4.0 + pe, atol=1e-5, rtol=1e-5)


def test_learned_positions_past_their_table_reuse_the_last_row(caplog):
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, positions="learned", max_positions=8, dropout=0.0)
    m = build_model(cfg, 10, 10).eval()
    table = m.src_embed.positions.table.weight
    with caplog.at_level("WARNING", logger="tformer"):
        x = m.src_embed(torch.full((1, 12), 5, dtype=torch.long)).x  # (1, 12, 16)
    token = m.src_embed.tokens.weight[5] * 4.0
    torch.testing.assert_close(x[0, :8], token + table)
    torch.testing.assert_close(x[0, 8:], (token + table[7]).expand(4, -1))
    assert "model.max_positions=8" in caplog.text
    m.encode(torch.ones(1, 30, dtype=torch.long), torch.tensor([30]))  # a whole model runs past the table


def test_xavier_initialisation():
    m = build_model(ModelConfig(d_model=64, n_heads=4, d_ff=256), 100, 100)
    w = m.encoder.layers[0].ffn.linear1.weight  # (256, 64)
    bound = (6 / (64 + 256)) ** 0.5
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert torch.all(m.encoder.layers[0].ffn.linear1.bias == 0)


def test_attention_weights_are_returned_not_stashed():
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=3)
    m = build_model(cfg, 10, 10).eval()
    out = m(torch.randint(4, 10, (2, 5)), torch.tensor([5, 3]), torch.randint(4, 10, (2, 4)), torch.tensor([4, 2]),
            need_weights=True)
    a = out.attentions
    assert [w.shape for w in a.encoder] == [(2, 2, 5, 5)] * 2
    assert [w.shape for w in a.decoder] == [(2, 2, 4, 4)] * 3
    assert [w.shape for w in a.cross] == [(2, 2, 4, 5)] * 3
    assert torch.all(a.cross[0][1, :, :, 3:] == 0)
