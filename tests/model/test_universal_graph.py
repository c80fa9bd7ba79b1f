"""The Adaptive Universal Transformer on the graph: halted positions leave the computation.

Oracles: the graph UT equals the dense UT with the same weights (hidden states, steps, remainders, halting
gradients) over structures, TUPE variants, norms, positions and frames; the rows through the shared layer
equal the ponder total; cached decoding equals the full forward on every prefix; a window structure changes
a UT exactly as its dense mask says; the speech task trains one. Batch 1 == batch 7 on the graph: test_universal.py."""

import dataclasses
import json

import pytest
import torch

from tformer.config import ModelConfig, StructureConfig
from tformer.model import build_model
from tformer.structures import build_structure

STRUCTURES = {
    "full": (StructureConfig(), StructureConfig()),
    "window": (StructureConfig(window=2), StructureConfig(window=2)),
    "dilated+global": (StructureConfig(window=1, dilation=2, global_tokens=1), StructureConfig(window=3)),
}
VARIANTS = [
    dict(),
    dict(norm="post"),
    dict(positions="learned"),
    dict(positions="tupe"),
    dict(positions="tupe-r", untie_first=True),
    dict(positions="tupe-r", decoder_positions="sinusoidal", norm="post"),
]


def _cfg(structure="full", **kw) -> ModelConfig:
    enc, dec = STRUCTURES[structure]
    base = dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0, norm="pre",
                kind="universal", max_steps=6, act_bias_init=-1.0, attention="dense", encoder_structure=enc,
                decoder_structure=dec)
    return ModelConfig(**{**base, **kw})


def _pair(cfg: ModelConfig, vocab: int = 20):
    """(dense, graph) universal transformers with the same weights; halting weights spread so positions halt
    at different steps."""
    torch.manual_seed(0)
    dense = build_model(cfg, vocab, vocab).eval()
    with torch.no_grad():
        for stack in (dense.encoder, dense.decoder):
            stack.halt.weight.normal_(0, 0.5)
        for module in dense.modules():  # trained-like norms: a bias at padding would show in padded()
            if isinstance(module, torch.nn.LayerNorm):
                module.bias.normal_(0, 0.1)
    graph = build_model(dataclasses.replace(cfg, attention="graph"), vocab, vocab).eval()
    graph.load_state_dict(dense.state_dict())
    return dense, graph


def _batch(frames: int = 0):
    g = torch.Generator().manual_seed(3)
    sl, tl = torch.tensor([9, 2, 5]), torch.tensor([7, 1, 4])
    tgt = torch.randint(4, 20, (3, 7), generator=g)
    tgt[torch.arange(7)[None] >= tl[:, None]] = 0
    if frames:
        src = torch.randn(3, 9, frames, generator=g)
        src[torch.arange(9)[None] >= sl[:, None]] = 0
    else:
        src = torch.randint(4, 20, (3, 9), generator=g)
        src[torch.arange(9)[None] >= sl[:, None]] = 0
    return src, sl, tgt, tl


def _assert_same(dense, graph, batch):
    od, og = dense(*batch), graph(*batch)
    torch.testing.assert_close(og.padded(), od.padded(), atol=2e-5, rtol=1e-5)
    for pd, pg in zip(od.ponder, og.ponder):
        assert torch.equal(pd.steps, pg.steps)
        torch.testing.assert_close(pg.remainders, pd.remainders, atol=1e-5, rtol=1e-5)
    steps = torch.cat([od.ponder[0].steps.flatten(), od.ponder[1].steps.flatten()])
    assert len(set(steps[steps > 0].tolist())) > 1, "the test wants positions halting at different steps"
    return od, og


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_graph_ut_equals_dense_ut(structure, variant):
    dense, graph = _pair(_cfg(structure, **VARIANTS[variant]))
    _assert_same(dense, graph, _batch())


def test_graph_ut_equals_dense_ut_on_frames_and_its_halting_gradients_too():
    cfg = _cfg("window", source="features", feature_dim=6, frame_stack=2, frame_skip=1, positions="tupe-r",
               decoder_positions="sinusoidal")
    dense, graph = _pair(cfg)
    batch = _batch(frames=6)
    grads = []
    for model in (dense, graph):
        model.zero_grad()
        out = model(*batch)
        probe = torch.linspace(-1, 1, out.real().numel()).view_as(out.real())
        ((out.real() * probe).sum() + sum(p.cost for p in out.ponder)).backward()
        grads.append([model.encoder.halt.weight.grad.clone(), model.decoder.halt.weight.grad.clone()])
    for gd, gg in zip(*grads):
        assert gd.abs().sum() > 0
        torch.testing.assert_close(gg, gd, atol=1e-5, rtol=1e-4)
    _assert_same(dense, graph, batch)


def _count_rows(module: torch.nn.Module) -> list[int]:
    counts = []
    module.register_forward_hook(lambda m, inp, out: counts.append(inp[0].shape[:-1].numel()))
    return counts


