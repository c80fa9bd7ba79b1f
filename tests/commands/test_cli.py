"""The command line end to end on a tiny run: data, train, evaluate, translate, errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.cli import tformer

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.encoder_layers=1",
        "model.decoder_layers=1", "data.symbols=6", "data.length_mean=5", "data.max_len=8",
        "data.train_size=200", "data.valid_size=20", "data.test_size=20", "train.epochs=2",
        "train.eval_every=0", "train.target_exact_match=0", "train.max_hours=0"]  # no wall-clock stop


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "run"
    r = tformer("train", "--config", "copy", "--run-dir", d, *TINY)
    assert r.returncode == 0, r.stderr
    assert "best validation" in r.stdout
    return d


def test_train_writes_a_run_folder(run_dir):
    for name in ("config.yaml", "metrics.jsonl", "vocab.src.txt", "checkpoints/latest", "checkpoints/best"):
        assert (run_dir / name).exists(), name
    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    assert {p.name for p in ckpt.iterdir()} == {"model.safetensors", "optimizer.safetensors", "trainer.json",
                                                "config.yaml", "vocab.src.txt", "vocab.tgt.txt",
                                                "ema.safetensors"}  # the copy recipe averages its weights


def test_translate_keeps_line_count_and_empty_lines(run_dir):
    r = tformer("translate", "--checkpoint", run_dir, stdin="a b c\n\nd e zz\nf\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert len(lines) == 5 and lines[-1] == "" and lines[1] == ""
    assert all(tok in "abcdef" or tok == "<unk>" for line in lines for tok in line.split())


def test_translate_and_evaluate_accept_inference_overrides_only(run_dir):
    ok = tformer("translate", "--checkpoint", run_dir, "model.attention=dense", "decode.max_len_a=0",
                 "decode.max_len_b=2", stdin="a b c d e\n")
    assert ok.returncode == 0 and 1 <= len(ok.stdout.split()) <= 2, ok.stderr
    bad = tformer("evaluate", "--checkpoint", run_dir, "model.d_model=64")
    assert bad.returncode == 2 and "cannot change after training" in bad.stderr


def test_evaluate_prints_metrics(run_dir):
    r = tformer("evaluate", "--checkpoint", run_dir, "--split", "test", "--examples", "2")
    assert r.returncode == 0, r.stderr
    assert "exact match (free-running)" in r.stdout and "token accuracy" in r.stdout
    assert "decoding: greedy" in r.stdout
    assert r.stdout.count("->") == 2


def test_resume_continues_from_latest(run_dir):
    r = tformer("train", "--run-dir", run_dir, "--resume", "train.epochs=3")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr


def test_unknown_key_and_print_config(tmp_path):
    r = tformer("train", "--config", "copy", "model.d_modle=3", "--run-dir", tmp_path / "x")
    assert r.returncode == 2 and "'model.d_modle' is unknown; did you mean 'model.d_model'" in r.stderr
    assert not (tmp_path / "x").exists()  # failed before any work
    r = tformer("train", "--config", "sort", "--print-config", "train.lr=0.5")
    cfg = yaml.safe_load(r.stdout)
    assert cfg["data"]["task"] == "sort" and cfg["train"]["lr"] == 0.5


def test_config_name_is_looked_up_in_the_working_folder_then_the_package(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "copy.yaml").write_text("data:\n  task: sort\n")  # a user's own 'copy' wins
    r = tformer("train", "--config", "copy", "--print-config", cwd=tmp_path)
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["data"]["task"] == "sort", r.stderr
    r = tformer("train", "--config", "sort_universal", "--print-config", cwd=tmp_path)  # packaged
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["model"]["kind"] == "universal", r.stderr
    r = tformer("train", "--config", "nope", "--print-config", cwd=tmp_path)
    assert r.returncode == 2 and "config file nope does not exist" in r.stderr and "copy_universal" in r.stderr


def test_data_command_writes_parallel_files(tmp_path):
    r = tformer("data", "sort", "--out", tmp_path, "data.train_size=30")
    assert r.returncode == 0, r.stderr
    src = (tmp_path / "train.src").read_text().splitlines()
    tgt = (tmp_path / "train.tgt").read_text().splitlines()
    assert len(src) == len(tgt) == 30
    assert all(sorted(s.split()) == t.split() for s, t in zip(src, tgt))
    assert len((tmp_path / "test.src").read_text().splitlines()) == 1000


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    r = tformer("translate", "--checkpoint", tmp_path / "nope", stdin="a\n")
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path):
    import signal

    run = tmp_path / "run"
    args = [sys.executable, "-m", "tformer", "train", "--config", "copy", "--run-dir", str(run),
            *TINY, "train.epochs=50", "train.log_every=1", "--no-progress"]
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    for line in proc.stderr:  # wait until training is under way
        if " step 3 " in line:
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "saved" in err and "--resume" in err
    latest = (run / "checkpoints" / "latest").read_text().strip()
    step = int(latest.split("_")[1])
    assert 3 <= step < 50 * 4  # stopped early, after a whole update
    r = tformer("train", "--run-dir", run, "--resume", "train.max_steps=" + str(step + 2))
    assert r.returncode == 0, r.stderr
    assert f"resumed from {run / 'checkpoints' / latest} (step {step}," in r.stderr


def test_translate_reads_phrase_inputs_from_a_file_per_line(run_dir, tmp_path):
    """--constraints FILE (an option made from decode.PHRASE_INPUTS): one line per input line, its phrases
    separated by a tab, an empty line for none; what the library translates with those phrases, checked
    before anything is written."""
    from tformer.api import load
    from tformer.decode import PHRASE_INPUTS

    src, phrases = tmp_path / "in.txt", tmp_path / "constraints.txt"
    src.write_text("a b c\nd e f\nb b a\n", encoding="utf-8")
    phrases.write_text("f\tc d\n\ne\n", encoding="utf-8")
    r = tformer("translate", "--checkpoint", run_dir, "--input", src, "--constraints", phrases, "--beam", "3")
    assert r.returncode == 0, r.stderr
    want = load(run_dir, device="cpu").translate(["a b c", "d e f", "b b a"], beam=3,
                                                 constraints=[["f", "c d"], None, ["e"]])
    got = r.stdout.splitlines()
    assert got == [t.text for t in want]
    assert "f" in got[0].split() and "c d" in got[0] and "e" in got[2].split()
    phrases.write_text("f\n", encoding="utf-8")
    r = tformer("translate", "--checkpoint", run_dir, "--input", src, "--constraints", phrases, "--beam", "3")
    assert r.returncode == 2 and f"has 3 lines but {phrases} has 1" in r.stderr and not r.stdout
    phrases.write_text("f\n\n\n", encoding="utf-8")
    r = tformer("translate", "--checkpoint", run_dir, "--input", src, "--constraints", phrases, "--beam", "1")
    assert r.returncode == 2 and "constraints are enforced by beam search" in r.stderr
    r = tformer("translate", "--help")
    assert all(f"--{p.name.replace('_', '-')} FILE" in r.stdout for p in PHRASE_INPUTS)


def test_an_over_long_line_typed_at_a_terminal_is_refused_and_the_session_goes_on(run_dir):
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "tformer", "translate", "--checkpoint", str(run_dir),
                          "--max-source-tokens", "3"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    try:
        os.write(master, b"a b c d e\n")
        first = p.stdout.readline()
        os.write(master, b"a b\n")
        second = p.stdout.readline()
        os.write(master, b"\x04")
        assert p.wait(timeout=60) == 0
    finally:
        p.kill() if p.poll() is None else None
        os.close(master)
    assert first == "\n" and second.strip()  # refused with an empty line, then the next one is translated
    assert ("standard input, line 1: 5 source pieces (9 characters), more than max_source_tokens=3 "
            "(--max-source-tokens 3)") in p.stderr.read()


def test_translate_answers_line_by_line_on_a_terminal(run_dir):
    """stdin a terminal: each line is translated as soon as it is typed, before end of input."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "tformer", "translate", "--checkpoint", str(run_dir)], stdin=slave,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    try:
        os.write(master, b"a b c\n")
        first = p.stdout.readline()  # arrives while the input is still open
        os.write(master, b"\n")
        second = p.stdout.readline()
        os.write(master, b"\x04")  # Ctrl-D
        assert p.wait(timeout=60) == 0
    finally:
        p.kill() if p.poll() is None else None
        os.close(master)
    assert first.strip() and all(tok in "abcdef" or tok == "<unk>" for tok in first.split())
    assert second == "\n"  # an empty line answers with an empty line
    assert "one sentence per line" in p.stderr.read()


