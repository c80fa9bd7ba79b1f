"""Tiny OPUS-MT-shaped Hugging Face MarianMT folders built offline: SentencePiece models trained on Multi30k
text, a Marian vocab.json (</s> 0, <unk> 1, pieces, language tags, <pad> last) and random weights from a
MarianConfig (transformers, nothing downloaded). Shared by the import tests."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import torch

from helpers import ROOT

DATA = Path(os.environ.get("TFORMER_SHARED_DATA", ROOT.parent / "shared" / "data")) / "multi30k"
TAGS = (">>deu<<", ">>fra<<")


def sentences(lang: str, n: int = 2000) -> list[str]:
    with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _spm(lines: list[str], size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=size,
                                   model_type="unigram", num_threads=1, minloglevel=2)  # Marian's ids: unk 0, s 1, /s 2
    return buf.getvalue()


def pieces(model: bytes) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def make_folder(path: Path, *, seed: int = 0, d_model: int = 32, layers: int = 2, activation: str = "swish",
                share: bool = True, tie: bool = True, scale_embedding: bool = True, src_size: int = 160,
                tgt_size: int = 180, drop_piece: str | None = "▁a", init_std: float = 0.3,
                eos_bias: float = 2.5, heads: int = 4, ffn: int = 0, vocab_size: int = 0,
                n_sentences: int = 2000) -> Path:
    """An OPUS-MT-like folder at `path`. `drop_piece` is left out of vocab.json (so encoding meets an unknown
    piece, as real OPUS-MT vocabularies sometimes do); `eos_bias` raises </s> so that outputs end at varied
    lengths well inside the limits. `vocab_size`: fill vocab.json up to this many entries with pieces no text
    produces (an OPUS-MT-sized output layer from small SentencePiece models); `ffn`: 0 = 2 x d_model."""
    from transformers import MarianConfig, MarianMTModel

    path.mkdir(parents=True, exist_ok=True)
    src, tgt = _spm(sentences("en", n_sentences), src_size), _spm(sentences("de", n_sentences), tgt_size)
    (path / "source.spm").write_bytes(src)
    (path / "target.spm").write_bytes(tgt)
    table = {"</s>": 0, "<unk>": 1}
    for p in list(TAGS) + pieces(src)[3:] + pieces(tgt)[3:]:
        if p != drop_piece:
            table.setdefault(p, len(table))
    while len(table) < vocab_size - 1:
        table[f"▁unused{len(table)}"] = len(table)
    table["<pad>"] = len(table)
    (path / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de",
                                                            "separate_vocabs": False}), encoding="utf-8")
    V = len(table)
    cfg = MarianConfig(vocab_size=V, decoder_vocab_size=V, d_model=d_model, encoder_layers=layers,
                       decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                       encoder_ffn_dim=ffn or 2 * d_model, decoder_ffn_dim=ffn or 2 * d_model,
                       activation_function=activation,
                       scale_embedding=scale_embedding, pad_token_id=V - 1, eos_token_id=0,
                       decoder_start_token_id=V - 1, forced_eos_token_id=0, max_position_embeddings=256,
                       share_encoder_decoder_embeddings=share, tie_word_embeddings=tie, init_std=init_std)
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():  # random everywhere, so that no mapping error hides behind a zero or a one
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, 0] += eos_bias
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(path)
    gen = json.loads((path / "generation_config.json").read_text())  # as OPUS-MT folders publish it
    gen.update(num_beams=4, max_length=512, bad_words_ids=[[V - 1]])
    (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def marian_table(length: int, dim: int):
    """Marian's sinusoids, transliterated from its C++ (src/graph/node_initializers.cpp,
    sinusoidalPositionEmbeddings): float32 arithmetic, sines in columns 0 .. dim/2-1, cosines after them."""
    import math

    import numpy as np

    table = np.zeros((length, dim), dtype=np.float32)
    num_timescales = np.float32(dim / 2)
    increment = np.float32(math.log(10000.0)) / (num_timescales - np.float32(1.0))
    for p in range(length):
        for i in range(int(num_timescales)):
            v = np.float32(p) * np.float32(math.exp(np.float32(i) * -increment))
            table[p, i] = math.sin(v)
            table[p, int(num_timescales) + i] = math.cos(v)
    return table


def make_marian_folder(path: Path, hf_folder: Path) -> Path:
    """The Hugging Face folder's network as Marian writes it: model.npz (arrays named as Marian names them,
    matrices (in, out), the options in 'special:model.yml'), vocab.yml without <pad> (Marian has none: its
    decoder starts from a zero vector), decoder.yml and the SentencePiece models."""
    import numpy as np
    import yaml
    from safetensors.torch import load_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((hf_folder / "config.json").read_text())
    assert cfg["pad_token_id"] == cfg["vocab_size"] - 1 and cfg["tie_word_embeddings"]
    table = json.loads((hf_folder / "vocab.json").read_text())
    del table["<pad>"]
    (path / "vocab.yml").write_text(yaml.safe_dump(table, allow_unicode=True, sort_keys=False), encoding="utf-8")
    for name in ("source.spm", "target.spm"):
        (path / name).write_bytes((hf_folder / name).read_bytes())
    hf = load_file(str(hf_folder / "model.safetensors"))
    V = len(table)
    options = {"type": "transformer", "dim-emb": cfg["d_model"], "enc-depth": cfg["encoder_layers"],
               "dec-depth": cfg["decoder_layers"], "transformer-heads": cfg["encoder_attention_heads"],
               "transformer-dim-ffn": cfg["encoder_ffn_dim"], "transformer-ffn-activation": "swish",
               "transformer-preprocess": "", "transformer-postprocess": "dan", "transformer-postprocess-emb": "d",
               "transformer-decoder-autoreg": "self-attention", "transformer-ffn-depth": 2,
               "transformer-no-projection": False, "tied-embeddings-all": True, "dim-vocabs": [V, V]}
    w = {"special:model.yml": np.frombuffer(yaml.safe_dump(options).encode() + b"\0", dtype=np.int8),
         "Wemb": hf["model.shared.weight"][:V].numpy(),
         "decoder_ff_logit_out_b": hf["final_logits_bias"][:, :V].numpy()}

    def linear(marian: str, name: str, suffix: str) -> None:
        w[f"{marian}_W{suffix}"] = hf[f"{name}.weight"].T.numpy().copy()
        w[f"{marian}_b{suffix}"] = hf[f"{name}.bias"][None].numpy()

    def norm(marian: str, name: str) -> None:
        w[f"{marian}_ln_scale"] = hf[f"{name}.weight"][None].numpy()
        w[f"{marian}_ln_bias"] = hf[f"{name}.bias"][None].numpy()

    for side in ("encoder", "decoder"):
        for i in range(cfg[f"{side}_layers"]):
            m, h = f"{side}_l{i + 1}", f"model.{side}.layers.{i}"
            blocks = [("self", "self_attn")] + ([("context", "encoder_attn")] if side == "decoder" else [])
            for marian, name in blocks:
                for part in "qkv":
                    linear(f"{m}_{marian}", f"{h}.{name}.{part}_proj", part)
                linear(f"{m}_{marian}", f"{h}.{name}.out_proj", "o")
                norm(f"{m}_{marian}_Wo", f"{h}.{name}_layer_norm")
            linear(f"{m}_ffn", f"{h}.fc1", "1")
            linear(f"{m}_ffn", f"{h}.fc2", "2")
            norm(f"{m}_ffn_ffn", f"{h}.final_layer_norm")
    np.savez(path / "model.npz", **w)
    (path / "decoder.yml").write_text(yaml.safe_dump({"models": ["model.npz"], "vocabs": ["vocab.yml", "vocab.yml"],
                                                      "beam-size": 6, "normalize": 1.0}), encoding="utf-8")
    return path


def marian_oracle(hf_folder: Path):
    """The Hugging Face model made to compute what Marian computes: Marian's position table, LayerNorm eps
    1e-6, a zero start vector (its <pad> row) that takes no probability."""
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(hf_folder).eval()
    pad = model.config.pad_token_id
    with torch.no_grad():
        for side in (model.model.encoder, model.model.decoder):
            pos = side.embed_positions.weight
            pos.copy_(torch.from_numpy(marian_table(pos.shape[0], pos.shape[1])))
        model.model.shared.weight[pad] = 0.0
        model.final_logits_bias[0, pad] = -1e4
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = 1e-6
    return model
