"""Marian's own model files (OPUS-MT's native release: model.npz, vocab.yml, decoder.yml, SentencePiece models)
read by tformer: Marian's position table against a table computed as Marian's C++ computes it; teacher-forced
logits, scores and greedy output against Hugging Face's MarianMT made to compute what Marian computes; then
exported to Hugging Face; bad files refused by name."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("transformers")
from helpers.hf_marian_models import make_folder, make_marian_folder, marian_oracle, marian_table  # noqa: E402

import tformer  # noqa: E402
import tformer.cli  # noqa: E402
from tformer.config import DecodeConfig  # noqa: E402
from tformer.errors import CheckpointError  # noqa: E402
from tformer.inference import translate_ids  # noqa: E402
from tformer.positions import sinusoidal_table  # noqa: E402

SOURCES = ["A man in a blue shirt is standing on a ladder.", ">>deu<< Two dogs play in the snow.",
           "Three children are running on the beach near a big wave", "A woman sings."]
TARGETS = ["Ein Mann steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.", "Kinder rennen am Strand",
           "Eine Frau singt auf der Bühne vor vielen Leuten."]


@pytest.mark.parametrize("dim", [32, 512])
def test_marians_position_table_is_its_cs_and_not_hugging_faces(dim):
    ours = sinusoidal_table(300, dim, "marian").numpy()
    theirs = marian_table(300, dim)
    assert np.abs(ours - theirs).max() < 1e-4  # float32 angles up to 300 rad: rounding in the 5th decimal
    assert np.abs(ours - sinusoidal_table(300, dim, "halves").numpy()).max() > 0.1  # another table


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("marian")
    hf = make_folder(root / "hf", seed=3)
    return hf, make_marian_folder(root / "marian", hf)


def test_marian_folder_computes_what_marian_computes(folders):
    hf_folder, folder = folders
    t = tformer.load(folder, device="cpu")
    oracle = marian_oracle(hf_folder)
    from transformers import MarianTokenizer

    tok = MarianTokenizer.from_pretrained(hf_folder)
    V = oracle.config.vocab_size - 1  # Marian's entries; Hugging Face's <pad> (V) is the zero start vector
    for s in SOURCES:  # the same ids: Marian's are Hugging Face's without its <pad>
        assert [t.source_tokenizer.original[i] for i in t.encode(s)] + [0] == tok(s)["input_ids"]
    assert t.config.model.sinusoid == "marian" and t.config.model.layer_norm_eps == 1e-6
    assert (t.config.decode.beam_size, t.config.decode.len_penalty, t.config.decode.len_penalty_rule) == \
        (6, 1.0, "power")
    src = tok(SOURCES, return_tensors="pt", padding=True)
    tgt = tok(text_target=TARGETS, return_tensors="pt", padding=True)
    start = oracle.config.decoder_start_token_id
    dec_in = torch.cat([torch.full((len(TARGETS), 1), start), tgt.input_ids[:, :-1]], 1)
    dec_mask = torch.cat([torch.ones(len(TARGETS), 1, dtype=torch.long), tgt.attention_mask[:, :-1]], 1)
    ours = {m: i for i, m in enumerate(t.target_tokenizer.original)}  # the start vector: tformer's <s> (1)
    with torch.no_grad():
        ref = oracle(input_ids=src.input_ids, attention_mask=src.attention_mask, decoder_input_ids=dec_in,
                     decoder_attention_mask=dec_mask).logits
        src_ids = torch.tensor([[ours[m] for m in row] for row in src.input_ids.tolist()])
        tgt_ids = torch.tensor([[ours[m] for m in row] for row in dec_in.tolist()])
        src_ids[src.attention_mask == 0] = 0
        tgt_ids[dec_mask == 0] = 0
        out = t.model(src_ids, src.attention_mask.sum(1), tgt_ids, dec_mask.sum(1))
        logits = t.model.generator(out.padded())
    real = dec_mask.bool()
    mine = logits[..., 2:]  # tformer ids 2.. are Marian's ids 0 .. V-1 in order
    # 3e-5, not conftest.REL: the oracle's table is computed in float32 as Marian's C++ computes it (angles
    # rounded to float32), tformer's in float64: the inputs already differ by up to ~2e-6
    ref_lp, mine_lp = ref.log_softmax(-1)[..., :V], logits.log_softmax(-1)[..., 2:]
    assert ((mine - ref[..., :V]).abs() / ref[..., :V].abs().clamp(min=1))[real].max() <= 3e-5
    assert ((mine_lp - ref_lp).abs() / ref_lp.abs().clamp(min=1))[real].max() <= 3e-5
    got = translate_ids(t.model, [t.encode(s) for s in SOURCES],
                        DecodeConfig(strategy="greedy", max_len_a=0.0, max_len_b=24))
    with torch.no_grad():
        gen = oracle.generate(**src, num_beams=1, max_new_tokens=25, bad_words_ids=[[start]], forced_eos_token_id=None)
    for hyp, row in zip(got.tokens, gen.tolist()):
        row = row[1:]
        want = [x for x in (row[: row.index(0)] if 0 in row else row) if x != start][:24]
        assert [t.target_tokenizer.original[i] for i in hyp[0]] == want


def test_import_marian_then_export_to_hugging_face(folders, tmp_path):
    from transformers import MarianMTModel

    hf_folder, folder = folders
    assert tformer.cli.main(["import", "marian", str(folder), str(tmp_path / "run")]) == 0
    assert tformer.cli.main(["export", "--format", "hf-marian", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    t = tformer.load(tmp_path / "run", device="cpu")
    back = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    oracle = marian_oracle(hf_folder)
    assert back.config.pad_token_id == back.config.decoder_start_token_id == oracle.config.pad_token_id
    ids = torch.tensor([[5, 17, 40, 9, 0]])
    with torch.no_grad():  # the export carries Marian's table and eps: it computes what the oracle does
        a = back(input_ids=ids, decoder_input_ids=torch.tensor([[back.config.pad_token_id, 7, 30]])).logits
        b = oracle(input_ids=ids, decoder_input_ids=torch.tensor([[oracle.config.pad_token_id, 7, 30]])).logits
    assert t.config.model.sinusoid == "marian"
    assert (a - b)[..., :-1].abs().max() <= 1e-4  # eps: MarianMT's LayerNorm is 1e-5, Marian's 1e-6


def _edit_options(folder, **changes):
    with np.load(folder / "model.npz") as npz:
        w = {k: npz[k] for k in npz.files}
    options = yaml.safe_load(w["special:model.yml"].tobytes().rstrip(b"\0"))
    options.update(changes)
    w["special:model.yml"] = np.frombuffer(yaml.safe_dump(options).encode() + b"\0", dtype=np.int8)
    np.savez(folder / "model.npz", **w)


def _pickled(folder):
    with np.load(folder / "model.npz") as npz:
        w = {k: npz[k] for k in npz.files}
    w["evil"] = np.array([object()], dtype=object)
    np.savez(folder / "model.npz", **w)


BAD = {
    "pre-norm": (lambda f: _edit_options(f, **{"transformer-preprocess": "n"}), ["transformer-preprocess", "'n'"]),
    "activation": (lambda f: _edit_options(f, **{"transformer-ffn-activation": "gelu"}),
                   ["transformer-ffn-activation", "'gelu'"]),
    "vocabulary": (lambda f: (f / "vocab.yml").write_text("\n".join((f / "vocab.yml").read_text().splitlines()[:-1])),
                   ["dim-vocabs", "does not match the weights"]),
    "pickled arrays": (_pickled, ["model.npz", "numpy"]),
    "no target.spm": (lambda f: (f / "target.spm").unlink(), ["target.spm"]),
}


@pytest.mark.parametrize("damage", BAD)
def test_a_bad_marian_folder_is_refused_by_name(folders, tmp_path, damage):
    folder = tmp_path / "m"
    shutil.copytree(folders[1], folder)
    harm, names = BAD[damage]
    harm(folder)
    with pytest.raises(CheckpointError) as e:
        tformer.load(folder, device="cpu")
    for name in names:
        assert name in str(e.value), (name, str(e.value))
    assert tformer.cli.main(["import", "marian", str(folder), str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
