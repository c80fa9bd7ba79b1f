"""Tiny models and the oracles every model test shares: the device they run on, a seconds-to-train config,
padded batches, cached == full forward, kernels and batching agree, tensors follow their inputs' device."""

import os

import torch

from tformer.config import Config, DataConfig, ModelConfig, TrainConfig

# The device the model oracles run on (cached == full, kernels == dense, batch invariance, beam == its uncached
# reference, bf16 against fp32): TFORMER_TEST_DEVICE=cuda runs them on a GPU, `pytest -m device` runs only them.
# The models are built on the CPU (the same seeded weights everywhere) and moved there.
TEST_DEVICE = torch.device(os.environ.get("TFORMER_TEST_DEVICE", "cpu"))


def on_device(model):
    """`model` on TEST_DEVICE (its eval/train mode kept)."""
    return model.to(TEST_DEVICE)


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


def padded_batch(lengths: list[int], seed: int, vocab: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (B, max length) >= 4 with 0 (<pad>) past each of `lengths`, and the lengths (B,)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (len(lengths), max(lengths)), generator=g)
    lens = torch.tensor(lengths)
    ids[torch.arange(max(lengths))[None] >= lens[:, None]] = 0
    return ids, lens


def assert_steps_equal_full_forward(model) -> None:
    """Decoding a padded batch one position at a time with the cache gives the full forward's logits."""
    model = on_device(model)
    src, sl = (t.to(TEST_DEVICE) for t in padded_batch([7, 4], seed=2))
    tgt, tl = (t.to(TEST_DEVICE) for t in padded_batch([6, 3], seed=3))
    with torch.no_grad():
        full = model.generator(model(src, sl, tgt, tl).padded())  # (B, T, V)
        cache = model.init_cache(model.encode(src, sl))
        for t in range(6):
            logits, cache = model.decode_step(tgt[:, t], cache)
            real = t < tl
            torch.testing.assert_close(logits[real], full[real, t], rtol=1e-4, atol=1e-5)


def assert_kernels_and_batching_agree(dense, build) -> None:
    """`dense` (model.attention dense) equals the same weights on the sdpa and graph kernels (`build(cfg)` makes
    a model), and each sentence decoded alone equals the batch of seven."""
    import dataclasses

    dense = on_device(dense)
    src, sl = (t.to(TEST_DEVICE) for t in padded_batch([9, 2, 5, 7, 1, 4, 6], seed=5))
    tgt, tl = (t.to(TEST_DEVICE) for t in padded_batch([7, 1, 4, 3, 2, 6, 5], seed=6))
    with torch.no_grad():
        want = dense(src, sl, tgt, tl).real()  # (Nt, D)
        for attention in ("sdpa", "graph"):
            other = on_device(build(dataclasses.replace(dense.cfg, attention=attention)).eval())
            other.load_state_dict(dense.state_dict())
            torch.testing.assert_close(other(src, sl, tgt, tl).real(), want, rtol=1e-5, atol=2e-5)
        alone = torch.cat([dense(src[i:i + 1, :sl[i]], sl[i:i + 1], tgt[i:i + 1, :tl[i]], tl[i:i + 1]).real()
                           for i in range(7)])
        torch.testing.assert_close(alone, want, rtol=1e-5, atol=2e-5)


def assert_follows_input_device(fn, *args, **kwargs):
    """`fn` puts every tensor it makes on its inputs' device: called on CPU inputs while the default device is
    'meta', it must give the CPU result. A tensor made without `device=` lands on meta and mixing it with the
    CPU inputs raises; a GPU run would instead put it on the wrong device. Returns the result."""
    want = fn(*args, **kwargs)
    with torch.device("meta"):
        got = fn(*args, **kwargs)
    flat_want, flat_got = _leaves(want), _leaves(got)
    assert len(flat_got) == len(flat_want)
    for g, w in zip(flat_got, flat_want):
        if isinstance(w, torch.Tensor):
            assert g.device == w.device and g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        else:
            assert g == w
    return want


def _leaves(value) -> list:
    """The tensors and plain values of nested tuples and lists."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]
