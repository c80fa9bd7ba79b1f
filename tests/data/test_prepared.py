"""Prepared corpora (tformer prepare): shards hold exactly what SentencePiece gives for the normalised raw
lines; the tokenizer is the whole-split one when the split is small and a seeded sample's otherwise; workers,
shard sizes and interruptions change nothing; damaged or foreign folders are refused by name; training reads
the shards by mmap and a killed run resumes exactly. Batch planning against a naive greedy packer."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from helpers.corpora import small_multi30k
from helpers.oracles import greedy_batch_ends
from tformer.checkpoint import load_checkpoint
from tformer.config import DataConfig
from tformer.data import load_task
from tformer.data.batching import BatchPlan
from tformer.data.corpus import filter_pairs, normalize, read_lines
from tformer.data.prepare import prepare
from tformer.data.prepared import PreparedCorpus, token_dtype
from tformer.data.translation import read_split, train_tokenizers
from tformer.errors import ConfigError, DataError
from tformer.training.state import TrainerState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data):
    return small_multi30k(shared_data, tmp_path_factory.mktemp("m30k"), n_train=2000, n_eval=60)


def _cfg(folder, **kw) -> DataConfig:
    base = dict(task="translation", dir=str(folder), train_prefix="train", valid_prefix="val",
                test_prefix="test2016", vocab_size=300, filter_max_len=40, filter_max_ratio=2.0, shard_size=300)
    base.update(kw)
    return DataConfig(**base)


def _raw(folder: Path, split: str) -> list[tuple[str, str]]:
    return list(zip(read_lines(folder / f"{split}.en.gz"), read_lines(folder / f"{split}.de.gz")))


def _receipts(path: Path) -> dict[str, str]:
    """Every shard file's SHA-256, by split/name."""
    out = {}
    for receipt in sorted(path.glob("*/*.json")):
        for name, info in json.loads(receipt.read_text())["files"].items():
            out[f"{receipt.parent.name}/{name}"] = info["sha256"]
    return out


def test_shards_hold_what_sentencepiece_gives_for_the_normalised_lines(corpus, tmp_path):
    cfg = _cfg(corpus)
    prepared = prepare(cfg, tmp_path / "p")
    tok = prepared.tokenizers[0]
    assert prepared.tokenizers[1] is tok and prepared.manifest["dtype"] == "uint16"
    # the oracle: normalise each raw line, encode it, filter as filter_pairs does (train only)
    raw = _raw(corpus, "train")
    ids = [(tok.encode(normalize(s)), tok.encode(normalize(t))) for s, t in raw]
    keep, _ = filter_pairs([len(s) for s, _ in ids], [len(t) for _, t in ids], 40, 2.0)
    train = prepared.examples("train")
    assert len(keep) < len(raw) and len(train) == len(keep) and train._starts[-1] == len(keep)
    assert list(train) == [ids[i] for i in keep]
    assert len(prepared.manifest["splits"]["train"]["inputs"]) == 2 and prepared.manifest["splits"]["train"]["shards"] == 7
    src, tgt = prepared.texts("train")
    assert src == [normalize(raw[i][0]) for i in keep] and tgt == [normalize(raw[i][1]) for i in keep]
    valid = prepared.examples("valid")  # never filtered
    assert list(valid) == [(tok.encode(normalize(s)), tok.encode(normalize(t))) for s, t in _raw(corpus, "val")]
    # lengths come from memory, exactly
    s_len, t_len = train.model_lengths()
    assert s_len.tolist() == [len(s) + 1 for s, _ in train] and t_len.tolist() == [len(t) + 1 for _, t in train]
    assert prepared.verify() == []


def test_small_splits_train_the_same_tokenizer_as_before_and_large_ones_a_seeded_sample(corpus, tmp_path):
    whole = prepare(_cfg(corpus), tmp_path / "whole")
    before = train_tokenizers(_cfg(corpus), read_split(_cfg(corpus), "train"))  # the whole split, in order
    assert whole.tokenizers[0].fingerprint() == before[0].fingerprint()
    assert whole.manifest["tokenizer"]["sample"]["pairs"] == 2000
    sampled = prepare(_cfg(corpus, tokenizer_sample=500, seed=7), tmp_path / "s7")
    info = sampled.manifest["tokenizer"]["sample"]
    assert (info["pairs"], info["of"], info["seed"]) == (500, 2000, 7)
    chosen = np.sort(np.random.default_rng(7).choice(2000, size=500, replace=False))
    split = read_split(_cfg(corpus), "train")
    oracle = train_tokenizers(_cfg(corpus), split.subset(chosen.tolist()))
    assert sampled.tokenizers[0].fingerprint() == oracle[0].fingerprint() != before[0].fingerprint()
    again = prepare(_cfg(corpus, tokenizer_sample=500, seed=7), tmp_path / "s7b")
    other = prepare(_cfg(corpus, tokenizer_sample=500, seed=8), tmp_path / "s8")
    assert again.tokenizers[0].fingerprint() == sampled.tokenizers[0].fingerprint() != other.tokenizers[0].fingerprint()


