"""The translation task end to end on real Multi30k text: SentencePiece from train only and deterministic,
BLEU/chrF/tokenized BLEU against an independent BLEU, and train -> evaluate ->
translate -> average through the command line."""

import dataclasses
import gzip
import json
import logging
import subprocess
import sys

import pytest

from helpers.corpora import small_multi30k
from helpers.oracles import bleu_by_definition
from tformer.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from tformer.data import load_task
from tformer.metrics import moses_tokenize, translation_scores


def _data_cfg(folder, **kw):
    base = dict(task="translation", dir=str(folder), train_prefix="train", valid_prefix="val",
                test_prefix="test2016", vocab_size=400)
    base.update(kw)
    return DataConfig(**base)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from helpers.corpora import SHARED_DATA

    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"real corpora not found in {SHARED_DATA}; set TFORMER_SHARED_DATA")
    return small_multi30k(SHARED_DATA, tmp_path_factory.mktemp("m30k"), n_train=2000, n_eval=60)


def test_sentencepiece_is_deterministic_and_sees_train_only(corpus, tmp_path):
    a = load_task(_data_cfg(corpus), ("train", "test"))
    b = load_task(_data_cfg(corpus), ("train",))
    assert a.tokenizers[0].model_bytes == b.tokenizers[0].model_bytes  # same bytes, trained twice
    assert a.tokenizers[0] is a.tokenizers[1] and len(a.src_vocab) == 400
    # change valid and test completely: the tokenizer must not move
    other = tmp_path / "other"
    other.mkdir()
    for name in ("train.en.gz", "train.de.gz"):
        (other / name).write_bytes((corpus / name).read_bytes())
    for split in ("val", "test2016"):
        for lang in ("en", "de"):
            with gzip.open(other / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("Zyxwvut quorbl flimflam.\n" * 5)
    c = load_task(_data_cfg(other), ("train", "test"))
    assert c.tokenizers[0].fingerprint() == a.tokenizers[0].fingerprint()
    # ids are model ids: specials 0..3, and decode(encode(x)) == x on real text
    tok = a.tokenizers[1]
    for sent in a.texts["test"][1][:20]:
        ids = tok.encode(sent)
        assert min(ids) > 3 and tok.decode(ids + [2, 0]) == sent
    separate = load_task(_data_cfg(corpus, joint_vocab=False, subword="unigram", vocab_size=300), ("train",))
    assert separate.tokenizers[0] is not separate.tokenizers[1]
    assert separate.tokenizers[0].fingerprint() != separate.tokenizers[1].fingerprint()


def test_training_pairs_are_filtered_with_reasons(corpus, caplog):
    caplog.set_level(logging.INFO, logger="tformer")
    data = load_task(_data_cfg(corpus, filter_max_len=12, filter_max_ratio=1.5), ("train", "valid"))
    report = [r.message for r in caplog.records if "training pairs" in r.message]
    assert report and "dropped" in report[-1] and "longer than 12 tokens" in report[-1]
    assert all(0 < len(s) <= 12 and 0 < len(t) <= 12 for s, t in data.examples["train"])
    assert all(max(len(s), len(t)) <= 1.5 * min(len(s), len(t)) for s, t in data.examples["train"])
    assert len(data.examples["valid"]) == 60  # valid and test are never filtered


# --------------------------------------------------------------------------- metrics


def test_tokenized_bleu_equals_bleu_by_definition(shared_data):
    with gzip.open(shared_data / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f][:200]
    hyps = [" ".join(r.split()[:-2] + ["Hund", "."]) if i % 3 else r for i, r in enumerate(refs)]  # damage 2/3
    s = translation_scores(hyps, refs, "de")
    oracle = bleu_by_definition(moses_tokenize(hyps, "de"), moses_tokenize(refs, "de"))
    assert s.tok_bleu == pytest.approx(oracle, abs=1e-6)
    assert 20 < s.bleu < 100 and 20 < s.chrf < 100
    assert "case:mixed" in s.bleu_signature and "tok:13a" in s.bleu_signature and "nc:6|nw:0" in s.chrf_signature
    perfect = translation_scores(refs, refs, "de")
    assert perfect.bleu == perfect.tok_bleu == pytest.approx(100.0) and perfect.chrf == pytest.approx(100.0)


# --------------------------------------------------------------------------- end to end


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], capture_output=True, text=True, **kw)


