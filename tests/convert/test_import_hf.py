"""Hugging Face MarianMT (OPUS-MT) folders read by tformer, with transformers as the oracle: token ids equal
MarianTokenizer's, teacher-forced logits and log-probabilities equal MarianMTModel's, greedy output equals
generate(num_beams=1); `tformer import hf-marian` writes a run folder that decodes identically; a damaged or
foreign folder is a CheckpointError naming the file (and the field), with nothing written."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
from helpers.hf_marian_models import TAGS, make_folder  # noqa: E402

import tformer  # noqa: E402
import tformer.cli  # noqa: E402
from tformer.config import DecodeConfig, same_architecture  # noqa: E402
from tformer.errors import CheckpointError  # noqa: E402
from tformer.inference import score_ids, translate_ids  # noqa: E402

SOURCES = ["A man in a blue shirt is standing on a ladder.", ">>deu<< Two dogs play in the snow.",
           "Three children are running on the beach near a big wave", "A woman sings."]
TARGETS = ["Ein Mann steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.", "Kinder rennen am Strand",
           "Eine Frau singt auf der Bühne vor vielen Leuten."]
VARIANTS = {  # the settings a MarianConfig may have that change the network
    "opus-mt": {},  # swish, one table for source, target and output, embeddings x sqrt(d)
    "gelu-untied": {"activation": "gelu", "tie": False, "scale_embedding": False},
    "relu-separate-tables": {"activation": "relu", "share": False, "tie": True},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: make_folder(root / name, seed=i, **kw) for i, (name, kw) in enumerate(VARIANTS.items())}


def hf_pair(folder):
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)


def assert_same_tensors(a, b):
    """Two state dicts: the same names, and under each name the same tensor (not merely the same values in
    order: a renamed, missing or extra tensor fails)."""
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))[:5]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def original(translator, ids, side="target"):
    """tformer ids -> the folder's own ids."""
    tok = translator.source_tokenizer if side == "source" else translator.target_tokenizer
    return [tok.original[i] for i in ids]


def test_token_ids_equal_marian_tokenizers(folders):
    t = tformer.load(folders["opus-mt"], device="cpu")
    _, tok = hf_pair(folders["opus-mt"])
    texts = SOURCES + ["a dog", ">>fra<< un chat", "Übermäßig große Häuser 123 ..."]
    unknown = tag = 0
    for text in texts:
        ids = t.encode(text)
        assert original(t, ids, "source") + [tok.eos_token_id] == tok(text)["input_ids"], text
        unknown += ids.count(t.source_tokenizer.vocab.unk)
        tag += sum(p in TAGS for p in t.pieces(ids, "source"))
    assert unknown >= 1 and tag == 2  # '▁a' is missing from vocab.json; each tag is one entry
    for text in TARGETS:
        want = tok(text_target=text)["input_ids"]
        assert original(t, t.encode(text, "target")) + [tok.eos_token_id] == want


def teacher_forced(folder):
    """(tformer logits in the folder's id order, Hugging Face logits, real-position mask) on a padded batch."""
    t = tformer.load(folder, device="cpu")
    hf, tok = hf_pair(folder)
    start = hf.config.decoder_start_token_id
    src = tok(SOURCES, return_tensors="pt", padding=True)
    tgt = tok(text_target=TARGETS, return_tensors="pt", padding=True)
    dec_in = torch.cat([torch.full((len(TARGETS), 1), start), tgt.input_ids[:, :-1]], 1)
    dec_mask = torch.cat([torch.ones(len(TARGETS), 1, dtype=torch.long), tgt.attention_mask[:, :-1]], 1)
    with torch.no_grad():
        ref = hf(input_ids=src.input_ids, attention_mask=src.attention_mask, decoder_input_ids=dec_in,
                 decoder_attention_mask=dec_mask).logits  # (B, T, V)
        ours = {m: i for i, m in enumerate(t.target_tokenizer.original)}  # the start row: tformer's <s> (1)
        src_ids = torch.tensor([[ours[m] for m in row] for row in src.input_ids.tolist()])
        tgt_ids = torch.tensor([[ours[m] for m in row] for row in dec_in.tolist()])
        src_ids[src.attention_mask == 0] = 0
        tgt_ids[dec_mask == 0] = 0
        out = t.model(src_ids, src.attention_mask.sum(1), tgt_ids, dec_mask.sum(1))
        logits = t.model.generator(out.padded())  # (B, T, V + 1): <pad> and <s> both hold the start row
    mine = torch.full_like(ref, float("nan"))
    mine[..., original(t, range(1, logits.shape[-1]))] = logits[..., 1:]  # every original id once
    return mine, ref, logits, dec_mask.bool()


