"""Fine-tuning a model trained elsewhere: `tformer train --config finetune --init-from MODEL` on Multi30k pairs,
starting from a (tiny, random) OPUS-MT-shaped Hugging Face folder: the run keeps the imported tokenizers and
architecture, starts from the imported weights, learns, resumes exactly after kill -9, and exports back; a
recipe that changes the architecture is a ConfigError naming the key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
from helpers.hf_marian_models import make_folder  # noqa: E402

import tformer  # noqa: E402
import tformer.cli  # noqa: E402
from tformer.checkpoint import load_checkpoint  # noqa: E402
from tformer.errors import ConfigError  # noqa: E402
from tformer.training.start import train_config  # noqa: E402
from tformer.training.state import TrainerState  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from helpers.corpora import SHARED_DATA, small_multi30k

    root = tmp_path_factory.mktemp("ft")
    corpus = small_multi30k(SHARED_DATA, root / "m30k", n_train=400, n_eval=16)
    return make_folder(root / "opus", seed=5), corpus


def _args(setup, run, *more):
    opus, corpus = setup
    return [sys.executable, "-m", "tformer", "train", "--config", "finetune", "--init-from", str(opus), "--run-dir",
            str(run), f"data.dir={corpus}", "data.valid_prefix=val", "data.test_prefix=test2016", "train.max_steps=12",
            "train.save_every=4", "train.eval_every=6", "train.warmup=4", "train.lr=0.001", "train.max_tokens=512",
            "train.max_hours=0", "train.keep_last=5", "data.workers=1", *more]


# The command line in a child that kills itself with SIGKILL as its update number TFORMER_TEST_KILL_AT_UPDATE begins.
KILL_AT_UPDATE = r"""
import os, signal, sys
from tformer.training import loop
real, n = loop.take_update, [0]
def update(*a, **k):
    n[0] += 1
    if n[0] == int(os.environ["TFORMER_TEST_KILL_AT_UPDATE"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
loop.take_update = update
from tformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_fine_tuning_starts_from_the_imported_model_and_resumes_exactly(setup, tmp_path):
    opus, corpus = setup
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = tmp_path / "whole"
    proc = subprocess.run(_args(setup, whole), capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = load_checkpoint(whole, "latest")
    assert TrainerState.of(ckpt).step == 12 and ckpt.cfg.train.init_from == str(opus)
    imported = tformer.load(opus, device="cpu")
    assert ckpt.cfg.model == imported.config.model  # the architecture came with the weights
    assert [t.fingerprint() for t in ckpt.tokenizers] == [t.fingerprint() for t in imported.checkpoint.tokenizers]
    first = load_checkpoint(whole / "checkpoints" / "step_0000004")
    start = {k: v for k, v in imported.model.state_dict().items()}
    moved = first.weights("raw")
    assert set(moved) <= set(start)  # tied tables are stored once
    assert max(float((moved[k] - start[k]).abs().max()) for k in moved) > 0  # it learned ...
    assert max(float((moved[k] - start[k]).abs().max()) for k in moved) < 0.05  # ... from the imported weights
    metrics = [line for line in (whole / "metrics.jsonl").read_text().splitlines() if '"valid"' in line]
    assert metrics and "bleu" in metrics[-1]

    # killed (kill -9) mid-run, two updates past its second checkpoint, then resumed: the same weights as the
    # uninterrupted run. The run kills itself as update 11 begins, so no machine is fast enough to finish first.
    cut = tmp_path / "cut"
    killer = [sys.executable, "-c", KILL_AT_UPDATE, *_args(setup, cut)[3:]]
    p = subprocess.run(killer, capture_output=True, text=True, env={**env, "TFORMER_TEST_KILL_AT_UPDATE": "11"})
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]  # killed, not finished
    assert TrainerState.of(load_checkpoint(cut, "latest")).step == 8  # updates 9 and 10 died with it
    assert not (cut / "checkpoints" / "step_0000012").exists()
    resumed = subprocess.run(_args(setup, cut, "--resume"), capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_checkpoint(whole, "latest").weights("raw"), load_checkpoint(cut, "latest").weights("raw")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # and back out, for transformers
    out = tmp_path / "hf"
    assert tformer.cli.main(["export", "--format", "hf-marian", str(whole), str(out)]) == 0
    from transformers import MarianMTModel

    assert MarianMTModel.from_pretrained(out).config.vocab_size == imported.model.src_embed.tokens.num_embeddings - 1


def test_a_fine_tuning_recipe_may_not_change_the_architecture(setup):
    opus, corpus = setup
    base = [f"data.dir={corpus}", f"train.init_from={opus}"]
    with pytest.raises(ConfigError, match=r"'model.d_model'.*initial model.*32.*not 64.*model.dropout"):
        train_config("finetune", overrides=base + ["model.d_model=64"])
    with pytest.raises(ConfigError, match="'data.subword_sampling'.*own table"):
        train_config("finetune", overrides=base + ["data.subword_sampling=0.1"])
    cfg = train_config("finetune", overrides=base + ["model.dropout=0.3"])
    assert cfg.model.dropout == 0.3 and cfg.model.d_model == 32 and cfg.model.sinusoid == "halves"
