"""Attention maps come from the kernels' own weights (checked against a softmax written out here), whatever
the layout, and the pictures show exactly those numbers with the tokens as labels."""

import math

import numpy as np
import pytest
import torch

from tformer.config import ModelConfig
from tformer.model import build_model
from tformer.viz.attention import KINDS, attention_maps, plot_attention, plot_head_grid, save_figure

PAIRS = [([5, 6, 7, 8, 9], [9, 8, 7]), ([4, 6], [5, 5, 6, 7, 4])]


def _model(**kw):
    args = dict(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, ffn_dropout=0.0)
    cfg = ModelConfig(**{**args, **kw})
    return build_model(cfg, 12, 12).eval()


def test_first_encoder_layer_is_the_softmax_of_scaled_scores_written_out():
    m = _model(attention="dense")
    maps = attention_maps(m, PAIRS)
    src = torch.tensor([PAIRS[0][0] + [2]])  # + </s>
    x = m.src_embed(src).x[0]  # (S, D) eval: no dropout
    q, k, _ = m.encoder.layers[0].self_attn.in_proj(x).chunk(3, -1)
    for h in range(2):
        qh, kh = q[:, h * 8 : (h + 1) * 8], k[:, h * 8 : (h + 1) * 8]
        want = torch.softmax(qh @ kh.T / math.sqrt(8), -1).detach().numpy()
        np.testing.assert_allclose(maps[0].get("encoder", 0, h), want, atol=1e-6)


def test_maps_are_per_sentence_normalised_causal_and_independent_of_the_batch():
    m = _model()
    both = attention_maps(m, PAIRS)
    for i, pair in enumerate(PAIRS):
        alone = attention_maps(m, [pair])[0]
        for kind in KINDS:
            np.testing.assert_allclose(both[i].weights[kind], alone.weights[kind], atol=1e-6)
            np.testing.assert_allclose(both[i].weights[kind].sum(-1), 1.0, atol=1e-5)  # no mass on padding
    s, t = len(PAIRS[1][0]) + 1, len(PAIRS[1][1]) + 1
    assert both[1].weights["encoder"].shape == (2, 2, s, s)
    assert both[1].weights["cross"].shape == (2, 2, t, s)
    dec = both[1].weights["decoder"]
    assert dec.shape == (2, 2, t, t) and np.all(np.triu(dec, 1) == 0)  # nothing from the future


@pytest.mark.parametrize("positions", ["sinusoidal", "tupe-r"])
@pytest.mark.parametrize("kernel", ["sdpa", "graph"])
def test_every_kernel_gives_the_dense_maps(kernel, positions):
    dense = _model(attention="dense", positions=positions)
    other = _model(attention=kernel, positions=positions)
    other.load_state_dict(dense.state_dict())
    for a, b in zip(attention_maps(dense, PAIRS), attention_maps(other, PAIRS)):
        for kind in KINDS:
            np.testing.assert_allclose(a.weights[kind], b.weights[kind], atol=1e-5)


def test_labels_follow_what_each_position_reads_and_produces():
    maps = attention_maps(_model(), [PAIRS[0]], [list("abcde")], [list("xyz")])[0]
    assert maps.labels("encoder") == (list("abcde") + ["</s>"],) * 2
    assert maps.labels("decoder") == (list("xyz") + ["</s>"], ["<s>"] + list("xyz"))
    assert maps.labels("cross") == (list("xyz") + ["</s>"], list("abcde") + ["</s>"])
    with pytest.raises(ValueError, match="2 heads"):
        maps.get("cross", 0, 2)
    with pytest.raises(ValueError, match="unknown attention kind"):
        maps.get("self", 0, 0)


def test_universal_transformer_maps_are_per_step_and_blank_after_halting():
    m = _model(kind="universal", max_steps=4, act_bias_init=-1.0)
    with torch.no_grad():  # make positions halt at different steps
        m.encoder.halt.weight.normal_(0, 2.0)
        m.decoder.halt.weight.normal_(0, 2.0)
    maps = attention_maps(m, [PAIRS[0]])[0]
    assert maps.layer_name == "step" and maps.steps is not None
    src_steps, tgt_steps = maps.steps
    assert len(src_steps) == 6 and len(tgt_steps) == 4
    assert len(set(src_steps + tgt_steps)) > 1, "the test wants positions halting at different steps"
    for kind, steps in (("encoder", src_steps), ("decoder", tgt_steps), ("cross", tgt_steps)):
        w = maps.weights[kind]
        assert w.shape[0] == max(steps)  # the side runs until its last position halts
        for s in range(w.shape[0]):
            for row, n in enumerate(steps):
                assert np.isnan(w[s, :, row]).all() == (n <= s)
                if n > s:
                    np.testing.assert_allclose(w[s, :, row].sum(-1), 1.0, atol=1e-5)


def test_heatmap_shows_the_weights_with_token_labels(tmp_path):
    maps = attention_maps(_model(), [PAIRS[0]], [list("abcde")], [list("xyz")])[0]
    fig = plot_attention(maps, "cross", 1, 1, tmp_path / "cross.png")
    ax = fig.axes[0]
    np.testing.assert_allclose(np.asarray(ax.get_images()[0].get_array()), maps.get("cross", 1, 1), atol=1e-7)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde") + ["</s>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == list("xyz") + ["</s>"]
    assert (tmp_path / "cross.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_head_grid_has_every_head_and_writes_png_and_svg(tmp_path):
    maps = attention_maps(_model(n_heads=4), [PAIRS[1]])[0]
    fig = plot_head_grid(maps, "decoder", 0, tmp_path / "grid", cols=3)
    images = [ax.get_images()[0] for ax in fig.axes if ax.get_images()]
    assert len(images) == 4
    for h, im in enumerate(images):
        np.testing.assert_allclose(np.asarray(im.get_array()), maps.get("decoder", 0, h), atol=1e-7)
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "grid.svg").read_bytes()[:400]
    paths = save_figure(plot_attention(maps, "encoder", 0, 0), tmp_path / "one.svg")
    assert paths == [tmp_path / "one.svg"]


def test_frame_encoder_maps_are_over_model_frames():
    m = _model(source="features", feature_dim=5, frame_stack=2, frame_skip=2)
    frames = [torch.randn(7, 5), torch.randn(4, 5)]
    maps = attention_maps(m, [(frames[0], [5, 6]), (frames[1], [7])])
    assert maps[0].source == ["0.00s", "0.02s", "0.04s", "0.06s"]  # ceil(7 / 2) model frames at 2 x 10 ms, no </s>
    assert maps[0].weights["encoder"].shape == (2, 2, 4, 4) and maps[1].weights["cross"].shape == (2, 2, 2, 2)
    alone = attention_maps(m, [(frames[1], [7])])[0]
    np.testing.assert_allclose(maps[1].weights["cross"], alone.weights["cross"], atol=1e-6)