def test_only_user_errors_are_one_line_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """The command line prints a TformerError as one line with status 2; any other exception is a bug in
    tformer and must not be dressed up as a user mistake."""
    from tformer import cli
    from tformer.commands import graph
    from tformer.errors import DataError

    def fails_with(error):
        def run(args):
            raise error
        return run

    monkeypatch.setattr(graph, "run", fails_with(DataError("x.txt, line 3: something the user can fix")))
    assert cli.main(["graph", "--out", "g.png"]) == 2
    assert capsys.readouterr().err.strip() == "tformer graph: error: x.txt, line 3: something the user can fix"
    monkeypatch.setattr(graph, "run", fails_with(ValueError("an internal invariant broke")))
    with pytest.raises(ValueError, match="an internal invariant broke"):
        cli.main(["graph", "--out", "g.png"])


@pytest.mark.parametrize("command", ["translate", "evaluate", "score"])
def test_batching_and_int8_flags_are_decode_settings(command, capsys):
    """--int8 is decode.quantize=int8, --batch-tokens N is decode.batch_tokens=N (and --batch-size asks for
    sentences again: batch_tokens 0); explicit overrides still come last and win."""
    from tformer import cli
    from tformer.commands import common

    def overrides(*argv):
        return common.decode_overrides(cli.build_parser().parse_args([command, "--checkpoint", "run", *argv]))

    assert overrides() == []
    assert overrides("--int8", "--batch-tokens", "4096") == ["decode.batch_tokens=4096", "decode.quantize=int8"]
    assert overrides("--batch-size", "64") == ["decode.batch_size=64", "decode.batch_tokens=0"]
    assert overrides("--batch-tokens", "9", "decode.batch_tokens=7")[-1] == "decode.batch_tokens=7"
    with pytest.raises(SystemExit):
        overrides("--batch-size", "64", "--batch-tokens", "4096")
    assert "not allowed with argument --batch-size" in capsys.readouterr().err
    help_text = cli.build_parser()._subparsers._group_actions[0].choices[command].format_help()
    assert "decode.quantize=int8" in help_text and "decode.batch_tokens=N" in help_text


