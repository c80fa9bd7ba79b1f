"""Distillation's corpus (tformer.distill, `tformer distill`) against oracles: the written targets are the
teacher's translations of the same lines (Translator.translate), its n-best selection keeps the hypothesis
with the highest sentence chrF computed here with sacreBLEU, a run stopped midway and run again gives the
files a straight run gives, and a folder holding another distillation, misaligned references or an n-best
without references are refused by name."""

import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import CHRF

import tformer
from tformer.distill import distill_corpus, pick
from tformer.errors import ConfigError, DataError

from helpers.serve import CHECKPOINT, LINES

SOURCES = LINES[:7] + [""] + LINES[7:12]  # an empty line stays an empty line
REFS = [line.upper() for line in SOURCES]  # the checkpoint's "German" is its input in capitals


@pytest.fixture(scope="module")
def teacher():
    return tformer.load(CHECKPOINT, device="cpu")


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_the_targets_are_the_teachers_translations_line_by_line(teacher, tmp_path):
    src = write(tmp_path / "c.en", SOURCES)
    report = distill_corpus(teacher, src, tmp_path / "out", beam=3, chunk_size=4)
    assert read(tmp_path / "out" / "train.en") == SOURCES
    assert read(tmp_path / "out" / "train.de") == [t.text for t in teacher.translate(SOURCES, beam=3)]
    assert (report.lines, report.chunks, report.resumed_chunks) == (len(SOURCES), 4, 0)


def test_nbest_selection_keeps_the_hypothesis_closest_to_the_reference_by_sentence_chrf(teacher, tmp_path):
    src, ref = write(tmp_path / "c.en", SOURCES), write(tmp_path / "c.de", REFS)
    distill_corpus(teacher, src, tmp_path / "out", references=ref, beam=4, nbest=4, chunk_size=5)
    chrf, want = CHRF(), []
    for t, r in zip(teacher.translate(SOURCES, beam=4, nbest=4), REFS):
        scores = [chrf.sentence_score(h.text, [r]).score for h in t.hypotheses]
        want.append(t.hypotheses[scores.index(max(scores))].text)  # the first of the best
    got = read(tmp_path / "out" / "train.de")
    assert got == want
    assert got != [t.text for t in teacher.translate(SOURCES, beam=4)]  # the selection changed something
    assert pick(["a b", "a b c"], "a b c") == 1 and pick(["x", "x"], "x") == 0 and pick(["y", "z"], None) == 0


