import collections
import gzip
import math
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from tformer.config import Config, DataConfig, ModelConfig, TrainConfig

# Under pytest-xdist (the README's `-n auto`), each worker process computes on one thread, and so does every
# command it starts: the workers already fill the cores, and OpenMP threads that outnumber them spin against
# each other (on this 2-core machine two workers of two threads each took 8.1 min, of one thread 4.1 min).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Every bf16/fp16 promise is checked on every machine: where the CPU has no units for a reduced precision (or
# PyTorch's and oneDNN's dispatch is capped below them, as in tests/test_capped_isa.py), decoding in it is refused
# to users, and allowed here, emulated: slow, the same numbers (tformer.precision.EMULATION_SWITCH).
os.environ["TFORMER_EMULATED_PRECISION"] = "1"

# Hypothesis profiles, for every test module (HYPOTHESIS_PROFILE picks one): `ci`, the default, is derandomized
# so that a CI run is reproducible; `random` draws the same number of examples afresh each run (reproduce one
# with --hypothesis-seed=N); `long` draws 20x as many.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=60, derandomize=True, database=None, deadline=None,
                          suppress_health_check=_QUIET)
settings.register_profile("random", max_examples=60, database=None, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("long", max_examples=1200, database=None, deadline=None, suppress_health_check=_QUIET)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
SCALE = {"ci": 1, "random": 1, "long": 20}[PROFILE]

# What batching may change in a score (docs/reliability.md, "Outputs and batching"; docs/howto/translate.md):
# tokens and texts never; a log-probability only in its last float32 digits, per token within REL of
# max(1, |value|), so a sum within REL of its absolute value plus REL per token.
REL = 1e-5

# The device the model oracles run on (cached == full, kernels == dense, batch invariance, beam == its uncached
# reference, bf16 against fp32): TFORMER_TEST_DEVICE=cuda runs them on a GPU, `pytest -m device` runs only them.
# The models are built on the CPU (the same seeded weights everywhere) and moved there.
TEST_DEVICE = torch.device(os.environ.get("TFORMER_TEST_DEVICE", "cpu"))


def pytest_configure(config):
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"TFORMER_TEST_DEVICE={TEST_DEVICE} but PyTorch sees no CUDA device here")


# The longest test files first. Under `-n auto` (with --dist loadfile and --no-loadscope-reorder in pyproject.toml)
# pytest-xdist hands whole files to the workers in collection order; by default it sorts them by how many tests
# they hold, so the documentation build (one file of a few tests, minutes of work) started last and the other
# worker sat idle at the end. Longest first, the short files fill in around them. Ordered by the slowest tests of
# fresh-clone runs (`--durations`, benchmarks/RESULTS.md); the rest keep their order.
LONGEST_FIRST = ["test_docs.py", "test_readme.py", "test_faults.py", "test_train_modes.py", "test_capped_isa.py",
                 "test_export.py", "test_distributed.py", "test_speech.py", "test_documents.py", "test_install.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


def on_device(model):
    """`model` on TEST_DEVICE (its eval/train mode kept)."""
    return model.to(TEST_DEVICE)


def assert_same_scores(got, want) -> None:
    """`got` and `want`, lists of tformer Score (forced decoding) for the same pairs, agree as batching promises:
    the same tokens and alignments, every log-probability within REL (per token: of max(1, |value|))."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.tokens == w.tokens and g.alignment == w.alignment, i
        assert g.token_log_probs == pytest.approx(w.token_log_probs, rel=REL, abs=REL), i
        assert g.log_prob == pytest.approx(w.log_prob, rel=REL, abs=REL * len(w.tokens)), i


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


def greedy_batch_ends(sizes: list[int], max_tokens: int, max_sentences: int) -> list[int]:
    """Token-budget batch ends by the plain loop, the oracle of BatchPlan: take the next example while
    count x longest stays within the budget (and the count within `max_sentences`, 0 = no cap)."""
    ends, count, longest = [], 0, 0
    for i, s in enumerate(sizes):
        if count and (max(longest, s) * (count + 1) > max_tokens or (max_sentences and count >= max_sentences)):
            ends.append(i)
            count, longest = 0, 0
        count, longest = count + 1, max(longest, s)
    return ends + [len(sizes)] if sizes else []


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


SHARED_DATA = Path(os.environ.get("TFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline corpora (../shared/data, or $TFORMER_SHARED_DATA); tests skip, saying why, without them."""
    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"real corpora not found in {SHARED_DATA}; set TFORMER_SHARED_DATA to the shared/data folder")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Encoded-data cache in a temporary folder, never the user's ~/.cache: for the whole session, so that
    module-scoped fixtures (a server whose explorer reads examples from the data) use it too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFORMER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


def small_multi30k(shared: Path, out: Path, n_train: int = 3000, n_eval: int = 200) -> Path:
    """The first lines of Multi30k train/val/test2016 (real text, gzip like the originals) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_eval), ("test2016", n_eval)):
        for lang in ("en", "de"):
            with gzip.open(shared / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(out / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    return out


def bleu_by_definition(hyps, refs):
    """Corpus BLEU-4 from its definition (Papineni et al., 2002) on whitespace tokens, one reference."""
    match, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h, r = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = collections.Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            rc = collections.Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    logp = sum(math.log(m / t) for m, t in zip(match, total)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(logp)