def test_a_demo_stopped_short_of_its_target_says_so_with_the_limit_and_how_to_train_on(tmp_path):
    """The demo's summary: a run that train.max_steps stopped before 100% validation exact says it is short of
    the target, which limit stopped it, the score it reached and the override that trains on."""
    run = tmp_path / "demo"
    quick = [setting for setting in TINY if not setting.startswith(("train.epochs", "train.eval_every",
                                                                    "train.target_exact_match"))]
    r = tformer("demo", "--run-dir", run, "--no-progress", *quick, "train.max_steps=3", "train.attention_examples=0",
                "train.threads=1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "until validation is 100% exact, at most 3 updates (train.max_steps)" in out.splitlines()[0]
    assert ("SHORT OF THE TARGET: train.max_steps=3 stopped the run at step 3, short of train.target_exact_match=1"
            in out)
    assert f"tformer train --run-dir {run} --resume train.max_steps=6" in out
    assert out.index("(ref)") < out.index("\nshort of the target (validation exact match")  # after the examples too
    assert "stopped the run at step 3, short of train.target_exact_match=1" in r.stderr  # the training log's


def test_the_decoding_message_names_every_rule_in_use_from_the_configs_fields():
    """describe_decode names each per-call decoding setting that differs from its default (read from
    DecodeConfig's metadata: a new rule's field is named without a change here), and none for the defaults."""
    import dataclasses

    from tformer.commands.common import describe_decode
    from tformer.config import Config, DecodeConfig

    plain = describe_decode(Config(), [])
    assert plain.startswith("greedy (from the checkpoint's decode section") and "penalty" not in plain
    cfg = Config(decode=DecodeConfig(strategy="beam", beam_size=3, unk_penalty=5.0, no_repeat_ngram=2, min_len=1))
    said = describe_decode(cfg, ["decode.unk_penalty=5"])
    assert said.startswith("beam 3, length penalty alpha 0.6")
    assert all(f"{k} {v}" in said for k, v in (("unk_penalty", 5.0), ("no_repeat_ngram", 2), ("min_len", 1)))
    assert "repetition_penalty" not in said and "beam_finish" not in said  # at their defaults
    changed = dataclasses.replace(cfg.decode, beam_finish="all")
    assert "beam_finish all" in describe_decode(dataclasses.replace(cfg, decode=changed), [])
