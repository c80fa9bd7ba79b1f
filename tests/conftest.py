import collections
import gzip
import math
import os
from pathlib import Path

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


SHARED_DATA = Path(os.environ.get("TFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline corpora (../shared/data, or $TFORMER_SHARED_DATA); tests skip, saying why, without them."""
    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"real corpora not found in {SHARED_DATA}; set TFORMER_SHARED_DATA to the shared/data folder")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Encoded-data cache in a temporary folder, never the user's ~/.cache."""
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


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
