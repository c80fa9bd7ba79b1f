"""The table of bad inputs (docs/reliability.md): each case runs the real command line on a bad file, flag,
checkpoint or input and checks that it (1) exits with status 2 and one message naming what is wrong and
where, and (2) changes nothing on disk (every file and folder under the test's folder is as it was).

The oracle of (2) is a snapshot of the folder tree (paths, sizes, modification times) before and after.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tformer.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
RECIPES = ROOT / "tformer" / "recipes"
TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.encoder_layers=1", "model.decoder_layers=1",
        "data.vocab_size=60", "train.max_steps=2", "train.eval_every=0", "train.log_every=1"]
WORDS = "the a cat dog sees runs big small red house man woman child eats".split()


def write_corpus(folder: Path, n_train: int = 300, n_eval: int = 20) -> Path:
    """A tiny en->de corpus (the 'German' is the English upper-cased): files format, plain text."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
        (folder / f"{split}.en").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(s.upper() + "\n" for s in lines), encoding="utf-8")
    return folder


def train_args(data: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(RECIPES / "multi30k_en_de.yaml"), "--run-dir", str(run),
            "--no-progress", f"data.dir={data}", "data.train_prefix=train", "data.valid_prefix=valid",
            "data.test_prefix=test", *TINY, *extra]


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = ("dir",) if p.is_dir() else (st.st_size, st.st_mtime_ns)
    return out