def test_workers_and_shard_sizes_change_nothing(corpus, tmp_path):
    one = prepare(_cfg(corpus), tmp_path / "one", workers=1)
    two = prepare(_cfg(corpus), tmp_path / "two", workers=2)
    assert _receipts(tmp_path / "one") == _receipts(tmp_path / "two") and len(_receipts(tmp_path / "two")) == 4 * 9
    assert list(two.examples("train")) == list(one.examples("train"))
    big = prepare(_cfg(corpus, shard_size=5000), tmp_path / "big")
    assert big.manifest["splits"]["train"]["shards"] == 1
    assert list(big.examples("train")) == list(one.examples("train"))
    assert big.texts("valid") == one.texts("valid")


@pytest.mark.slow
def test_a_killed_prepare_keeps_its_finished_shards_and_a_rerun_completes_it(shared_data, tmp_path):
    """SIGKILL a real `tformer prepare` once some shards are done: a rerun keeps them, removes what was half
    written and ends byte-identical to an uninterrupted prepare."""
    data = small_multi30k(shared_data, tmp_path / "data", n_train=29000, n_eval=100)
    args = ["prepare", "--config", "multi30k_en_de", f"data.dir={data}", "data.shard_size=1000", "data.workers=1",
            "data.vocab_size=2000", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "-m", "tformer", *args, "--out", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("train/*.json"))) < 3:
        time.sleep(0.02)
    p.kill()
    p.communicate()
    done = len(list(out.glob("train/*.json")))
    assert 3 <= done < 29, done
    finished = {f: f.stat().st_mtime_ns for f in out.glob("train/0000[0-2].*")}
    r = subprocess.run([sys.executable, "-m", "tformer", *args, "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "already prepared" in r.stderr
    assert {f: f.stat().st_mtime_ns for f in finished} == finished  # kept, not rewritten
    assert not list(out.glob("*/.*.tmp-*"))
    clean = tmp_path / "clean"
    r = subprocess.run([sys.executable, "-m", "tformer", *args, "--out", str(clean)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _receipts(out) == _receipts(clean) and len(_receipts(clean)) == 4 * 29 + 4 * 2


def test_a_full_disk_names_the_file_and_a_rerun_continues(corpus, tmp_path):
    """A file-size limit (what a full disk looks like to a writer: the write fails) stops the prepare with one
    message naming the file; nothing half-written stays, and the same command later completes."""
    out = tmp_path / "p"
    cmd = [sys.executable, "-m", "tformer", "prepare", "--config", "multi30k_en_de", f"data.dir={corpus}",
           "data.train_prefix=train", "data.valid_prefix=val", "data.test_prefix=test2016", "data.vocab_size=300",
           "data.shard_size=300", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    r = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert r.returncode == 2, r.stderr
    message = r.stderr.strip().splitlines()[-1]
    assert "could not write" in message and "File too large" in message and "run the same `tformer prepare`" in message
    assert "Traceback" not in r.stderr
    assert not list(out.glob("**/.*.tmp-*"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert PreparedCorpus.open(out).verify() == []


def test_another_corpus_or_a_foreign_folder_is_refused(corpus, tmp_path):
    prepare(_cfg(corpus), tmp_path / "p", splits=("valid",))
    with pytest.raises(DataError, match=r"holds another corpus: its manifest.json differs in filter.max_len \(40 there, 30 here\)"):
        prepare(_cfg(corpus, filter_max_len=30), tmp_path / "p", splits=("valid",))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="is not empty and holds no prepared corpus"):
        prepare(_cfg(corpus), tmp_path / "other")
    with pytest.raises(DataError, match="holds no prepared corpus"):
        PreparedCorpus.open(tmp_path / "other")
    with pytest.raises(DataError, match="no complete 'train' split"):
        PreparedCorpus.open(tmp_path / "p").examples("train")
    with pytest.raises(ConfigError, match="data.prepared"):
        DataConfig(task="copy", prepared=str(tmp_path / "p"))


def test_damaged_shards_and_manifests_are_named(corpus, tmp_path):
    def fresh(name):
        path = tmp_path / name
        prepare(_cfg(corpus), path, splits=("train",))
        return path

    p = fresh("truncated")
    tok = p / "train" / "00002.tok.npy"
    tok.write_bytes(tok.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"00002.json: shard 2 of 'train' is missing or incomplete"):
        PreparedCorpus.open(p).examples("train")
    p = fresh("resized")  # the receipt rewritten to match: the header check still catches it
    receipt = json.loads((p / "train" / "00001.json").read_text())
    tok = p / "train" / "00001.tok.npy"
    tok.write_bytes(tok.read_bytes()[:-10])
    receipt["files"]["00001.tok.npy"]["bytes"] -= 10
    (p / "train" / "00001.json").write_text(json.dumps(receipt))
    with pytest.raises(DataError, match=r"00001.tok.npy: .* bytes where its header needs .*truncated"):
        PreparedCorpus.open(p).examples("train")
    p = fresh("flipped")
    off = p / "train" / "00000.off.npy"
    data = bytearray(off.read_bytes())
    data[-3] ^= 0xFF
    off.write_bytes(bytes(data))
    assert any("00000.off.npy: SHA-256 differs" in x for x in PreparedCorpus.open(p).verify())
    p = fresh("garbage")
    (p / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json cannot be read"):
        PreparedCorpus.open(p)
    p = fresh("narrow")
    m = json.loads((p / "manifest.json").read_text())
    m["dtype"] = "uint8"  # ids that cannot hold the vocabulary
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"spm.model: 300 pieces do not fit the corpus's uint8 token ids \(at most 256\)"):
        PreparedCorpus.open(p)
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_a_damaged_cache_entry_is_rebuilt_and_a_checkpoint_tokenizer_reuses_its_corpus(corpus, caplog):
    first = load_task(_cfg(corpus), ("train", "valid"))
    assert type(first.examples["train"]).__name__ == "ShardedExamples" and isinstance(first.examples["valid"], list)
    folder = first.examples["train"].folder.parent
    want, want_texts = list(first.examples["train"]), first.texts["valid"]
    again = load_task(_cfg(corpus), ("train", "valid"), tokenizers=first.tokenizers)  # a resume
    assert again.examples["train"].folder.parent == folder
    tok = folder / "train" / "00000.tok.npy"
    del first, again  # their maps of the file damaged in place below (tformer itself only ever renames into place)
    tok.write_bytes(b"garbage")
    with caplog.at_level("WARNING", logger="tformer"):
        rebuilt = load_task(_cfg(corpus), ("train", "valid"))
    assert "rebuilding the damaged cache entry" in caplog.text
    assert list(rebuilt.examples["train"]) == want
    assert rebuilt.texts["valid"] == want_texts


def test_a_cache_entry_whose_corpus_is_not_found_or_not_ours_is_left_as_it_is(corpus, tmp_path, monkeypatch,
                                                                               caplog):
    """Only an entry found inconsistent with itself beside corpus files that are there is rebuilt: with the files
    out of reach (a relative data.dir read from another folder) the error names them and the entry keeps every
    byte; an entry another tformer version wrote is left too, the corpus prepared in a temporary folder."""
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "m30k"
    data.mkdir()
    for name in ("train.en.gz", "train.de.gz", "val.en.gz", "val.de.gz"):
        (data / name).write_bytes((corpus / name).read_bytes())
    first = load_task(_cfg(data), ("train", "valid"))
    want = {s: list(e) for s, e in first.examples.items()}
    load_task(_cfg(data), ("valid",), tokenizers=first.tokenizers)  # a checkpoint's: an entry of its own

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(tmp_path / "cache")): p.read_bytes()
                for p in sorted((tmp_path / "cache").rglob("*")) if p.is_file()}

    before = files()
    assert sum(name.endswith("valid/00000.tok.npy") for name in before) == 2
    data.rename(tmp_path / "moved")
    with pytest.raises(DataError, match=r"neither .*m30k/train.en nor .*m30k/train.en.gz exists"):
        load_task(_cfg(data), ("train", "valid"))
    with pytest.raises(DataError, match=r"neither .*m30k/val.en nor .*m30k/val.en.gz exists"):
        load_task(_cfg(data), ("valid",), tokenizers=first.tokenizers)  # an explorer's examples
    assert files() == before
    (tmp_path / "moved").rename(data)
    manifest = first.examples["train"].folder.parent / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "version": 99}))
    before = files()
    with caplog.at_level("WARNING", logger="tformer"):
        again = load_task(_cfg(data), ("train", "valid"))
    assert "newer than this tformer reads" in caplog.text and "for this process only" in caplog.text
    assert {s: list(e) for s, e in again.examples.items()} == want
    assert files() == before


def test_data_prepared_checks_the_checkpoint_tokenizer(corpus, tmp_path):
    prepare(_cfg(corpus), tmp_path / "a", splits=("valid",))
    other = prepare(_cfg(corpus, vocab_size=200), tmp_path / "b", splits=("valid",))
    with pytest.raises(DataError, match="another tokenizer than the checkpoint's"):
        load_task(_cfg(corpus, prepared=str(tmp_path / "a")), ("valid",), tokenizers=other.tokenizers)
    data = load_task(_cfg(corpus, prepared=str(tmp_path / "b"), vocab_size=999), ("valid",))  # the folder decides
    assert len(data.src_vocab) == 200


# ------------------------------------------------------------------------------------------ training on shards


TRAIN = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1",
         "model.dropout=0.1", "train.max_tokens=600", "train.max_steps=12", "train.save_every=3",
         "train.eval_every=0", "train.log_every=1", "train.threads=1", "train.attention_examples=0",
         "train.epochs=1000", "--no-progress"]