@pytest.mark.parametrize("variant", VARIANTS)
def test_teacher_forced_logits_equal_hugging_face(folders, variant):
    mine, ref, logits, real = teacher_forced(folders[variant])
    assert not mine.isnan().any()
    assert ((mine - ref).abs() / ref.abs().clamp(min=1))[real].max() <= 1e-5  # conftest.REL's rule
    # tformer's extra <pad> entry takes no probability: the log-softmax over V + 1 equals MarianMT's over V
    assert (logits.log_softmax(-1)[..., 0][real].exp() == 0).all()
    assert (logits.log_softmax(-1)[..., 1:].exp().sum(-1)[real] - 1).abs().max() <= 1e-5
    assert (logits.log_softmax(-1)[..., 1:].max(-1).values - ref.log_softmax(-1).max(-1).values)[real].abs().max() \
        <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
def test_scores_equal_hugging_face_log_probabilities(folders, variant):
    t = tformer.load(folders[variant], device="cpu")
    hf, tok = hf_pair(folders[variant])
    scored = t.score(SOURCES, TARGETS)
    for s, x, got in zip(SOURCES, TARGETS, scored):
        src = tok(s, return_tensors="pt")
        labels = tok(text_target=x, return_tensors="pt").input_ids
        with torch.no_grad():
            lp = hf(**src, labels=labels).logits.log_softmax(-1)[0]
        want = float(lp.gather(1, labels[0][:, None]).sum())
        assert abs(got.log_prob - want) <= 1e-5 * max(1.0, abs(want)), (s, got.log_prob, want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_equals_generate(folders, variant):
    t = tformer.load(folders[variant], device="cpu")
    hf, tok = hf_pair(folders[variant])
    N = 24
    sources = [t.encode(s) for s in SOURCES]
    got = translate_ids(t.model, sources, DecodeConfig(strategy="greedy", max_len_a=0.0, max_len_b=N))
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    with torch.no_grad():
        gen = hf.generate(**tok(SOURCES, return_tensors="pt", padding=True), num_beams=1, do_sample=False,
                          max_new_tokens=N + 1, bad_words_ids=[[pad]], forced_eos_token_id=None)
    for ours, row in zip(got.tokens, gen.tolist()):
        row = row[1:]  # the start token
        want = row[: row.index(eos)] if eos in row else row
        assert original(t, ours[0]) == [x for x in want if x != pad][:N]


@pytest.mark.parametrize("eos_bias", [2.5, 3.5])
def test_beam_equals_generate_under_the_power_length_penalty(tmp_path, eos_bias):
    """Beam 4 ranked by logprob / length ** alpha, as Hugging Face ranks: the same outputs and scores, for
    outputs that end early, late and at the limit; loaded with the folder's defaults (num_beams 4, alpha 1)."""
    folder = make_folder(tmp_path / "opus", seed=0, eos_bias=eos_bias)
    t = tformer.load(folder, device="cpu")
    hf, tok = hf_pair(folder)
    assert (t.config.decode.strategy, t.config.decode.beam_size, t.config.decode.len_penalty_rule) == \
        ("beam", 4, "power")
    sources = SOURCES + ["A dog.", "Two men and a woman sit at a table with food and drinks in a restaurant"]
    N = 40
    lengths = set()
    for alpha in (1.0, 0.6):
        cfg = dataclasses.replace(t.config.decode, len_penalty=alpha, max_len_a=0.0, max_len_b=N)
        got = translate_ids(t.model, [t.encode(s) for s in sources], cfg)
        with torch.no_grad():
            gen = hf.generate(**tok(sources, return_tensors="pt", padding=True), num_beams=4, length_penalty=alpha,
                              max_new_tokens=N, max_length=None, forced_eos_token_id=None, output_scores=True,
                              return_dict_in_generate=True)
        for ours, score, row, want in zip(got.tokens, got.scores, gen.sequences.tolist(),
                                          gen.sequences_scores.tolist()):
            row = row[1:]
            row = [x for x in (row[: row.index(0)] if 0 in row else row) if x != hf.config.pad_token_id]
            assert original(t, ours[0]) == row
            assert abs(score[0] - want) <= 1e-5 * max(1.0, abs(want))
            lengths.add(len(row))
    assert len(lengths) >= 2  # outputs of different lengths: the penalty decided something


def test_import_writes_a_run_folder_that_decodes_identically(folders, tmp_path):
    src = folders["opus-mt"]
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tformer", "import", "hf-marian", str(src), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    direct, imported = tformer.load(src, device="cpu"), tformer.load(out, device="cpu")
    assert_same_tensors(direct.model.state_dict(), imported.model.state_dict())
    assert [x.text for x in direct.translate(SOURCES, beam=3)] == [x.text for x in imported.translate(SOURCES, beam=3)]
    info = json.loads((imported.path / "trainer.json").read_text())
    assert info["imported_from"] == {"format": "hf-marian", "path": str(src.resolve())}
    again = subprocess.run([sys.executable, "-m", "tformer", "import", "hf-marian", str(src), str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr


def test_safetensors_and_pytorch_bin_load_the_same_model(folders, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "bin"
    shutil.copytree(folders["gelu-untied"], folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    a, b = tformer.load(folders["gelu-untied"], device="cpu"), tformer.load(folder, device="cpu")
    assert_same_tensors(a.model.state_dict(), b.model.state_dict())


class Foreign:
    def __reduce__(self):
        return (print, ("this ran",))


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def _drop_vocab_entry(folder):
    table = json.loads((folder / "vocab.json").read_text())
    table.pop(next(p for p, i in table.items() if i == 5))
    (folder / "vocab.json").write_text(json.dumps(table))


def _spaced_piece(folder):
    table = json.loads((folder / "vocab.json").read_text())
    table["a b"] = table.pop(next(p for p, i in table.items() if i == 7))
    (folder / "vocab.json").write_text(json.dumps(table))


def _foreign_bin(folder):
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({**tensors, "extra": Foreign()}, folder / "pytorch_model.bin")


BAD = {  # damage -> what the message must name
    "no source.spm": (lambda f: (f / "source.spm").unlink(), ["source.spm"]),
    "no vocab.json": (lambda f: (f / "vocab.json").unlink(), ["vocab.json"]),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), ["model.safetensors"]),
    "bart": (lambda f: _edit_config(f, model_type="bart"), ["config.json", "model_type", "'bart'"]),
    "activation": (lambda f: _edit_config(f, activation_function="tanh"),
                   ["config.json", "activation_function", "'tanh'"]),
    "pre-norm": (lambda f: _edit_config(f, normalize_before=True), ["config.json", "normalize_before", "True"]),
    "heads": (lambda f: _edit_config(f, decoder_attention_heads=2), ["decoder_attention_heads", "2"]),
    "vocab misses an entry": (_drop_vocab_entry, ["vocab.json", "does not match the weights"]),
    "a piece with a space": (_spaced_piece, ["vocab.json", "whitespace"]),
    "vocab_size": (lambda f: _edit_config(f, vocab_size=77, decoder_vocab_size=77),
                   ["vocab.json", "'vocab_size' is 77", "does not match the weights"]),
    "foreign pickle": (_foreign_bin, ["pytorch_model.bin", "other than tensors"]),
    "truncated weights": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:999]),
                          ["model.safetensors"]),
}


