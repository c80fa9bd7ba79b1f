"""A tiny Hugging Face M2M-100 folder built offline (random weights, a SentencePiece model over en/de/fr)."""

from __future__ import annotations

import json

import torch

from helpers.hf_marian_models import _spm, pieces, sentences


def make_folder(path, *, seed: int = 0, d_model: int = 32, layers: int = 2, eos_lift: float = 7.0):
    """A tiny M2M-100 folder: a SentencePiece model over English, German and French, fairseq's dictionary in
    vocab.json, the 100 language tokens and 8 made-up words after it, random weights (layer norms too)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    path.mkdir(parents=True)
    spm = _spm(sentences("en", 800) + sentences("de", 800) + sentences("fr", 800), 300)
    (path / "sentencepiece.bpe.model").write_bytes(spm)
    table = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for p in pieces(spm)[3:]:
        table.setdefault(p, len(table))
    (path / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    M2M100Tokenizer(str(path / "vocab.json"), str(path / "sentencepiece.bpe.model"), src_lang="en",
                    tgt_lang="fr").save_pretrained(path)
    cfg = M2M100Config(vocab_size=len(table) + 108, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
                       decoder_ffn_dim=2 * d_model, max_position_embeddings=128, dropout=0.0, init_std=0.3)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # random everywhere, so that no mapping error hides behind a zero or a one
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
        eos = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias += eos_lift * eos / eos.norm() ** 2  # </s>'s logit + eos_lift: outputs
        # end at varied lengths
    model.save_pretrained(path)
    return path