def _train(run: Path, prepared: Path, resume: bool = False) -> subprocess.Popen:
    args = ["train", "--config", "multi30k_en_de", f"data.prepared={prepared}", "--run-dir", str(run), *TRAIN]
    return subprocess.Popen([sys.executable, "-m", "tformer", *args, *(["--resume"] if resume else [])],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_training_on_a_prepared_corpus_killed_and_resumed_equals_a_straight_run(corpus, tmp_path):
    prepared = tmp_path / "prepared"
    prepare(_cfg(corpus, shard_size=700, filter_max_ratio=0.0), prepared)
    straight = _train(tmp_path / "straight", prepared)
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err
    run = tmp_path / "killed"
    p = _train(run, prepared)
    deadline = time.time() + 300
    latest = run / "checkpoints" / "latest"  # the pointer, not the folder: it is replaced just after the rename
    while time.time() < deadline and not (latest.exists() and latest.read_text().strip() >= "step_0000006"):
        time.sleep(0.02)
    p.kill()
    p.communicate()
    state = TrainerState.of(load_checkpoint(run, "latest"))
    assert 6 <= state.step < 12 and state.cursor == state.step  # mid-epoch: the cursor is what resumes
    p = _train(run, prepared, resume=True)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    a = load_file(str(load_checkpoint(tmp_path / "straight", "latest").path / "model.safetensors"))
    b = load_file(str(load_checkpoint(run, "latest").path / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(r):
        return [(x["step"], x["loss"]) for x in map(json.loads, (r / "metrics.jsonl").open()) if x["kind"] == "train"]

    assert losses(run) == losses(tmp_path / "straight") and len(losses(run)) == 12
    # the prepared folder moved: evaluation says where it looked, and takes the new place
    prepared.rename(tmp_path / "moved")
    cmd = [sys.executable, "-m", "tformer", "evaluate", "--checkpoint", str(run), "--split", "valid",
           "decode.max_len_a=0", "decode.max_len_b=2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"{prepared} holds no prepared corpus" in r.stderr, r.stderr
    r = subprocess.run(cmd + [f"data.prepared={tmp_path / 'moved'}"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "sacreBLEU" in r.stdout, r.stderr[-2000:]


# ------------------------------------------------------------------------------------------ batch planning


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 200)), min_size=0, max_size=600),
       extra=st.integers(0, 3000), max_sentences=st.integers(0, 40), seed=st.integers(0, 99), epoch=st.integers(0, 9))
def test_plan_packs_as_the_plain_greedy_loop_and_shuffles_within_length_buckets(lengths, extra, max_sentences,
                                                                                  seed, epoch):
    src = [s for s, _ in lengths]
    tgt = [t for _, t in lengths]
    max_tokens = max([max(s, t) for s, t in lengths], default=1) + extra
    plan = BatchPlan(src, tgt, max_tokens, max_sentences)
    order = sorted(range(len(lengths)), key=lambda i: (src[i], tgt[i]))
    assert plan.bounds.tolist() == greedy_batch_ends([max(src[i], tgt[i]) for i in order], max_tokens, max_sentences)
    a, b = plan.epoch(seed, epoch), plan.epoch(seed, epoch + 1)
    # each batch holds the same length profile every epoch (the packing is the lengths'), members may move
    profile = sorted(sorted((src[i], tgt[i]) for i in batch) for batch in a)
    assert profile == sorted(sorted((src[i], tgt[i]) for i in batch) for batch in b)
    assert sorted(i for batch in a for i in batch.tolist()) == list(range(len(lengths)))
    assert [x.tolist() for x in plan.epoch(seed, epoch)] == [x.tolist() for x in a]
