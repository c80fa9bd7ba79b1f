"""Tiny OPUS-MT-shaped Hugging Face MarianMT folders built offline: SentencePiece models trained on Multi30k
text, a Marian vocab.json (</s> 0, <unk> 1, pieces, language tags, <pad> last) and random weights from a
MarianConfig (transformers, nothing downloaded). Shared by the import tests."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
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
                eos_bias: float = 2.5) -> Path:
    """An OPUS-MT-like folder at `path`. `drop_piece` is left out of vocab.json (so encoding meets an unknown
    piece, as real OPUS-MT vocabularies sometimes do); `eos_bias` raises </s> so that outputs end at varied
    lengths well inside the limits."""
    from transformers import MarianConfig, MarianMTModel

    path.mkdir(parents=True, exist_ok=True)
    src, tgt = _spm(sentences("en"), src_size), _spm(sentences("de"), tgt_size)
    (path / "source.spm").write_bytes(src)
    (path / "target.spm").write_bytes(tgt)
    table = {"</s>": 0, "<unk>": 1}
    for p in list(TAGS) + pieces(src)[3:] + pieces(tgt)[3:]:
        if p != drop_piece:
            table.setdefault(p, len(table))
    table["<pad>"] = len(table)
    (path / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de",
                                                            "separate_vocabs": False}), encoding="utf-8")
    V = len(table)
    cfg = MarianConfig(vocab_size=V, decoder_vocab_size=V, d_model=d_model, encoder_layers=layers,
                       decoder_layers=layers, encoder_attention_heads=4, decoder_attention_heads=4,
                       encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, activation_function=activation,
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
