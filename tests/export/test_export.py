"""The CTranslate2 export translates exactly as tformer does (greedy and beam), for post- and pre-norm,
ReLU and GELU, sinusoidal and learned positions; what it cannot express is refused with the reason."""

import dataclasses

import pytest

import tformer
from tformer.cli import main
from tformer.config import DecodeConfig
from tformer.data import load_task
from tformer.export import export_ctranslate2, translate_ctranslate2
from tformer.inference import load_model, translate_ids
from tformer.training.loop import train

from helpers.models import tiny_config

pytest.importorskip("ctranslate2", reason="pip install ctranslate2 (part of the test extra)")


def _run(path, epochs=3, **model):
    cfg = tiny_config(**model)
    train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=epochs)), path)
    return path


@pytest.mark.parametrize("model", [dict(), dict(norm="pre", activation="gelu", positions="learned",
                                                  share_embeddings=True)])
def test_exported_model_translates_like_tformer(tmp_path, model):
    run = _run(tmp_path / "run", **model)
    out = export_ctranslate2(run, tmp_path / "ct2")
    ckpt, m = load_model(str(run))
    translator = tformer.load(run, device="cpu")  # the checkpoint's tokenizers for the exported model
    data = load_task(ckpt.cfg.data, ("valid",), tokenizers=ckpt.tokenizers)
    sources = data.texts["valid"][0]
    for beam in (1, 4):
        # CTranslate2 keeps an ending only within the step's top K, as fairseq: beam_finish=top_k
        decode = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                              max_len_a=0.0, max_len_b=30, beam_finish="top_k")
        ours = [ckpt.tokenizers[1].decode(h[0]) for h in translate_ids(m, [s for s, _ in data.examples["valid"]],
                                                                       decode).tokens]
        theirs = translate_ctranslate2(out, translator, sources, beam=beam, len_penalty=0.0, max_len=30)
        assert theirs == ours


def test_unexportable_models_are_refused_and_the_command_works(tmp_path, capsys):
    tupe = _run(tmp_path / "tupe", epochs=1, positions="tupe")
    with pytest.raises(ValueError, match="CTranslate2 cannot run this model: encoder positions tupe"):
        export_ctranslate2(tupe, tmp_path / "x")
    run = _run(tmp_path / "run", epochs=1)
    assert main(["export", "--format", "ctranslate2", str(run), str(tmp_path / "q"), "--quantization", "int8"]) == 0
    assert (tmp_path / "q" / "model.bin").exists() and "int8" in capsys.readouterr().out
    assert main(["export", "--format", "ctranslate2", str(tupe), str(tmp_path / "y")]) == 2


def test_export_refuses_a_setting_its_format_does_not_read_before_reading_anything(tmp_path):
    from tformer.export import export

    missing = tmp_path / "no-such-run"
    with pytest.raises(ValueError, match="--quantization is for --format ctranslate2 and argos"):
        export("onnx", missing, tmp_path / "out", quantization="int8")
    with pytest.raises(ValueError, match=r"--shortlist is for --format ctranslate2 \(Argos"):
        export("argos", missing, tmp_path / "out.argosmodel", shortlist=tmp_path / "list")
    with pytest.raises(ValueError, match="unknown export format 'tflite'; choose one of ctranslate2, argos"):
        export("tflite", missing, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_hugging_face_marian_with_our_weights_decodes_the_same(tmp_path):
    pytest.importorskip("transformers", reason="pip install transformers (part of the test extra)")
    import torch

    from tformer.export import to_hf_marian

    run = _run(tmp_path / "run", epochs=4)
    ckpt, m = load_model(str(run))
    hf = to_hf_marian(m)
    data = load_task(ckpt.cfg.data, ("valid",), tokenizers=ckpt.tokenizers)
    sources = [s for s, _ in data.examples["valid"]]
    inp = torch.nn.utils.rnn.pad_sequence([torch.tensor(s + [2]) for s in sources], batch_first=True)
    with torch.no_grad():  # the same network: teacher-forced logits agree
        tgt = torch.tensor([[1] + t for _, t in data.examples["valid"][:1]])
        ours = m.generator(m(inp[:1], (inp[:1] != 0).sum(1), tgt, torch.tensor([tgt.shape[1]])).hidden)
        theirs = hf(input_ids=inp[:1], attention_mask=inp[:1] != 0, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    for beam in (1, 4):
        decode = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                              max_len_a=0.0, max_len_b=20)
        want = [h[0] for h in translate_ids(m, sources, decode).tokens]
        extra = dict(length_penalty=0.0) if beam > 1 else {}
        with torch.inference_mode():
            gen = hf.generate(input_ids=inp, attention_mask=inp != 0, num_beams=beam, max_new_tokens=20,
                              do_sample=False, suppress_tokens=[0, 1], **extra).tolist()
        got = [[t for t in (r[1:][: r[1:].index(2)] if 2 in r[1:] else r[1:]) if t != 0] for r in gen]
        assert got == want


def test_marian_needs_post_norm():
    from tformer.config import ModelConfig
    from tformer.export import to_hf_marian
    from tformer.model import build_model

    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="post-norm only"):
        to_hf_marian(build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, norm="pre"), 10, 10))


@pytest.mark.slow
def test_onnx_encoder_and_step_decode_like_tformer(tmp_path):
    pytest.importorskip("onnxruntime", reason="pip install onnx onnxscript onnxruntime (part of the test extra)")
    pytest.importorskip("onnxscript")
    from tformer.export import export_onnx, onnx_greedy

    run = _run(tmp_path / "run", epochs=4, norm="pre")
    enc, step = export_onnx(run, tmp_path / "onnx")
    assert enc.exists() and step.exists() and (tmp_path / "onnx" / "vocab.src.txt").exists()
    ckpt, m = load_model(str(run))
    data = load_task(ckpt.cfg.data, ("valid",), tokenizers=ckpt.tokenizers)
    sources = [s for s, _ in data.examples["valid"][:12]]
    want = [h[0] for h in translate_ids(m, sources, DecodeConfig(max_len_a=0.0, max_len_b=25)).tokens]
    assert onnx_greedy(tmp_path / "onnx", sources, max_len=25) == want