def test_a_run_stopped_midway_goes_on_where_it_stopped_and_ends_as_a_straight_run(teacher, tmp_path, monkeypatch):
    src, ref = write(tmp_path / "c.en", SOURCES), write(tmp_path / "c.de", REFS)
    options = dict(references=ref, beam=3, nbest=2, chunk_size=3)
    distill_corpus(teacher, src, tmp_path / "straight", **options)
    real, calls = teacher.translate, []

    def dies_on_the_third_chunk(sources, **kw):
        calls.append(len(sources))
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of a chunk
        return real(sources, **kw)

    monkeypatch.setattr(teacher, "translate", dies_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        distill_corpus(teacher, src, tmp_path / "stopped", **options)
    assert sorted(p.name for p in (tmp_path / "stopped" / "parts").iterdir()) == ["000000.tgt", "000001.tgt"]
    assert not (tmp_path / "stopped" / "train.de").exists()
    monkeypatch.setattr(teacher, "translate", real)
    report = distill_corpus(teacher, src, tmp_path / "stopped", **options)
    assert report.resumed_chunks == 2 and report.chunks == 5
    for name in ("train.en", "train.de"):
        assert read(tmp_path / "stopped" / name) == read(tmp_path / "straight" / name)


def test_another_distillation_misaligned_references_and_nbest_without_them_are_refused(teacher, tmp_path):
    src = write(tmp_path / "c.en", SOURCES)
    distill_corpus(teacher, src, tmp_path / "out", beam=3, chunk_size=4)
    with pytest.raises(ConfigError, match=r"holds a distillation of other inputs or settings \(decode differ\)"):
        distill_corpus(teacher, src, tmp_path / "out", beam=4, chunk_size=4)
    with pytest.raises(ConfigError, match="nbest=2 keeps the hypothesis closest to the reference"):
        distill_corpus(teacher, src, tmp_path / "other", beam=3, nbest=2)
    short = write(tmp_path / "short.de", REFS[:5])
    with pytest.raises(DataError, match="short.de ends at line 5 but .*c.en goes on"):
        distill_corpus(teacher, src, tmp_path / "o2", references=short, beam=3, nbest=2, chunk_size=4)
    long = write(tmp_path / "long.de", REFS + ["MORE"])
    with pytest.raises(DataError, match="long.de has more lines than"):
        distill_corpus(teacher, src, tmp_path / "o3", references=long, beam=3, nbest=2)
    with pytest.raises(DataError, match="is empty"):
        distill_corpus(teacher, write(tmp_path / "empty.en", []), tmp_path / "o4", beam=3)


def test_the_command_distils_and_resumes(teacher, tmp_path):
    src, ref = write(tmp_path / "c.en", SOURCES), write(tmp_path / "c.de", REFS)
    args = [sys.executable, "-m", "tformer", "distill", "--checkpoint", str(CHECKPOINT), "--src", str(src),
            "--ref", str(ref), "--out", str(tmp_path / "out"), "--beam", "3", "--nbest", "2", "--chunk-size", "5",
            "--no-progress"]
    first = subprocess.run(args, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert f"{len(SOURCES)} lines in" in first.stdout
    (tmp_path / "out" / "parts" / "000002.tgt").unlink()  # as if stopped before the last chunk
    again = subprocess.run(args, capture_output=True, text=True)
    assert again.returncode == 0 and "(2 of 3 chunks from an earlier run)" in again.stdout
    want = distill_corpus(teacher, src, tmp_path / "api", references=ref, beam=3, nbest=2, chunk_size=5)
    assert read(tmp_path / "out" / "train.de") == read(Path(want.targets))


STUDENT = """model: {d_model: 16, n_heads: 2, d_ff: 32, encoder_layers: 2, decoder_layers: 1, dropout: 0.0}
data: {task: translation, format: files, subword: bpe, vocab_size: 60, joint_vocab: true}
train: {max_steps: 30, epochs: 100, eval_every: 0, warmup: 10, lr: 3.0, max_tokens: 1000, patience: 0}
decode: {beam_size: 2}
"""


def test_the_student_trains_on_the_distilled_corpus_and_is_compared_with_its_teacher(teacher, tmp_path, capsys):
    import json
    import random

    from tformer.cli import main
    from tformer.distill import student_overrides
    from tformer.metrics import translation_scores
    from tformer.shortlist import Shortlist

    pytest.importorskip("eflomal", reason="pip install eflomal (part of the test extra)")
    words = "a big cat child dog eats house man red runs sees small the woman".split()
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(260)]
    src = write(tmp_path / "c.en", lines[:200])
    for split, part in (("v", lines[200:230]), ("t", lines[230:])):
        write(tmp_path / f"{split}.en", part), write(tmp_path / f"{split}.de", [s.upper() for s in part])
    recipe = tmp_path / "student.yaml"
    recipe.write_text(STUDENT, encoding="utf-8")
    out, run = tmp_path / "distilled", tmp_path / "student"
    assert main(["distill", "--checkpoint", str(CHECKPOINT), "--src", str(src), "--out", str(out), "--beam", "2",
                 "--no-progress", "--student", str(recipe), "--student-dir", str(run),
                 "--student-set", f"data.valid_prefix={tmp_path / 'v'}",
                 "--student-set", f"data.test_prefix={tmp_path / 't'}"]) == 0
    printed = capsys.readouterr().out
    student = tformer.load(run, device="cpu")
    data = student.config.data
    assert (Path(data.dir), data.train_prefix, data.src_lang, data.tgt_lang) == (out.resolve(), "train", "en", "de")
    assert student.config.model.encoder_layers == 2 and student.config.model.decoder_layers == 1
    report = json.loads((run / "distill_report.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in report["rows"]] == ["teacher", "student", "student, int8 + shortlist"]
    Shortlist.load(report["shortlist"]).check(student)
    tests = read(tmp_path / "t.en")
    refs = [s.upper() for s in tests]
    for name, translator in (("teacher", teacher), ("student", student)):
        want = translation_scores([t.text for t in translator.translate(tests, beam=2)], refs, "de")
        row = next(r for r in report["rows"] if r["name"] == name)
        assert row["bleu"] == pytest.approx(want.bleu, abs=0.01) and row["chrf"] == pytest.approx(want.chrf, abs=0.01)
    assert f"| teacher | {report['rows'][0]['bleu']:.2f} |" in printed and "| 1.00x |" in printed
    assert student_overrides(teacher, out)[0] == f"data.dir={out.resolve()}"
    assert main(["distill", "--checkpoint", str(CHECKPOINT), "--src", str(src), "--out", str(out), "--student",
                 "x"]) == 2
    assert "--student needs --student-dir" in capsys.readouterr().err


TSV_TEACHER = """model: {d_model: 16, n_heads: 2, d_ff: 32, encoder_layers: 1, decoder_layers: 1, dropout: 0.0}
data: {task: translation, format: tsv, tsv: TSV, src_lang: en, tgt_lang: de, valid_size: 20, test_size: 20,
       subword: bpe, vocab_size: 60, joint_vocab: true}
train: {max_steps: 5, epochs: 100, eval_every: 0, warmup: 10, lr: 3.0, max_tokens: 1000, patience: 0}
"""


def test_a_tsv_teachers_own_training_split_is_distilled_and_its_valid_and_test_go_to_the_student(tmp_path, capsys):
    """A teacher trained on one TSV file (split by seed) has no split files: `tformer distill` without --src
    translates its training split, and the student's overrides write its valid and test splits beside the
    distilled corpus. Oracles: the teacher's own load_split and translate."""
    import random

    from tformer.cli import main
    from tformer.distill import student_overrides

    words = "a big cat child dog eats house man red runs sees small the woman".split()
    rng = random.Random(1)
    lines = sorted({" ".join(rng.choice(words) for _ in range(rng.randint(3, 6))) for _ in range(150)})
    tsv = write(tmp_path / "pairs.tsv", [f"{s}\t{s.upper()}" for s in lines])
    recipe = tmp_path / "teacher.yaml"
    recipe.write_text(TSV_TEACHER.replace("TSV", str(tsv)), encoding="utf-8")
    tformer.train(recipe, tmp_path / "teacher")
    teacher = tformer.load(tmp_path / "teacher", device="cpu")
    out = tmp_path / "distilled"
    assert main(["distill", "--checkpoint", str(tmp_path / "teacher"), "--out", str(out), "--beam", "2",
                 "--nbest", "2", "--no-progress"]) == 0
    train_src, train_ref = teacher.load_split("train").texts["train"]
    assert (read(out / "source.en"), read(out / "source.de")) == (train_src, train_ref)
    assert read(out / "train.en") == train_src and len(read(out / "train.de")) == len(train_src)
    want = distill_corpus(teacher, out / "source.en", tmp_path / "api", references=out / "source.de", beam=2, nbest=2)
    assert read(out / "train.de") == read(Path(want.targets))
    # the same command again resumes on the same recorded sources
    assert main(["distill", "--checkpoint", str(tmp_path / "teacher"), "--out", str(out), "--beam", "2",
                 "--nbest", "2", "--no-progress"]) == 0
    assert "(1 of 1 chunks from an earlier run)" in capsys.readouterr().out
    overrides = student_overrides(teacher, out)
    assert overrides[-2:] == ["data.valid_prefix=valid", "data.test_prefix=test"] and "data.format=files" in overrides
    for split in ("valid", "test"):
        src, ref = teacher.load_split(split).texts[split]
        assert (read(out / f"{split}.en"), read(out / f"{split}.de")) == (src, ref) and len(src) >= 20
    assert not set(read(out / "test.en")) & set(train_src)  # the teacher's split, kept apart
    assert main(["distill", "--checkpoint", str(tmp_path / "teacher"), "--out", str(out), "--ref",
                 str(out / "source.de")]) == 2
    assert "--ref is the target side of --src" in capsys.readouterr().err
