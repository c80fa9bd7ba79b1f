"""A newcomer's first hour: what tformer says and writes when someone new follows the documentation and slips.
Errors speak the caller's language (Python or the command line) and name the nearest right name; commands say
what they wrote and what to run next; the corpus the docs start with is fetched offline when a copy is there."""

from __future__ import annotations

import os
import re
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


QUICK_DEMO = ["train.max_steps=30", "data.train_size=200", "data.valid_size=20", "data.test_size=20",
              "data.symbols=6", "data.length_mean=5", "data.max_len=8", "train.eval_every=10", "model.d_model=32",
              "model.d_ff=64", "train.attention_examples=0", "train.threads=1", "train.max_hours=0"]
QUICK_TRAIN = ["train.max_steps=4", "train.eval_every=4", "train.threads=1"]


def bash_commands(page: str, section: str | None = None) -> list[str]:
    """The commands of a page's ```bash blocks (of one `## section`), comments and line continuations removed."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if section is not None:
        text = text[text.index(f"\n## {section}\n"):]
        text = text[: text.find("\n## ", 1) if "\n## " in text[1:] else None]
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = (re.sub(r"(^|\s+)#.*$", "", line).strip() for line in lines)
    return [command for command in commands if command]  # a comment on a line of its own is no command


@pytest.mark.slow  # whole commands, trainings among them
def test_the_readmes_and_the_first_pages_commands_run_as_typed(tmp_path, shared_data):
    """In a fresh folder and a shell that has only the documented activation (no PATH to tformer before it):
    the README's set-up (its install lines aside: this environment is that install), demo and first model, and
    the first-model page's commands, as written; the trainings get a few updates instead of their full budget
    (overrides appended, the documented words kept)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the documented activation needs the tests to run in a virtual environment (.venv)")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    setup = bash_commands("README.md", "Set up")
    activate = [c.strip() for c in setup[0].split("&&") if c.strip().startswith("source")]
    assert activate == ["source .venv/bin/activate"] and setup[1].startswith("pip install")
    assert setup[2] == "tformer demo"
    first = bash_commands("README.md", "Five lines of Python")
    assert [c.split()[:2] for c in first] == [["tformer", "data"], ["tformer", "train"], ["tformer", "translate"]]
    page = (ROOT / "docs" / "start" / "first-model.md").read_text(encoding="utf-8")
    page_train = re.search(r"`(tformer train --config multi30k_quick [^`]*)`", page).group(1)
    page_data = bash_commands("docs/start/first-model.md")
    assert page_data == [first[0]] and "data.dir=data/multi30k" in page_train
    script = [activate[0], " ".join([setup[2], *QUICK_DEMO]), first[0], " ".join([first[1], *QUICK_TRAIN]),
              f"echo 'A dog runs on the beach .' | {first[2]}", *page_data, " ".join([page_train, *QUICK_TRAIN])]
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != Path(sys.prefix) / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(["bash", "-e", "-c", "\n".join(script)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=900, env={**env, "PATH": path, "TFORMER_SHARED_DATA": str(shared_data)})
    assert r.returncode == 0, (script, r.stdout[-2000:], r.stderr[-3000:])
    assert (tmp_path / "runs" / "m30k" / "checkpoints").is_dir()
    assert (tmp_path / "runs" / "multi30k_quick" / "checkpoints").is_dir()
    assert "next: tformer evaluate --checkpoint runs/m30k" in r.stdout
