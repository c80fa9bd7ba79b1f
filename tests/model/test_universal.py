"""The Adaptive Universal Transformer: ACT bookkeeping, equivalences, cached decoding, training."""

import dataclasses
import json

import pytest
import torch

from tformer.config import ConfigError, DecodeConfig, ModelConfig, StructureConfig
from tformer.inference import translate_ids
from tformer.model import build_model
from tformer.model.act import ACT
from tformer.training.loop import train, train_step_loss

from helpers.models import tiny_config


def _ut(max_steps=6, bias=-1.0, **kw):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0,
                      norm="pre", kind="universal", max_steps=max_steps, act_bias_init=bias, **kw)
    return build_model(cfg, 20, 20).eval()


def _batch():
    src, tgt = torch.randint(4, 20, (3, 7)), torch.randint(4, 20, (3, 6))
    sl, tl = torch.tensor([7, 2, 5]), torch.tensor([6, 1, 4])
    src[torch.arange(7)[None] >= sl[:, None]] = 0
    tgt[torch.arange(6)[None] >= tl[:, None]] = 0
    return src, sl, tgt, tl


def test_act_weights_sum_to_one_and_steps_stay_within_the_maximum():
    torch.manual_seed(0)
    active = torch.rand(4, 9) < 0.8
    for max_steps in (1, 3, 10):
        act = ACT(active, epsilon=0.01, max_steps=max_steps)
        total = torch.zeros(4, 9)
        while not act.done:
            w, running = act.weights(torch.rand(4, 9))
            assert torch.all(w[~running] == 0)  # halted positions take no more weight
            total += w
        torch.testing.assert_close(total[active], torch.ones(int(active.sum())))
        assert torch.all(total[~active] == 0)
        p = act.ponder()
        assert p.steps.max() <= max_steps and torch.all(p.steps[active] >= 1)
        assert torch.all((p.remainders[active] > 0) & (p.remainders[active] <= 1))


def test_positions_halt_at_different_steps_and_halted_states_freeze():
    model = _ut(max_steps=6, bias=-1.0)
    out = model(*_batch())
    enc, dec = out.ponder
    real = torch.arange(6)[None] < torch.tensor([6, 1, 4])[:, None]
    assert torch.all(dec.steps[~real] == 0) and torch.all(dec.steps[real] >= 1) and dec.steps.max() <= 6
    assert out.hidden.isfinite().all()


def test_one_step_is_a_one_layer_transformer_with_the_same_weights():
    ut = _ut(max_steps=1)
    cfg = dataclasses.replace(ut.cfg, kind="vanilla", encoder_layers=1, decoder_layers=1)
    vanilla = build_model(cfg, 20, 20).eval()
    state = {k.replace(".layer.", ".layers.0."): v for k, v in ut.state_dict().items() if "halt" not in k}
    vanilla.load_state_dict(state)  # every weight but the halting units is shared
    # the universal transformer adds the first time-step signal to the positions: give vanilla the same table
    for positions in {id(e.positions): e.positions for e in (vanilla.src_embed, vanilla.tgt_embed)}.values():
        positions.table = positions.table + ut.encoder.time[0]
    batch = _batch()
    torch.testing.assert_close(ut(*batch).real(), vanilla(*batch).real(), atol=1e-5, rtol=1e-5)


def test_gradients_reach_the_halting_units():
    model = _ut(max_steps=4, bias=0.0).train()
    src, sl, tgt, tl = _batch()
    from tformer.data.batching import Batch

    tgt_out = torch.roll(tgt, -1, 1)
    b = Batch(src, sl, tgt, tgt_out, tl, [0, 1, 2])
    loss = train_step_loss(model, b, 0.1, ponder_weight=0.01).loss
    loss.backward()
    for unit in (model.encoder.halt, model.decoder.halt):
        assert unit.weight.grad is not None and unit.weight.grad.abs().sum() > 0


