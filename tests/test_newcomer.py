"""A newcomer's first hour: what tformer says and writes when someone new follows the documentation and slips.
Errors speak the caller's language (Python or the command line) and name the nearest right name; commands say
what they wrote and what to run next; the corpus the docs start with is fetched offline when a copy is there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tformer
from tformer.errors import CheckpointError, ConfigError

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "checkpoint_v1" / "checkpoint"
TINY = ["model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1",
        "data.symbols=6", "data.length_mean=5", "data.max_len=8", "data.train_size=100", "data.valid_size=10",
        "data.test_size=10", "train.max_steps=4", "train.eval_every=2", "train.target_exact_match=0",
        "train.max_hours=0", "train.threads=1", "train.attention_examples=0"]


def run(*args, cwd=ROOT, env=None, python=False):
    command = [sys.executable, "-c", *args] if python else [sys.executable, "-m", "tformer", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_second_run_into_the_same_folder_is_told_in_the_callers_language(tmp_path):
    tformer.train("copy", tmp_path / "run", overrides=TINY)
    with pytest.raises(CheckpointError, match=r"add resume=True to continue it, or choose another run_dir"):
        tformer.train("copy", tmp_path / "run", overrides=TINY)
    r = run("train", "--config", "copy", "--run-dir", tmp_path / "run", *TINY)
    assert r.returncode == 2 and "add --resume to continue it, or choose another --run-dir" in r.stderr


def test_python_training_shows_its_progress_when_nothing_set_logging_up(tmp_path):
    """A script that never configured logging sees the run's lines on stderr, as the command line shows them."""
    r = run(f"import tformer; tformer.train('copy', {str(tmp_path / 'run')!r}, overrides={TINY!r})", python=True)
    assert r.returncode == 0, r.stderr
    assert "valid step 2" in r.stderr and "step 4" in r.stderr


def test_a_misspelt_decoding_keyword_names_the_nearest_one():
    t = tformer.load(FIXTURE)
    with pytest.raises(ConfigError, match=r"'beem' is not a decoding setting; did you mean 'beam'\?"):
        t.translate(["a b"], beem=5)
    with pytest.raises(ConfigError, match=r"'len_penalti' is not a decoding setting; did you mean 'len_penalty'\?"):
        t.translate(["a b"], len_penalti=0.5)


def test_a_mistyped_local_run_folder_names_the_nearest_and_no_hub(tmp_path):
    (tmp_path / "runs" / "m30q").mkdir(parents=True)
    r = run("translate", "--checkpoint", "runs/m30qq", cwd=tmp_path)
    assert r.returncode == 2
    assert "runs/m30qq does not exist (did you mean runs/m30q?)" in r.stderr and "huggingface" not in r.stderr
    r = run("translate", "--checkpoint", "Helsinki-NLP/opus-mt-en-de", cwd=tmp_path)  # a hub name: how to fetch it
    assert r.returncode == 2 and "huggingface-cli download Helsinki-NLP/opus-mt-en-de" in r.stderr


def test_recipes_are_listed_with_what_each_is_for_and_printed_whole():
    from tformer.recipes import HERE, RECIPES

    r = run("recipes")
    assert r.returncode == 0
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[: len(RECIPES)]}
    assert set(lines) == set(RECIPES)
    assert "A first translation model, English -> German on Multi30k" in lines["multi30k_quick"]
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines.values())  # each has its summary
    r = run("recipes", "multi30k_quick")
    assert r.returncode == 0 and r.stdout == (HERE / "multi30k_quick.yaml").read_text(encoding="utf-8")
    main_help = run("--help").stdout
    assert "tformer recipes" in main_help and "multi30k_quick" in main_help
    export_help = run("export", "--help").stdout
    assert all(name in export_help for name in ("argos", "hf-m2m100", "hf-mbart", "tformer[export]"))


def test_a_ctranslate2_export_carries_its_tokenizers_and_the_printed_recipe_translates(tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    r = run("export", "--format", "ctranslate2", FIXTURE, out)
    assert r.returncode == 0, r.stderr
    assert (out / "source.spm").is_file() and (out / "target.spm").is_file()
    snippet = "\n".join(line[2:] for line in r.stdout.splitlines() if line.startswith("  "))
    got = run(snippet.replace("A dog runs.", "A man rides a bike."), python=True)
    assert got.returncode == 0, got.stderr
    want = tformer.load(FIXTURE).translate(["A man rides a bike."], beam=2)[0].text
    assert got.stdout.strip() == want  # CTranslate2's default beam is 2


def test_the_multi30k_download_copies_an_offline_copy_checked(tmp_path, shared_data):
    """`tformer data multi30k --out data/multi30k`, as the docs say, on a machine with the offline copy: nothing is
    downloaded, every file is checked against the published checksum, and the command says what to run next."""
    r = run("data", "multi30k", "--out", "data/multi30k", cwd=tmp_path, env={"TFORMER_SHARED_DATA": str(shared_data)})
    assert r.returncode == 0, r.stderr
    for name in ("train", "val", "test2016"):
        for lang in ("en", "de"):
            got = tmp_path / "data" / "multi30k" / f"{name}.{lang}.gz"
            assert got.read_bytes() == (shared_data / "multi30k" / got.name).read_bytes()
    assert "checksum ok" in r.stderr and str(shared_data) in r.stderr
    assert "now: tformer train --config multi30k_quick data.dir=data/multi30k" in r.stdout
