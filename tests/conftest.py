import pytest
import torch

from tformer.config import Config, DataConfig, ModelConfig, TrainConfig


def tiny_config(**model) -> Config:
    """A small model and a small copy task: seconds to train on a CPU."""
    m = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
             attention_dropout=0.0, ffn_dropout=0.0)
    m.update(model)
    return Config(
        model=ModelConfig(**m),
        data=DataConfig(task="copy", symbols=8, length_mean=6, length_std=2, max_len=10, train_size=300,
                        valid_size=40, test_size=40),
        train=TrainConfig(max_tokens=256, epochs=2, lr=1.0, warmup=20, eval_every=0, log_every=5),
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
