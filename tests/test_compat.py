"""Checkpoints written before the model core was recomposed (tensor names `encoder_layers.*`, `encoder_norm.*`,
`encoder_halt.*`) load, decode exactly as they did, and resume with their optimizer moments on the right
parameters. Fixtures: tests/fixtures/{checkpoint_v1,universal_v1} (see their READMEs)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.checkpoint import load_checkpoint
from tformer.model import build_model, upgrade_state
from tformer.model.transformer import legacy_parameter_order
from tformer.training.loop import build_optimizer

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_universal_checkpoint_from_before_decodes_as_it_did():
    want = json.loads((FIXTURES / "universal_v1" / "outputs.json").read_text())
    translator = tformer.load(FIXTURES / "universal_v1" / "checkpoint")
    assert translator.config.model.kind == "universal"
    for beam, name in ((None, "greedy"), (3, "beam3")):  # beam3 was written under fairseq's rule for endings
        got = translator.translate(want["inputs"], **({"beam": beam, "beam_finish": "top_k"} if beam else {}))
        assert [t.text for t in got] == want[name]
        torch.testing.assert_close(torch.tensor([t.score for t in got], dtype=torch.float64),
                                   torch.tensor(want[f"{name}_scores"], dtype=torch.float64), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("fixture", ["checkpoint_v1", "universal_v1"])
def test_old_names_map_onto_every_tensor_and_the_old_parameter_order(fixture):
    folder = FIXTURES / fixture / "checkpoint"
    ckpt = load_checkpoint(folder)
    model = build_model(ckpt.cfg.model, len(ckpt.tokenizers[0].vocab), len(ckpt.tokenizers[1].vocab))
    old = load_file(str(folder / "model.safetensors"))
    new = upgrade_state(old)
    assert set(new) == set(model.state_dict()) - {k for k in model.state_dict() if k not in new and
                                                   _tied(model, k)}
    assert upgrade_state(new) == new  # today's names stay as they are
    # the optimizer state of that commit listed parameters in this order (written by that commit's model)
    old_order = (FIXTURES / fixture / "parameter_order.txt").read_text().split()
    names = [n for n, _ in model.named_parameters()]
    assert [names[i] for i in legacy_parameter_order(model)] == list(upgrade_state(dict.fromkeys(old_order)))


def _tied(model, name):
    """A tensor stored once under its first name (a tied embedding/generator)."""
    state = model.state_dict()
    return any(state[name].data_ptr() == v.data_ptr() and k != name for k, v in state.items())


def test_resuming_a_checkpoint_from_before_puts_each_moment_on_its_parameter(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(FIXTURES / "checkpoint_v1" / "checkpoint", run / "checkpoints" / "step_0001000")
    ckpt = load_checkpoint(run / "checkpoints" / "step_0001000")
    model = build_model(ckpt.cfg.model, len(ckpt.tokenizers[0].vocab), len(ckpt.tokenizers[1].vocab))
    ckpt.load_model_state(model)
    assert ckpt.legacy
    optimizer = build_optimizer(model, ckpt.cfg)
    ckpt.load_training_state(optimizer, 0, model)
    saved = load_file(str(run / "checkpoints" / "step_0001000" / "optimizer.safetensors"))
    old_order = (FIXTURES / "checkpoint_v1" / "parameter_order.txt").read_text().split()
    params = dict(model.named_parameters())
    for old_index, old_name in enumerate(old_order):
        (name,) = upgrade_state({old_name: None})
        moment = optimizer.state[params[name]]["exp_avg_sq"]
        assert torch.equal(moment, saved[f"state.{old_index}.exp_avg_sq"]), name
    with pytest.raises(tformer.CheckpointError, match="pass the model"):
        ckpt.load_training_state(optimizer, 0)