def run_cli(argv: list[str], capsys, monkeypatch, stdin: bytes = b"") -> tuple[int, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny translation run (2 updates): its checkpoint is what the checkpoint cases tamper with."""
    base = tmp_path_factory.mktemp("trained")
    data = write_corpus(base / "data")
    assert main(train_args(data, base / "run")) == 0
    return base / "run"


def latest(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


# ------------------------------------------------------------------------------------------ the cases
# Each returns (argv, stdin bytes, [substrings the message must hold]); it may write files into `tmp` first:
# the snapshot is taken after it returns.

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def misaligned_corpus(tmp, trained):
    data = write_corpus(tmp / "data")
    lines = (data / "train.de").read_text().splitlines(keepends=True)
    (data / "train.de").write_text("".join(lines[:-4]))
    return train_args(data, tmp / "run"), b"", ["train.en has 300 lines", "train.de has 296", "from line 297",
                                                 "aligned line by line"]


@case
def invalid_utf8(tmp, trained):
    data = write_corpus(tmp / "data")
    raw = (data / "train.en").read_bytes().split(b"\n")
    raw[6] = raw[6] + b" caf\xe9"  # Latin-1, not UTF-8
    (data / "train.en").write_bytes(b"\n".join(raw))
    return train_args(data, tmp / "run"), b"", ["train.en, line 7", "not valid UTF-8", "iconv"]


@case
def empty_line_in_text_task(tmp, trained):
    data = write_corpus(tmp / "data")
    for split in ("train", "valid", "test"):  # the whitespace-tokenised 'text' task: {split}.src/.tgt
        shutil.copy(data / f"{split}.en", data / f"{split}.src")
        shutil.copy(data / f"{split}.de", data / f"{split}.tgt")
    lines = (data / "train.src").read_text().splitlines(keepends=True)
    lines[2] = "\n"
    (data / "train.src").write_text("".join(lines))
    return (["train", "--config", RECIPES / "copy.yaml", "--run-dir", tmp / "run", "data.task=text",
             "data.length_distribution=normal",  # the copy recipe's uniform lengths are for the synthetic tasks only
             f"data.dir={data}", "train.max_steps=1"], b"", ["train.src, line 3: empty line", "remove the pair"])


@case
def not_a_text_file(tmp, trained):
    data = write_corpus(tmp / "data")
    shutil.copy(ROOT / "docs" / "seed_graphs.png", data / "train.en")
    return train_args(data, tmp / "run"), b"", ["train.en, line 3", "NUL byte", "not a text file"]  # PNG: CR LF, LF in its header


@case
def truncated_gzip(tmp, trained):
    data = write_corpus(tmp / "data")
    packed = gzip.compress((data / "train.en").read_bytes())
    (data / "train.en").unlink()
    (data / "train.en.gz").write_bytes(packed[: len(packed) // 2])
    return train_args(data, tmp / "run"), b"", ["train.en.gz", "cannot be decompressed", "truncated"]


@case
def empty_corpus(tmp, trained):
    data = write_corpus(tmp / "data")
    (data / "train.en").write_bytes(b"")
    (data / "train.de").write_bytes(b"")
    return train_args(data, tmp / "run"), b"", ["train.en + ", "train split holds no sentence pairs"]


@case
def missing_corpus_file(tmp, trained):
    data = write_corpus(tmp / "data")
    (data / "valid.de").unlink()
    return train_args(data, tmp / "run"), b"", ["valid.de", "valid.de.gz", "data.dir"]


@case
def unknown_config_key(tmp, trained):
    return train_args(tmp, tmp / "run", "train.lrr=3"), b"", ["'train.lrr' is unknown", "did you mean 'train.lr'"]


@case
def unknown_key_in_config_file(tmp, trained):
    cfg = tmp / "my.yaml"
    cfg.write_text("model:\n  d_modle: 64\n")
    return ["train", "--config", cfg, "--run-dir", tmp / "run"], b"", ["'model.d_modle' is unknown",
                                                                     "did you mean 'model.d_model'", str(cfg)]


@case
def ill_typed_config_value(tmp, trained):
    return train_args(tmp, tmp / "run", "train.lr=fast"), b"", ["'train.lr': must be a number, got 'fast'"]


@case
def impossible_model_shape(tmp, trained):
    return (train_args(tmp, tmp / "run", "model.d_model=30", "model.n_heads=4"), b"",
            ["'model.d_model': 30 is not divisible by model.n_heads=4"])


@case
def zero_sized_layer(tmp, trained):
    return train_args(tmp, tmp / "run", "model.d_ff=0"), b"", ["'model.d_ff': must be >= 1, got 0"]


@case
def resume_missing_run(tmp, trained):
    return ["train", "--run-dir", tmp / "nope", "--resume"], b"", ["nope does not exist"]


@case
def resume_partial_run(tmp, trained):
    (tmp / "run" / "checkpoints" / ".tmp-step_0000002-99").mkdir(parents=True)  # a crash mid-write, no config
    (tmp / "run" / "checkpoints" / ".tmp-step_0000002-99" / "model.safetensors").write_bytes(b"\0" * 10)
    return ["train", "--run-dir", tmp / "run", "--resume"], b"", ["checkpoints holds no complete checkpoint"]


def _ckpt_copy(tmp: Path, trained: Path) -> Path:
    return Path(shutil.copytree(latest(trained), tmp / "ckpt"))


def _translate(ckpt: Path) -> list:
    return ["translate", "--checkpoint", ckpt]


@case
def checkpoint_missing_weights(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    (ckpt / "model.safetensors").unlink()
    return _translate(ckpt), b"a cat\n", ["ckpt/model.safetensors", "cannot be read as safetensors"]


@case
def checkpoint_missing_config(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    (ckpt / "config.yaml").unlink()
    return _translate(ckpt), b"a cat\n", ["ckpt/config.yaml does not exist"]


@case
def checkpoint_of_another_model(tmp, trained):
    from tformer.checkpoint import unique_state
    from tformer.config import load_config
    from tformer.model import build_model

    ckpt = _ckpt_copy(tmp, trained)
    other = load_config(ckpt / "config.yaml", ["model.d_model=32", "model.d_ff=48"])
    save_file(unique_state(build_model(other.model, 60, 60)), str(ckpt / "model.safetensors"))
    return _translate(ckpt), b"a cat\n", ["ckpt/model.safetensors", "do not fit the model", "has shape (60, 32)",
                                          "needs (60, 16)"]


@case
def checkpoint_future_version(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    info = json.loads((ckpt / "trainer.json").read_text())
    (ckpt / "trainer.json").write_text(json.dumps({**info, "version": 99}))
    return _translate(ckpt), b"a cat\n", ["format version 99", "upgrade tformer"]


@case
def foreign_checkpoint(tmp, trained):
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / "trainer.json").write_text('{"global_step": 5}')
    return _translate(tmp / "ckpt"), b"a cat\n", ["ckpt is not a tformer checkpoint"]


@case
def pickle_as_weights(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    tensors = {k: v.clone() for k, v in load_file(str(ckpt / "model.safetensors")).items()}  # off the mmap
    torch.save(tensors, ckpt / "model.safetensors")  # a pickle in disguise
    return _translate(ckpt), b"a cat\n", ["model.safetensors", "cannot be read as safetensors"]


@case
def truncated_weights(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    raw = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(raw[: len(raw) * 2 // 3])
    return _translate(ckpt), b"a cat\n", ["model.safetensors", "cannot be read as safetensors"]


def _tamper(tmp, trained, change) -> Path:
    ckpt = _ckpt_copy(tmp, trained)
    tensors = {k: v.clone() for k, v in load_file(str(ckpt / "model.safetensors")).items()}  # off the mmap
    change(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))
    return ckpt


@case
def tampered_extra_tensor(tmp, trained):
    ckpt = _tamper(tmp, trained, lambda t: t.update({"backdoor.weight": torch.zeros(3)}))
    return _translate(ckpt), b"a cat\n", ["unexpected tensors ['backdoor.weight']"]


@case
def tampered_missing_tensor(tmp, trained):
    ckpt = _tamper(tmp, trained, lambda t: t.pop(sorted(t)[-1]))
    return _translate(ckpt), b"a cat\n", ["do not fit the model", "missing tensors ['"]


@case
def tampered_shape(tmp, trained):
    def change(t):
        t["src_embed.tokens.weight"] = t["src_embed.tokens.weight"][:-1].clone()

    return _translate(_tamper(tmp, trained, change)), b"a cat\n", ["'src_embed.tokens.weight' has shape (59, 16)"]


@case
def tampered_dtype(tmp, trained):
    def change(t):
        t["src_embed.tokens.weight"] = t["src_embed.tokens.weight"].double()

    return _translate(_tamper(tmp, trained, change)), b"a cat\n", ["'src_embed.tokens.weight' is torch.float64"]


@case
def tampered_nan_weights(tmp, trained):
    def change(t):
        t["src_embed.tokens.weight"][3, 4] = float("nan")

    return _translate(_tamper(tmp, trained, change)), b"a cat\n", ["'src_embed.tokens.weight' holds NaN or inf"]


@case
def tampered_optimizer_state(tmp, trained):
    run = Path(shutil.copytree(trained, tmp / "run"))
    file = latest(run) / "optimizer.safetensors"
    tensors = {k: v.clone() for k, v in load_file(str(file)).items()}
    key = next(k for k in sorted(tensors) if k.endswith("exp_avg"))
    tensors[key] = tensors[key].flatten()[:5].clone()
    save_file(tensors, str(file))
    return ["train", "--run-dir", run, "--resume", "train.max_steps=4"], b"", ["optimizer.safetensors",
                                                                               f"'{key}' has shape (5,)"]


@case
def tampered_trainer_state(tmp, trained):
    run = Path(shutil.copytree(trained, tmp / "run"))
    info = json.loads((latest(run) / "trainer.json").read_text())
    (latest(run) / "trainer.json").write_text(json.dumps({**info, "update_in_epoch": "7; rm -rf /"}))
    return ["train", "--run-dir", run, "--resume"], b"", ["trainer.json: 'update_in_epoch' is '7; rm -rf /', not a "
                                                          "whole number"]


@case
def tampered_latest_pointer(tmp, trained):
    run = Path(shutil.copytree(trained, tmp / "run"))
    shutil.copytree(latest(run), tmp / "elsewhere")  # a complete checkpoint, outside the run's folder
    (run / "checkpoints" / "latest").write_text("../../elsewhere\n")
    (run / "checkpoints" / "best").write_text("../../elsewhere\n")
    for p in (run / "checkpoints").glob("step_*"):
        (p / "model.safetensors").unlink()  # only a checkpoint outside the folder could then load
    return _translate(run), b"a cat\n", ["model.safetensors: cannot be read as safetensors"]


@case
def yaml_with_python_tag(tmp, trained):
    ckpt = _ckpt_copy(tmp, trained)
    (ckpt / "config.yaml").write_text("!!python/object/apply:os.system ['touch pwned']\n")
    return _translate(ckpt), b"a cat\n", ["ckpt/config.yaml is not valid YAML", "python/object/apply"]


@case
def translate_empty_input(tmp, trained):
    return _translate(trained), b"", ["standard input is empty: nothing to translate"]


@case
def translate_enormous_line(tmp, trained):
    (tmp / "out.txt").write_text("an earlier translation\n")
    (tmp / "in.txt").write_text("a cat\n" + "the dog " * 12_500 + "\n")  # 100,000 characters
    return (_translate(trained) + ["--input", tmp / "in.txt", "--output", tmp / "out.txt"], b"",
            ["in.txt, line 2", "100,000 characters", "--max-source-tokens 1024"])


@case
def translate_invalid_utf8(tmp, trained):
    (tmp / "out.txt").write_text("an earlier translation\n")
    (tmp / "in.txt").write_bytes(b"a cat\nthe \xff dog\n")
    return (_translate(trained) + ["--input", tmp / "in.txt", "--output", tmp / "out.txt"], b"",
            ["in.txt, line 2", "not valid UTF-8"])


@case
def translate_missing_input(tmp, trained):
    return _translate(trained) + ["--input", tmp / "nope.txt"], b"", ["nope.txt does not exist"]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_message_and_changes_nothing(name, tmp_path, trained, capsys, monkeypatch):
    argv, stdin, expected = CASES[name](tmp_path, trained)
    before, trained_before = snapshot(tmp_path), snapshot(trained)
    rc, err = run_cli(argv, capsys, monkeypatch, stdin)
    message = [ln for ln in err.splitlines() if ": error: " in ln]
    assert rc == 2, err
    assert len(message) == 1, err  # one message, no traceback
    for text in expected:
        assert text in err, (text, err)
    assert "Traceback" not in err
    assert snapshot(tmp_path) == before  # nothing written, nothing removed
    assert snapshot(trained) == trained_before


def test_the_documented_table_lists_exactly_these_cases():
    """docs/reliability.md names each case of this file in its table, and every other test it names exists."""
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`test_bad_inputs::(\w+)`", text))
    assert named == set(CASES)
    others = re.findall(r"`(test_\w+)::(\w+)`", text)
    assert {module for module, _ in others} >= {"test_explore", "test_serve", "test_score_cli", "test_prefix"}
    files = {path.stem: path for path in (ROOT / "tests").rglob("test_*.py")}  # a module's name, in any folder
    for module, test in others:
        if module != "test_bad_inputs":
            assert f"def {test}(" in files[module].read_text(encoding="utf-8"), (module, test)


def test_training_drops_empty_and_enormous_pairs_and_says_how_many(tmp_path, capsys, monkeypatch, caplog):
    """Training pairs with an empty side or a side longer than data.filter_max_len are dropped and counted
    (evaluation keeps every pair, warning about empty sides): here a 100,000-character line and an empty one."""
    data = write_corpus(tmp_path / "data")
    src = (data / "train.en").read_text().splitlines()
    tgt = (data / "train.de").read_text().splitlines()
    src[10] = "the dog " * 12_500  # 100,000 characters
    src[20], tgt[30] = "", ""
    (data / "train.en").write_text("\n".join(src) + "\n")
    (data / "train.de").write_text("\n".join(tgt) + "\n")
    valid = (data / "valid.de").read_text().splitlines()
    valid[4] = ""
    (data / "valid.de").write_text("\n".join(valid) + "\n")
    with caplog.at_level("INFO", logger="tformer"):
        rc, err = run_cli(train_args(data, tmp_path / "run"), capsys, monkeypatch)
    assert rc == 0, err
    log = caplog.text
    assert "kept 297 of 300 training pairs; dropped 2 with an empty side, 1 longer than 128 tokens" in log  # multi30k_en_de.yaml: data.filter_max_len=128
    assert "1 valid pair(s) with an empty side (line 5)" in log


def test_the_package_never_unpickles():
    """No pickle-family import anywhere in tformer/; any torch.load passes weights_only=True and any np.load
    allow_pickle=False (the oracle: the syntax tree of every module)."""
    import ast

    for path in sorted((ROOT / "tformer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                assert not {"pickle", "dill", "joblib", "cloudpickle", "_pickle"} & {str(n).split(".")[0] for n in names}, path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
                owner = ast.unparse(node.func.value)
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if owner == "torch":
                    assert kw.get("weights_only") == "True", f"{path}:{node.lineno}"
                if owner in ("np", "numpy"):
                    assert kw.get("allow_pickle") == "False", f"{path}:{node.lineno}"


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch, caplog):
    """The prepared-corpus cache under a path that cannot be created: a warning, a corpus prepared in a
    temporary folder, and the same data as with a working cache."""
    from tformer.config import DataConfig
    from tformer.data import load_task

    data = write_corpus(tmp_path / "data")
    cfg = DataConfig(task="translation", dir=str(data), train_prefix="train", valid_prefix="valid",
                     test_prefix="test", vocab_size=60)
    good = load_task(cfg, ("train", "valid"))
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "file" / "cache"))
    with caplog.at_level("WARNING", logger="tformer"):
        again = load_task(cfg, ("train", "valid"), tokenizers=good.tokenizers)
    assert {s: list(e) for s, e in again.examples.items()} == {s: list(e) for s, e in good.examples.items()}
    assert "could not prepare the corpus in the cache" in caplog.text and "for this process only" in caplog.text