@pytest.mark.parametrize("damage", BAD)
def test_a_bad_folder_is_refused_by_name_and_nothing_is_written(folders, tmp_path, damage, capfd):
    folder = tmp_path / "opus"
    shutil.copytree(folders["opus-mt"], folder)
    harm, names = BAD[damage]
    harm(folder)
    with pytest.raises(CheckpointError) as e:
        tformer.load(folder, device="cpu")
    for name in names:
        assert name in str(e.value), (name, str(e.value))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tformer", "import", "hf-marian", str(folder), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and names[0] in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and "this ran" not in proc.stdout + capfd.readouterr().out


def test_a_hub_name_says_how_to_download(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="never downloads.*huggingface-cli download Helsinki-NLP/opus-mt-en-de"):
        tformer.load("Helsinki-NLP/opus-mt-en-de")


def test_import_then_export_gives_the_folder_back_tensor_for_tensor(folders, tmp_path):
    from safetensors.torch import load_file

    from tformer.export import export_hf_marian

    src = folders["opus-mt"]
    assert tformer.cli.main(["import", "hf-marian", str(src), str(tmp_path / "run")]) == 0
    assert tformer.cli.main(["export", "--format", "hf-marian", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    back = tmp_path / "hf"
    a, b = load_file(str(src / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].numpy().tobytes() == b[name].numpy().tobytes(), name
    assert json.loads((back / "vocab.json").read_text()) == json.loads((src / "vocab.json").read_text())
    for name in ("source.spm", "target.spm"):
        assert (back / name).read_bytes() == (src / name).read_bytes()
    want, got = (json.loads((f / "config.json").read_text()) for f in (src, back))
    for key in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "activation_function", "scale_embedding",
                "pad_token_id", "eos_token_id", "decoder_start_token_id", "share_encoder_decoder_embeddings",
                "tie_word_embeddings", "max_position_embeddings"):
        assert got[key] == want[key], key
    assert not (back / "target_vocab.json").exists()  # one table, two SentencePiece models: one vocab.json
    with pytest.raises(CheckpointError, match="exists.*--force"):
        export_hf_marian(tmp_path / "run", back)
    with pytest.raises(CheckpointError, match="is \\(or holds\\) the model being read"):
        export_hf_marian(tmp_path / "run", tmp_path, force=True)  # --force never deletes what it reads
    assert (tmp_path / "run").is_dir()


@pytest.fixture(scope="module")
def native_runs(tmp_path_factory):
    """tformer-trained translation models (a few updates on Multi30k): one joint vocabulary with one shared
    table, and separate vocabularies and tables."""
    from helpers.corpora import SHARED_DATA, small_multi30k
    from tformer.config import Config, DataConfig, ModelConfig, TrainConfig
    from tformer.training.loop import train

    root = tmp_path_factory.mktemp("native")
    corpus = small_multi30k(SHARED_DATA, root / "m30k", n_train=600, n_eval=20)
    runs = {}
    for name, joint in (("joint", True), ("separate", False)):
        cfg = Config(model=ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                                       share_embeddings=joint, activation="gelu"),
                     data=DataConfig(task="translation", dir=str(corpus), train_prefix="train", valid_prefix="val",
                                     test_prefix="test2016", vocab_size=200, joint_vocab=joint),
                     train=TrainConfig(max_tokens=512, max_steps=30, epochs=1, warmup=10, eval_every=30))
        train(cfg, root / name)
        runs[name] = root / name
    return runs


@pytest.mark.parametrize("name", ["joint", "separate"])
def test_a_tformer_model_exported_to_hugging_face_decodes_the_same_and_comes_back_identical(native_runs, name,
                                                                                         tmp_path):
    from tformer.export import export_hf_marian

    run = native_runs[name]
    out = export_hf_marian(run, tmp_path / "hf")
    assert (out / "target_vocab.json").exists() == (name == "separate")
    t = tformer.load(run, device="cpu")
    hf, tok = hf_pair(out)
    sources = ["A man rides a bike.", "Two women are talking in a kitchen.", "A child."]
    for s in sources:  # MarianTokenizer reads the exported files to tformer's ids
        assert tok(s)["input_ids"] == t.encode(s) + [2]
    got = translate_ids(t.model, [t.encode(s) for s in sources],
                        DecodeConfig(strategy="greedy", max_len_a=0.0, max_len_b=20))
    with torch.no_grad():
        gen = hf.generate(**tok(sources, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=21)
    for ours, row in zip(got.tokens, gen.tolist()):
        row = row[1:]
        assert ours[0] == [x for x in (row[: row.index(2)] if 2 in row else row) if x != 0][:20]
    assert [t.decode(o[0]) for o in got.tokens] == [tok.decode(o[0], skip_special_tokens=True) for o in got.tokens]
    back = tformer.load(out, device="cpu")  # and read back: the same network, the same tokenizers' ids
    assert_same_tensors(t.model.state_dict(), back.model.state_dict())
    assert back.config.model.sinusoid == "interleaved"  # tformer's own table travelled in the file
    assert same_architecture(back.config.model, t.config.model)  # tables shared or not, output tied or not
    assert back.config.decode.len_penalty_rule == "power"  # Hugging Face's only rule: the folder's default now
    same = dict(beam=3, len_penalty=0.6, len_penalty_rule="gnmt")
    assert [x.text for x in back.translate(sources, **same)] == [x.text for x in t.translate(sources, **same)]


def test_an_imported_model_serves_and_ensembles(folders, tmp_path):
    from helpers.serve import call, live

    t = tformer.load(folders["opus-mt"], device="cpu")
    want = [x.text for x in t.translate(SOURCES[:2])]
    with live(t) as (_, url):
        status, answer, _ = call(url, "/v1/translate", {"src": SOURCES[:2]})
        assert status == 200 and [x["text"] for x in answer["translations"]] == want
        status, answer, _ = call(url, "/translate", {"q": SOURCES[0], "source": "en", "target": "de"})
        assert status == 200 and answer["translatedText"] == want[0]
    other = make_folder(tmp_path / "other", seed=9)  # the same tokenizers, other weights
    pair = tformer.load([folders["opus-mt"], other], device="cpu")
    assert len(pair.translate(SOURCES[:2])) == 2
    # the ensemble greedy-decodes over the mean of its members' log-probabilities, renormalised (model/ensemble.py),
    # as a reference does from Hugging Face's MarianMTModel forward passes (full, no cache)
    hf_other, tok = hf_pair(other)
    members = [hf_pair(folders["opus-mt"])[0], hf_other]
    N = 12
    got = translate_ids(pair.model, [pair.encode(s) for s in SOURCES],
                        DecodeConfig(strategy="greedy", max_len_a=0.0, max_len_b=N))
    differs = [False, False]  # whether member i alone would leave the pair's path somewhere
    for s, ours, score in zip(SOURCES, got.tokens, got.scores):
        want, want_score, own = hf_mean_greedy(members, tok, s, N)
        assert original(pair, ours[0]) == want, s
        assert abs(score[0] - want_score) <= 1e-5 * max(1.0, abs(want_score)), (s, score[0], want_score)
        path = want + [tok.eos_token_id]  # the pair's choices, step by step
        differs = [d or any(o != c for o, c in zip(choices, path)) for d, choices in zip(differs, own)]
    assert differs == [True, True]  # neither member alone decodes as the pair: both count


@torch.no_grad()
def hf_mean_greedy(models, tok, source, limit):
    """Greedy decoding of MarianMTModels as one (full forward passes, no cache): at each step the mean of their
    log-softmaxed logits, renormalised, <pad> (the start token) never chosen; at most `limit` tokens, </s>
    included. -> (ids without </s>, the summed log-probability of the chosen tokens, and per model the token
    it alone would have chosen at each step)."""
    src = tok(source, return_tensors="pt")
    cfg = models[0].config
    out, score, own = [], 0.0, [[] for _ in models]
    for _ in range(limit):
        dec = torch.tensor([[cfg.decoder_start_token_id] + out])
        logp = torch.stack([m(**src, decoder_input_ids=dec).logits[0, -1].log_softmax(-1) for m in models])  # (M, V)
        mean = logp.mean(0).log_softmax(-1)  # (V,): normalised over every entry, <pad> included
        logp[:, cfg.pad_token_id] = mean[cfg.pad_token_id] = float("-inf")
        for choices, row in zip(own, logp):
            choices.append(int(row.argmax()))
        best = int(mean.argmax())
        score += float(mean[best])
        if best == cfg.eos_token_id:
            break
        out.append(best)
    return out, score, own


def test_the_guides_python_runs(tmp_path, monkeypatch, capsys):
    from helpers.markdown import python_blocks

    blocks = python_blocks("docs/howto/pretrained.md")
    assert len(blocks) == 1
    make_folder(tmp_path / "opus-mt-en-de", seed=0)
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/howto/pretrained.md", "exec"), {"__name__": "readme"})
    text, score = capsys.readouterr().out.splitlines()[-2:]
    assert text and float(score) < 0


def test_an_imported_model_and_its_ensemble_hold_constraints_with_prefixes_and_nbest(folders, tmp_path):
    """Constrained beam search over an imported model: every hypothesis holds its phrases (as the target
    tokenizer spells them) and begins with its prefix, and its raw score is the forced decoding's, which
    test_scores_equal_hugging_face_log_probabilities holds to Hugging Face. The ensemble with a second folder
    holds them too."""
    t = tformer.load(folders["opus-mt"], device="cpu")
    wanted, prefix = [["Leiter", "steht"], ["Hunde"], None, ["Frau singt"]], [None, "Zwei", None, "Eine"]
    options = dict(beam=4, nbest=2, len_penalty=0.0, max_len_a=0.0, max_len_b=12)
    for translator in (t, tformer.load([folders["opus-mt"], make_folder(tmp_path / "other", seed=9)], device="cpu")):
        got = translator.translate(SOURCES, constraints=wanted, prefix=prefix, **options)
        for i, (x, phrases) in enumerate(zip(got, wanted)):
            assert len(x.hypotheses) == 2
            for h in x.hypotheses:
                ids = [translator.target_tokenizer.vocab.stoi[piece] for piece in h.tokens]  # the output as decoded
                for phrase in phrases or ():
                    p = translator.encode(phrase, "target")
                    assert any(ids[j:j + len(p)] == p for j in range(len(ids))), (h.text, phrase)
                assert h.text.startswith(prefix[i] or "")
                if translator is t:
                    forced = score_ids(t.model, [t.encode(SOURCES[i])], [ids])[0]  # per token, </s> last
                    cut = len(ids) >= 12  # at the limit: no </s> scored
                    assert h.score == pytest.approx(sum(forced[: len(ids) + (0 if cut else 1)]), abs=1e-4)


def test_an_argos_package_needs_one_sentencepiece_model_for_both_sides(folders, tmp_path):
    from tformer.errors import ConfigError
    from tformer.export import export_argos

    with pytest.raises(ConfigError, match="two SentencePiece models .* data.joint_vocab=true"):
        export_argos(folders["relu-separate-tables"], tmp_path / "x.argosmodel")
    assert not (tmp_path / "x.argosmodel").exists()
