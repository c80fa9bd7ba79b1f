"""The whole model with `attention: graph` (packed, no padding) against `attention: dense` (padded) as oracle:
forward, gradients, decoding, attention weights, training and checkpoints that cross between the two."""

import dataclasses
import json

import pytest
import torch

from tformer.config import DecodeConfig, ModelConfig, StructureConfig
from tformer.inference import load_model, translate_ids
from tformer.model import build_model
from tformer.training.loop import train

from helpers.models import tiny_config

STRUCTURES = {
    "seed graphs": (StructureConfig(), StructureConfig()),
    "windows + global": (StructureConfig(window=2, global_tokens=1), StructureConfig(window=3)),
    "dilated": (StructureConfig(window=2, dilation=2), StructureConfig(dilation=2)),
}


def _pair(norm="pre", structures=STRUCTURES["seed graphs"], vocab=20):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, ffn_dropout=0.0, norm=norm, attention="dense",
                      encoder_structure=structures[0], decoder_structure=structures[1])
    dense = build_model(cfg, vocab, vocab)
    graph = build_model(dataclasses.replace(cfg, attention="graph"), vocab, vocab)
    graph.load_state_dict(dense.state_dict())  # the same parameters, strictly
    return dense, graph


def _batch():
    src_len, tgt_len = torch.tensor([9, 1, 4, 7, 2]), torch.tensor([3, 6, 1, 2, 5])
    src, tgt = torch.randint(4, 20, (5, 9)), torch.randint(4, 20, (5, 6))
    src[torch.arange(9)[None] >= src_len[:, None]] = 0
    tgt[torch.arange(6)[None] >= tgt_len[:, None]] = 0
    return src, src_len, tgt, tgt_len


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("name", list(STRUCTURES))
def test_packed_graph_model_equals_padded_dense_model(norm, name):
    dense, graph = _pair(norm, STRUCTURES[name])
    batch = _batch()
    want, got = dense(*batch), graph(*batch)
    assert got.hidden.shape == (1, int(batch[3].sum()), 32)  # packed: real target tokens only
    torch.testing.assert_close(got.real(), want.real(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.padded()[want.mask], want.padded()[want.mask], atol=1e-5, rtol=1e-5)
    g = torch.randn_like(want.real())
    grads_want = torch.autograd.grad((want.real() * g).sum(), list(dense.parameters()), allow_unused=True)
    grads_got = torch.autograd.grad((got.real() * g).sum(), list(graph.parameters()), allow_unused=True)
    for (name_, _), a, b in zip(dense.named_parameters(), grads_got, grads_want):
        if b is None:
            assert a is None, name_
            continue
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name_)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("name", ["seed graphs", "windows + global"])
def test_graph_decoding_equals_dense_decoding(strategy, name):
    dense, graph = _pair("pre", STRUCTURES[name])
    torch.nn.init.normal_(dense.generator.bias, std=3.0)  # a peaked output so hypotheses differ clearly
    graph.load_state_dict(dense.state_dict())
    sources = [[5, 6, 7, 8], [9], [4, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13]]
    cfg = DecodeConfig(strategy=strategy, beam_size=3, nbest=3 if strategy == "beam" else 1, max_len_a=1.0,
                       max_len_b=6, batch_size=3)
    want, got = translate_ids(dense, sources, cfg), translate_ids(graph, sources, cfg)
    assert got.tokens == want.tokens
    for a, b in zip(got.scores, want.scores):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=1e-5)


def test_graph_attention_weights_are_the_dense_weights_per_edge():
    dense, graph = _pair()
    batch = _batch()
    want = dense(*batch, need_weights=True).attentions
    got = graph(*batch, need_weights=True).attentions
    src_len, tgt_len = batch[1], batch[3]
    for kind, lq, lk in (("encoder", src_len, src_len), ("decoder", tgt_len, tgt_len), ("cross", tgt_len, src_len)):
        g = got.graphs[kind]
        # node -> (sentence, position) in the packed layout
        q_sent = torch.repeat_interleave(torch.arange(5), lq)
        q_pos = torch.arange(int(lq.sum())) - torch.repeat_interleave(torch.cumsum(lq, 0) - lq, lq)
        k_pos = torch.arange(int(lk.sum())) - torch.repeat_interleave(torch.cumsum(lk, 0) - lk, lk)
        for layer, (w_got, w_want) in enumerate(zip(getattr(got, kind), getattr(want, kind))):
            at_edges = w_want.permute(0, 2, 3, 1)[q_sent[g.query], q_pos[g.query], k_pos[g.key]]  # (E, H)
            torch.testing.assert_close(w_got, at_edges, atol=1e-6, rtol=1e-5, msg=f"{kind} layer {layer}")
        real_q = torch.arange(w_want.shape[2])[None, :] < lq[:, None]  # (B, T)
        assert g.n_edges == int(((w_want[:, 0] > 0) & real_q[:, :, None]).sum())  # every attended pair is an edge


def test_training_with_graph_follows_dense_and_checkpoints_cross_over(tmp_path):
    """Same seed, no dropout: a graph run's losses follow the dense run's; its checkpoint decodes the same
    with either kernel."""
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1, max_steps=12, eval_every=12))
    losses = {}
    for kind in ("dense", "graph"):
        run = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention=kind))
        train(run, tmp_path / kind)
        records = [json.loads(x) for x in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()]
        losses[kind] = [r["loss"] for r in records]
    assert len(losses["graph"]) == len(losses["dense"]) >= 3
    torch.testing.assert_close(torch.tensor(losses["graph"]), torch.tensor(losses["dense"]), atol=2e-4, rtol=1e-4)
    _, as_graph = load_model(str(tmp_path / "graph"), which="latest")
    _, as_dense = load_model(str(tmp_path / "graph"), which="latest", overrides=["model.attention=dense"])
    assert as_graph.packed and not as_dense.packed
    sources = [[4, 5, 6, 7], [8, 9], [10, 4, 4, 5, 6]]
    cfg_beam = DecodeConfig(strategy="beam", beam_size=4)
    assert translate_ids(as_graph, sources, cfg_beam).tokens == translate_ids(as_dense, sources, cfg_beam).tokens