def test_cached_decoding_equals_the_full_forward_on_every_prefix():
    model = _ut(max_steps=6, bias=-1.0)
    torch.nn.init.normal_(model.decoder.halt.weight, std=0.3)  # halting probabilities far apart per position
    src, sl, tgt, tl = _batch()
    enc = model.encode(src, sl)
    cache = model.init_cache(enc)
    for t in range(6):
        logits, cache = model.decode_step(tgt[:, t], cache)
        full = model.decode(tgt[:, : t + 1], torch.full((3,), t + 1), enc)
        torch.testing.assert_close(logits, model.generator(full.hidden[:, t]), atol=1e-5, rtol=1e-5)
        assert torch.equal(cache.steps, full.ponder[1].steps)  # the per-token step map
    assert len(set(cache.steps.flatten().tolist())) > 1  # positions really halted at different steps


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("kw", [{}, dict(attention="graph", positions="tupe",
                                        encoder_structure=StructureConfig(window=2),
                                        decoder_structure=StructureConfig(window=2))], ids=["dense", "graph"])
def test_batch_of_one_and_batch_of_seven_decode_identically(strategy, kw):
    model = _ut(max_steps=5, bias=-0.5, **kw)
    with torch.no_grad():
        model.decoder.halt.weight.normal_(0, 0.5)  # hypotheses halt at different steps
    torch.nn.init.normal_(model.generator.bias, std=3.0)
    sources = [[4 + (i * 7 + j) % 15 for j in range(1 + i % 6)] for i in range(7)]
    cfg = DecodeConfig(strategy=strategy, beam_size=3, max_len_a=1.0, max_len_b=4, batch_size=1)
    one = translate_ids(model, sources, cfg)
    seven = translate_ids(model, sources, dataclasses.replace(cfg, batch_size=7))
    assert one.tokens == seven.tokens
    for a, b in zip(one.scores, seven.scores):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=1e-5)


def test_universal_transformer_learns_sort(tmp_path):
    cfg = tiny_config(kind="universal", max_steps=4)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, task="sort"),
                              train=dataclasses.replace(cfg.train, epochs=3, lr=2.0, log_every=5))
    train(cfg, tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.75 * losses[0]
    assert all(1 <= r["ponder"] <= 4 for r in records if r["kind"] == "train")


def test_universal_config_is_checked():
    with pytest.raises(ConfigError, match="model.max_steps"):
        ModelConfig(kind="universal", max_steps=0)


def test_ponder_command_maps_steps_and_refuses_a_vanilla_checkpoint(tmp_path, capsys):
    from tformer.cli import main
    from tformer.data import load_task
    from tformer.evaluation import ponder_steps
    from tformer.inference import load_model

    cfg = tiny_config(kind="universal", max_steps=3)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1, max_steps=6, eval_every=6))
    train(cfg, tmp_path / "ut")
    ckpt, model = load_model(str(tmp_path / "ut"))
    examples = load_task(ckpt.cfg.data, ("valid",), tokenizers=ckpt.tokenizers).examples["valid"]
    src_steps, tgt_steps = ponder_steps(model, examples)
    assert [len(s) for s in src_steps] == [len(s) + 1 for s, _ in examples]  # </s> included
    assert all(1 <= x <= 3 for row in src_steps + tgt_steps for x in row)
    assert main(["ponder", "--checkpoint", str(tmp_path / "ut"), "--split", "valid", "--sentence", "c a b",
                 "--out", str(tmp_path / "pics")]) == 0
    out = capsys.readouterr().out
    assert "mean" in out and "steps per source token: [" in out
    assert {p.name for p in (tmp_path / "pics").iterdir()} == {"steps_histogram.png", "ponder_curve.png",
                                                                 "step_map.png"}
    train(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kind="vanilla")), tmp_path / "vanilla")
    assert main(["ponder", "--checkpoint", str(tmp_path / "vanilla"), "--out", str(tmp_path / "x")]) == 2
    assert "needs model.kind=universal" in capsys.readouterr().err
