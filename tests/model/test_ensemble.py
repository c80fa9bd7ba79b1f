"""Ensembles of checkpoints at decoding time: two copies of one model decode exactly as the model alone;
two different models decode as a plain reference that averages their log-probabilities step by step with
full forward passes (no cache); batch-invariant; what needs one model's forward pass is refused by name."""

import dataclasses

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.data import Vocab
from tformer.model.ensemble import Ensemble
from tformer.training.loop import train

from helpers.models import tiny_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=2))
    train(cfg, root / "a")
    train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=7, epochs=1)), root / "b")
    return root / "a", root / "b"


SOURCES = ["a b c d", "e f g", "h a b c d e", "b b c", "g f e d c b a"]


def _reference_greedy(models, src_ids, limit):
    """Greedy over the mean log-probability of full forward passes, one sentence, no cache."""
    src = torch.tensor([src_ids + [Vocab.eos]])
    out = []
    for _ in range(limit):
        tgt = torch.tensor([[Vocab.bos] + out])
        logps = []
        for m in models:
            hidden = m(src, torch.tensor([src.shape[1]]), tgt, torch.tensor([tgt.shape[1]])).hidden[0, -1]
            logps.append(torch.log_softmax(m.generator(hidden), -1))
        logp = torch.log_softmax(torch.stack(logps).mean(0), -1)
        logp[[Vocab.pad, Vocab.bos]] = float("-inf")
        tok = int(logp.argmax())
        if tok == Vocab.eos:
            break
        out.append(tok)
    return out


@pytest.mark.slow
@torch.no_grad()
def test_an_ensemble_decodes_as_the_average_of_its_models(runs):
    a, b = runs
    alone = tformer.load(a, device="cpu")
    twice = tformer.load([a, a], device="cpu")
    assert twice.ensemble and isinstance(twice.model, Ensemble)
    for beam in (1, 3):
        x, y = alone.translate(SOURCES, beam=beam), twice.translate(SOURCES, beam=beam)
        assert [t.text for t in x] == [t.text for t in y]
        assert [t.score for t in x] == pytest.approx([t.score for t in y], abs=1e-5)
    pair = tformer.load([a, b], device="cpu", max_len_a=1.0, max_len_b=3)
    got = pair.translate(SOURCES)
    models = [m.eval() for m in pair.model.models]
    for source, translation in zip(SOURCES, got):
        ids = pair.encode(source)
        want = _reference_greedy(models, ids, len(ids) + 3)
        assert pair.pieces(want) == translation.tokens
    assert [t.text for t in got] != [t.text for t in alone.translate(SOURCES)]  # the second model counts
    for beam in (1, 3):  # batch-invariant
        batched = pair.translate(SOURCES, beam=beam, batch_size=5)
        assert [t.text for t in batched] == [pair.translate([s], beam=beam)[0].text for s in SOURCES]
    metrics = pair.evaluate("test").metrics
    assert "exact_match" in metrics and "loss" not in metrics  # decoding metrics; an ensemble has no one loss


def test_what_needs_one_model_is_refused_and_the_command_takes_several_checkpoints(runs, tmp_path, capsys):
    a, b = runs
    pair = tformer.load([a, b], device="cpu")
    with pytest.raises(tformer.ConfigError, match="ensemble of 2 checkpoints"):
        pair.score(["a b"], ["a b"])
    with pytest.raises(tformer.ConfigError, match="attention maps and alignments"):
        pair.translate(["a b"], alignment=True)
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n")
    assert main(["translate", "--checkpoint", str(a), "--checkpoint", str(b), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text().splitlines() == [t.text for t in pair.translate(SOURCES)]