@pytest.mark.slow
def test_train_evaluate_translate_average(corpus, tmp_path):
    import yaml

    from tformer.config import to_dict

    cfg = Config(
        model=ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=1, decoder_layers=1, norm="pre",
                          share_embeddings=True),
        data=_data_cfg(corpus, vocab_size=300),
        train=TrainConfig(max_tokens=1500, max_steps=6, eval_every=2, log_every=2, lr=2.0, warmup=4, keep_last=3,
                          patience=0),
        decode=DecodeConfig(max_len_a=1.0, max_len_b=5, batch_size=16),
    )
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    run = tmp_path / "run"
    r = _cli("train", "--config", tmp_path / "cfg.yaml", "--run-dir", run, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "BLEU" in r.stdout and (run / "spm.src.model").exists()
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "valid"]
    assert [v["step"] for v in valid] == [2, 4, 6] and all("bleu" in v and "chrf" in v for v in valid)
    best_step = max(valid, key=lambda v: (v["bleu"], -v["loss"]))["step"]
    assert (run / "checkpoints" / "best").read_text().strip() == f"step_{best_step:07d}"
    assert (run / "checkpoints" / f"step_{best_step:07d}" / "spm.tgt.model").exists()

    r = _cli("evaluate", "--checkpoint", run, "--split", "test", "--beam", "3", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert {"bleu", "chrf", "tok_bleu"} <= set(report) and report["decode"]["strategy"] == "beam"
    assert report["signatures"]["bleu"].startswith("nrefs:1")

    text = "A man in a blue shirt is standing on a ladder.\n\nTwo dogs play in the snow.\n"
    r = _cli("translate", "--checkpoint", run, "--beam", "3", "--batch-size", "2", input=text)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # line count kept, the empty line stays empty
    assert "▁" not in r.stdout  # detokenised
    r1 = _cli("translate", "--checkpoint", run, "--beam", "3", "--batch-size", "1", input=text)
    assert r1.stdout == r.stdout  # batch size does not change the output
    nb = _cli("translate", "--checkpoint", run, "--beam", "3", "--nbest", "3", input=text)
    rows = [line.split(" ||| ") for line in nb.stdout.splitlines()]
    assert nb.returncode == 0 and [row[0] for row in rows] == ["0"] * 3 + ["1"] + ["2"] * 3
    assert rows[0][1] == out[0]
    bad = _cli("translate", "--checkpoint", run, "--nbest", "3", input=text)
    assert bad.returncode == 2 and "greedy search has one hypothesis" in bad.stderr

    r = _cli("average", "--run-dir", run, "--last", "3", "--out", tmp_path / "avg")
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file

    steps = [run / "checkpoints" / f"step_{s:07d}" for s in (2, 4, 6)]
    tensors = [load_file(str(p / "model.safetensors")) for p in steps]
    avg = load_file(str(tmp_path / "avg" / "model.safetensors"))
    for k, v in avg.items():
        assert (v - sum(t[k] for t in tensors) / 3).abs().max() < 1e-6
    r = _cli("evaluate", "--checkpoint", tmp_path / "avg", "--split", "valid")
    assert r.returncode == 0 and "sacreBLEU" in r.stdout, r.stderr
    again = _cli("average", "--run-dir", run, "--last", "3", "--out", tmp_path / "avg")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_share_embeddings_needs_a_joint_vocabulary(corpus):
    with pytest.raises(ValueError, match="data.joint_vocab=true"):
        load_task(dataclasses.replace(_data_cfg(corpus), joint_vocab=False), ("train",), joint=True)


def test_resume_reuses_the_run_tokenizer_and_bad_tokenizer_files_are_named(corpus, tmp_path, monkeypatch):
    from tformer.checkpoint import CheckpointError, load_checkpoint
    from tformer.data import translation
    from tformer.training.loop import train

    cfg = Config(model=ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1),
                 data=_data_cfg(corpus, vocab_size=200),
                 train=TrainConfig(max_tokens=1000, max_steps=2, eval_every=2, log_every=1, warmup=2))
    train(cfg, tmp_path / "run")
    first = (tmp_path / "run" / "spm.src.model").read_bytes()

    def no_training(*a, **k):
        raise AssertionError("resume must not train a new tokenizer")

    monkeypatch.setattr(translation, "train_sentencepiece", no_training)
    resumed = train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=3)), tmp_path / "run",
                    resume=True)
    assert resumed.step == 3 and (tmp_path / "run" / "spm.src.model").read_bytes() == first
    ckpt_dir = resumed.checkpoint
    (ckpt_dir / "spm.tgt.model").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"spm\.tgt\.model is not a SentencePiece model"):
        load_checkpoint(ckpt_dir)


def test_tsv_corpus_through_load_task(shared_data, tmp_path):
    with gzip.open(shared_data / "fra-eng" / "fra.txt.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(3000)]
    (tmp_path / "fra.txt").write_text("".join(lines), encoding="utf-8")
    cfg = DataConfig(task="translation", format="tsv", tsv=str(tmp_path / "fra.txt"), tgt_lang="fr",
                     valid_size=100, test_size=200, vocab_size=300)
    data = load_task(cfg)
    sizes = {k: len(v[0]) for k, v in data.texts.items()}
    assert sum(sizes.values()) == 3000 and sizes["test"] >= 200 and sizes["valid"] >= 100
    assert not set(data.texts["test"][0]) & set(data.texts["train"][0])  # grouped by English sentence
    assert ("Go.", "Va !") in set(zip(*data.texts["train"])) | set(zip(*data.texts["valid"])) | \
        set(zip(*data.texts["test"]))
    missing = dataclasses.replace(cfg, tsv=str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match=r"nope\.txt does not exist; check data\.tsv"):
        load_task(missing)