@pytest.mark.parametrize("structure", ["full", "window"])
def test_rows_through_the_shared_layer_equal_the_ponder_total(structure):
    dense, graph = _pair(_cfg(structure))
    src, sl, tgt, tl = _batch()
    counts = {}
    for name, model in (("dense", dense), ("graph", graph)):
        counts[name] = (_count_rows(model.encoder.layer.ffn), _count_rows(model.decoder.layer.ffn),
                        _count_rows(model.decoder.layer.cross_attn))
        out = model(src, sl, tgt, tl)
    enc, dec = out.ponder
    ffn_enc, ffn_dec, cross = counts["graph"]
    assert sum(ffn_enc) == int(enc.steps.sum()) and sum(ffn_dec) == int(dec.steps.sum())
    assert sum(cross) == int(dec.steps.sum())  # cross-attention queries too
    # the padded model computes every slot at every step until the last position halts
    assert sum(counts["dense"][0]) == src.numel() * int(enc.steps.max())
    assert sum(ffn_enc) < sum(counts["dense"][0])


@pytest.mark.parametrize("attention", ["dense", "graph"])
@pytest.mark.parametrize("kw", [dict(), dict(structure="window", positions="tupe-r", untie_first=True)],
                         ids=["plain", "window-tupe-r"])
def test_cached_decoding_equals_the_full_forward_on_every_prefix(attention, kw):
    dense, graph = _pair(_cfg(**kw))
    model = graph if attention == "graph" else dense
    src, sl, tgt, tl = _batch()
    enc = model.encode(src, sl)
    cache = model.init_cache(enc)
    rows, stepped = _count_rows(model.decoder.layer.ffn), 0
    for t in range(7):
        before = sum(rows)
        logits, cache = model.decode_step(tgt[:, t], cache)
        stepped += sum(rows) - before
        full = model.decode(tgt[:, : t + 1], torch.full((3,), t + 1), enc)
        torch.testing.assert_close(logits, model.generator(full.padded()[:, t]), atol=2e-5, rtol=1e-5)
        assert torch.equal(cache.steps, full.ponder[1].steps)
    assert len(set(cache.steps.flatten().tolist())) > 1
    # only the hypotheses still pondering ran the layer; the step loop ended once all had halted
    assert stepped == int(cache.steps.sum())


@pytest.mark.parametrize("attention", ["dense", "graph"])
def test_a_window_changes_the_ut_exactly_as_its_dense_mask_says(attention):
    dense, graph = _pair(_cfg("window", attention="dense"))
    full_dense, _ = _pair(_cfg("full"))
    model = graph if attention == "graph" else dense
    src, sl, tgt, tl = _batch()
    out = model(src, sl, tgt, tl, need_weights=True)
    allowed = build_structure(StructureConfig(window=2)).mask(9)  # (S, S)
    for step, w in enumerate(out.attentions.encoder):
        dense_w = w if attention == "dense" else _dense_weights(out.attentions.graphs["encoder"], w, sl, 9)
        real = torch.arange(9)[None] < sl[:, None]  # (B, S)
        off = ~allowed[None, None] & real[:, None, :, None] & real[:, None, None, :]  # real pairs off the window
        assert torch.all(dense_w[off.expand_as(dense_w)] == 0), f"step {step} attends outside the window"
    assert not torch.allclose(out.padded(), full_dense(src, sl, tgt, tl).padded(), atol=1e-3)


def _dense_weights(graph, w, lengths, S):
    """Per-edge weights (E, H) of a packed graph -> (B, H, S, S) per sentence."""
    offsets = torch.cumsum(lengths, 0) - lengths
    sentence = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(int(lengths.sum())) - offsets[sentence]
    out = torch.zeros(len(lengths), w.shape[1], S, S)
    out[sentence[graph.query], :, pos[graph.query], pos[graph.key]] = w
    return out


@pytest.mark.parametrize("attention", ["sdpa", "graph"])
def test_the_speech_task_trains_a_universal_transformer(tmp_path, attention):
    from tformer.config import load_config
    from tformer.recipes import find_recipe
    from tformer.training.loop import train

    over = ["model.kind=universal", f"model.attention={attention}", "model.max_steps=3", "model.d_model=32",
            "model.d_ff=64", "model.feature_dim=8", "model.positions=tupe-r", "model.decoder_positions=sinusoidal",
            "data.train_size=120", "data.valid_size=10", "data.test_size=10", "data.symbols=4", "data.length_mean=3",
            "data.min_len=2", "data.max_len=4", "train.max_steps=20", "train.eval_every=20", "train.warmup=10",
            "train.max_tokens=600", "train.max_hours=0", "train.patience=0", "train.epochs=100", "train.log_every=5",
            "train.attention_examples=0"]
    result = train(load_config(find_recipe("speech_synthetic"), over), tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert train_records[-1]["loss"] < train_records[0]["loss"]
    assert all(1 <= r["ponder"] <= 3 for r in train_records)  # steps per real position (model frames)
    assert "cer" in result.best
    from tformer.data import load_task
    from tformer.evaluation import ponder_steps
    from tformer.inference import load_model

    ckpt, model = load_model(tmp_path / "run")
    examples = load_task(ckpt.cfg.data, ("valid",), tokenizers=ckpt.tokenizers, feature_dim=8).examples["valid"]
    src_steps, _ = ponder_steps(model, examples)
    assert all(min(s) >= 1 for s in src_steps)  # one entry per model frame: padding (0 steps) never listed
