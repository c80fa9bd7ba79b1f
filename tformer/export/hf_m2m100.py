"""Export to a Hugging Face M2M-100 folder, the format `tformer import hf-m2m100` reads (tformer.convert.hf_m2m100).

    tformer export --format hf-m2m100 RUN_DIR OUT

For a model imported from such a folder (and fine-tuned, or not): M2M-100 is a pre-norm Transformer with final
norms and fairseq's sinusoids, which it computes itself, so the model must have them (`model.sinusoid: fairseq`)
and a tokenizer that remembers the original ids (PieceTableTokenizer.original). Every entry goes back to its
original id, and the start row's copy (tformer's <s>) is left out: an imported folder's tensors come back as
they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tformer.errors import ConfigError
from tformer.export.hf_marian import _last_rows, copy_layers


def to_hf_m2m100(model, original: list[int]):
    """The same network as a Hugging Face `M2M100ForConditionalGeneration` (weights copied; built from a
    config, nothing downloaded); `original`: the id each tformer entry has in the folder's numbering."""
    try:
        from transformers import M2M100Config, M2M100ForConditionalGeneration
    except ImportError:
        raise ConfigError("the Hugging Face export needs transformers: pip install transformers") from None
    cfg = model.cfg
    problems = [f"model.{k}={getattr(cfg, k)!r} (M2M-100's is {v!r})" for k, v in
                (("norm", "pre"), ("positions", "sinusoidal"), ("sinusoid", "fairseq"), ("share_embeddings", True),
                 ("tie_generator", True), ("kind", "vanilla")) if getattr(cfg, k) != v]
    if problems:
        raise ConfigError(f"an M2M-100 folder cannot hold this model: {', '.join(problems)}")
    rows = _last_rows(original)
    hf_cfg = M2M100Config(
        vocab_size=len(rows), d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embedding, dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout, activation_dropout=cfg.ffn_dropout, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2)
    hf = M2M100ForConditionalGeneration(hf_cfg).eval()
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    with torch.no_grad():
        m = hf.model
        m.shared.weight.copy_(ours["src_embed.tokens.weight"][rows])
        for side, hf_side in (("encoder", m.encoder), ("decoder", m.decoder)):
            hf_side.layer_norm.weight.copy_(ours[f"{side}.norm.weight"])
            hf_side.layer_norm.bias.copy_(ours[f"{side}.norm.bias"])
            copy_layers(hf_side, ours, side, cfg.d_model)
    return hf


def export_hf_m2m100(checkpoint: str | Path, out: str | Path, force: bool = False, which: str = "best") -> Path:
    """Write an M2M-100 folder (config.json, generation_config.json, model.safetensors, sentencepiece.bpe.model,
    vocab.json, tokenizer_config.json) that M2M100ForConditionalGeneration and M2M100Tokenizer load and
    `tformer import hf-m2m100` reads back."""
    from tformer.api import load
    from tformer.convert import remove, replaceable
    from tformer.convert.hf_m2m100 import BOS, LANGUAGE_CODES, TAG
    from tformer.data.tokenizer import PieceTableTokenizer

    out = Path(out)
    replaceable(out, Path(checkpoint), force)
    translator = load(checkpoint, which=which, device="cpu", attention="sdpa")
    tok = translator.source_tokenizer
    codes = next((name for name, c in LANGUAGE_CODES.items() if list(tok.controls if isinstance(
        tok, PieceTableTokenizer) else ()) == [TAG.format(x) for x in c]), None)
    if codes is None or translator.target_tokenizer is not tok:
        raise ConfigError(f"{translator.path} was not imported from an M2M-100 folder (its tokenizer has no M2M-100 "
                          "language tokens); export it as another format")
    hf = to_hf_m2m100(translator.model, tok.original)
    remove(out)
    hf.save_pretrained(out)
    rows = _last_rows(tok.original)
    dictionary = tok.original[tok.vocab.stoi[TAG.format(LANGUAGE_CODES[codes][0])]]  # the first language's id
    table = {("<s>" if tok.vocab.itos[r] == BOS else tok.vocab.itos[r]): m for m, r in enumerate(rows[:dictionary])}
    (out / "vocab.json").write_text(json.dumps(table, ensure_ascii=False, indent=1), encoding="utf-8")
    (out / "sentencepiece.bpe.model").write_bytes(tok.model_bytes)
    data = translator.config.data
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "M2M100Tokenizer", "language_codes": codes,
        "num_madeup_words": len(rows) - dictionary - len(LANGUAGE_CODES[codes]), "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang, "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>"}, indent=1), encoding="utf-8")
    return out
