"""data.subword_sampling: training pairs re-segmented at every use (BPE-dropout), the same pieces for the same
(seed, epoch, batch) so a resumed run continues exactly, the text unchanged, valid/test never sampled."""

import dataclasses

import pytest
import torch

from tformer.checkpoint import load_checkpoint
from tformer.config import Config, DataConfig, ModelConfig, TrainConfig
from tformer.data import load_task
from tformer.errors import ConfigError
from tformer.training.batches import SubwordSampling
from tformer.training.loop import train
from tformer.training.state import TrainerState

from helpers.corpora import SHARED_DATA, small_multi30k


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"real corpora not found in {SHARED_DATA}; set TFORMER_SHARED_DATA")
    return small_multi30k(SHARED_DATA, tmp_path_factory.mktemp("m30k"), n_train=600, n_eval=40)


def _cfg(corpus, **train):
    return Config(
        model=ModelConfig(d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.1,
                          share_embeddings=True),
        data=DataConfig(task="translation", dir=str(corpus), train_prefix="train", valid_prefix="val",
                        test_prefix="test2016", vocab_size=300, subword_sampling=0.1),
        train=TrainConfig(**{**dict(max_tokens=600, epochs=2, log_every=1, warmup=10, threads=1), **train}),
    )


def test_sampling_is_seeded_varied_and_keeps_the_text(corpus):
    cfg = _cfg(corpus)
    data = load_task(cfg.data, ("train",))
    sampler = SubwordSampling(data.texts["train"], data.tokenizers, 0.1)
    idx = list(range(40))
    first = sampler.examples(idx, 1, 0, 3)
    assert first == sampler.examples(idx, 1, 0, 3)  # the same (seed, epoch, batch): the same pieces
    assert first != sampler.examples(idx, 1, 1, 3) and first != sampler.examples(idx, 1, 0, 4)
    plain = [data.examples["train"][i] for i in idx]
    assert sum(list(s) != list(p[0]) for (s, _), p in zip(first, plain)) >= 10  # dropout re-segments many
    src_tok, tgt_tok = data.tokenizers
    sources, targets = data.texts["train"]
    for i, (s, t) in zip(idx, first):  # the pieces differ, the text does not
        assert src_tok.decode(s) == src_tok.decode(list(data.examples["train"][i][0]))
        assert tgt_tok.decode(t) == tgt_tok.decode(list(data.examples["train"][i][1]))


def test_a_run_with_sampling_resumes_exactly_and_validation_is_not_sampled(corpus, tmp_path):
    cfg = _cfg(corpus)
    full = train(cfg, tmp_path / "full")
    split = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=5))
    train(split, tmp_path / "split")
    train(cfg, tmp_path / "split", resume=True)
    a, b = load_checkpoint(tmp_path / "full", "latest"), load_checkpoint(tmp_path / "split", "latest")
    assert TrainerState.of(a).step == TrainerState.of(b).step == full.step > 5
    wa, wb = a.weights(), b.weights()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    off = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, subword_sampling=0.0))
    train(off, tmp_path / "off")
    wo = load_checkpoint(tmp_path / "off", "latest").weights()
    assert any(not torch.equal(wa[k], wo[k]) for k in wa)  # sampling changed what was trained on
    assert TrainerState.of(a).best["loss"] != TrainerState.of(load_checkpoint(tmp_path / "off", "latest")).best["loss"]


def test_sampling_outside_subword_translation_is_refused():
    with pytest.raises(ConfigError, match="data.subword_sampling"):
        DataConfig(task="copy", subword_sampling=0.1)
    with pytest.raises(ConfigError, match="data.subword_sampling"):
        DataConfig(task="translation", dir="x", subword_sampling=1.5)
