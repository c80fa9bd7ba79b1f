"""Export to a Hugging Face MarianMT folder, the format `tformer import hf-marian` reads (tformer.convert.hf_marian).

    tformer export --format hf-marian RUN_DIR OUT

MarianMT is a post-norm Transformer with optionally sqrt(d)-scaled embeddings and a position table, so a
post-norm tformer model maps onto it exactly (`to_hf_marian`: the network, weights copied). An imported model's
vocabulary goes back to its original numbering (PieceTableTokenizer.original), so its ids and tensors come
back as they were; a tformer-trained one keeps its own ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tformer.errors import ConfigError
from tformer.export import check_exportable, position_table


HF_ACTIVATION = {"relu": "relu", "gelu": "gelu", "silu": "swish"}  # tformer's name -> transformers' ACT2FN name


def _last_rows(original: list[int]) -> list[int]:
    """Per original id, the tformer row that holds it: the last one (an imported Marian model's <pad> and <s>
    are both its start row; the <s> copy, row 1, is the one that was trained and predicts)."""
    rows = [0] * (max(original) + 1)
    for i, m in enumerate(original):
        rows[m] = i
    return rows


def to_hf_marian(model, src_ids: list[int] | None = None, tgt_ids: list[int] | None = None):
    """The same network as a Hugging Face `MarianMTModel` (weights copied; built from a config, nothing is
    downloaded): MarianMT is a post-norm Transformer with optionally sqrt(d)-scaled embeddings and a position
    table (ours is copied into it, whatever its kind), so a post-norm tformer model with sinusoidal or learned
    positions maps onto it exactly. `src_ids` / `tgt_ids`: the id each tformer entry has in the exported
    vocabulary (PieceTableTokenizer.original for an imported model); None: the same ids, so decoding starts
    from <s> (id 1) and <pad> is 0."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        raise ConfigError("the Hugging Face export needs transformers: pip install 'tformer[hf]'") from None
    cfg = model.cfg
    check_exportable(cfg)
    if cfg.norm != "post" or cfg.embed_norm:
        raise ConfigError("MarianMT is post-norm only, without an embedding norm; this model is "
                          + ("model.norm=pre" if cfg.norm != "post" else "model.embed_norm=true"))
    V_src, V_tgt = model.src_embed.tokens.num_embeddings, model.tgt_embed.tokens.num_embeddings
    src_ids, tgt_ids = src_ids or list(range(V_src)), tgt_ids or list(range(V_tgt))
    if src_ids[0] != tgt_ids[0]:
        raise ConfigError(f"MarianMT has one <pad> id for both sides; this model's are {src_ids[0]} (source) and "
                          f"{tgt_ids[0]} (target)")
    src_rows, tgt_rows = _last_rows(src_ids), _last_rows(tgt_ids)
    shared = cfg.share_embeddings
    hf_cfg = MarianConfig(
        vocab_size=len(src_rows), decoder_vocab_size=len(tgt_rows), d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function=HF_ACTIVATION[cfg.activation], max_position_embeddings=cfg.max_positions,
        scale_embedding=cfg.scale_embedding, dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.ffn_dropout, pad_token_id=tgt_ids[0], bos_token_id=None, eos_token_id=tgt_ids[2],
        decoder_start_token_id=tgt_ids[1], forced_eos_token_id=None, share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=cfg.tie_generator)
    hf = MarianMTModel(hf_cfg).eval()
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    with torch.no_grad():
        m = hf.model
        m.encoder.embed_tokens.weight.copy_(ours["src_embed.tokens.weight"][src_rows])
        m.decoder.embed_tokens.weight.copy_(ours["tgt_embed.tokens.weight"][tgt_rows])
        if shared and m.shared.weight.data_ptr() != m.encoder.embed_tokens.weight.data_ptr():
            m.shared.weight.copy_(ours["src_embed.tokens.weight"][src_rows])  # untied output: its own table
        for side, hf_side in (("encoder", m.encoder), ("decoder", m.decoder)):
            hf_side.embed_positions.weight.copy_(torch.from_numpy(position_table(cfg, model, side))[
                : hf_side.embed_positions.weight.shape[0]])
            copy_layers(hf_side, ours, side, cfg.d_model)
        if hf.lm_head.weight.data_ptr() != m.decoder.embed_tokens.weight.data_ptr():
            hf.lm_head.weight.copy_(ours["generator.weight"][tgt_rows])
        hf.final_logits_bias.copy_(ours["generator.bias"][tgt_rows][None])
    return hf


def copy_layers(hf_side, ours: dict[str, torch.Tensor], side: str, D: int) -> None:
    """One side's layers into a BART-family Hugging Face stack (MarianMT, M2M-100) from tformer's tensors `ours`:
    the fused (3D, D) in_proj split into q, k, v."""
    def copy(module: torch.nn.Module, name: str, rows: slice = slice(None)) -> None:
        module.weight.copy_(ours[f"{name}.weight"][rows])
        module.bias.copy_(ours[f"{name}.bias"][rows])

    def attention(hf_attn, name: str) -> None:
        for j, proj in enumerate((hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj)):
            copy(proj, f"{name}.in_proj", slice(j * D, (j + 1) * D))
        copy(hf_attn.out_proj, f"{name}.out_proj")

    for i, layer in enumerate(hf_side.layers):
        p = f"{side}.layers.{i}"
        attention(layer.self_attn, f"{p}.self_attn")
        copy(layer.self_attn_layer_norm, f"{p}.{'res_attn' if side == 'encoder' else 'res_self'}.norm")
        if side == "decoder":
            attention(layer.encoder_attn, f"{p}.cross_attn")
            copy(layer.encoder_attn_layer_norm, f"{p}.res_cross.norm")
        copy(layer.fc1, f"{p}.ffn.linear1")
        copy(layer.fc2, f"{p}.ffn.linear2")
        copy(layer.final_layer_norm, f"{p}.res_ffn.norm")


def _vocab_json(tokenizer, ids: list[int]) -> dict[str, int]:
    """piece -> exported id; an imported model's <s> (a copy of its start row, the original <pad>) is not an
    entry of its own."""
    return {"<pad>" if m == ids[0] else tokenizer.vocab.itos[r]: m for m, r in enumerate(_last_rows(ids))}


def export_hf_marian(checkpoint: str | Path, out: str | Path, force: bool = False, which: str = "best") -> Path:
    """Write a Hugging Face MarianMT folder (config.json, generation_config.json, model.safetensors,
    source.spm, target.spm, vocab.json [+ target_vocab.json], tokenizer_config.json) that `MarianMTModel` and
    `MarianTokenizer` load, CTranslate2's converter reads and `tformer import hf-marian` reads back: an
    imported model gets its own ids and tensors back; a tformer-trained one keeps its ids (<pad> 0, <s> 1 as
    the decoder's start, </s> 2, <unk> 3). A position table other than Hugging Face's own sinusoids (tformer's
    interleaved ones, Marian's, a learned table) is written into the file, where MarianMTModel reads it."""
    from safetensors.torch import load_file, save_file

    from tformer.api import load
    from tformer.data.tokenizer import PieceTableTokenizer, SubwordTokenizer

    from tformer.convert import remove, replaceable

    out = Path(out)
    replaceable(out, Path(checkpoint), force)
    translator = load(checkpoint, which=which, device="cpu", attention="sdpa")
    src_tok, tgt_tok = translator.source_tokenizer, translator.target_tokenizer
    for tok in (src_tok, tgt_tok):
        if not isinstance(tok, (SubwordTokenizer, PieceTableTokenizer)):
            raise ConfigError(f"{translator.path} does not read text with SentencePiece (its tokenizers are "
                              f"{type(tok).__name__}); a Hugging Face Marian folder needs SentencePiece models")
    ids = [tok.original if isinstance(tok, PieceTableTokenizer) else list(range(len(tok.vocab)))
           for tok in (src_tok, tgt_tok)]
    hf = to_hf_marian(translator.model, ids[0], ids[1])
    cfg = translator.config
    decode = cfg.decode
    hf.generation_config.update(num_beams=decode.beam_size if decode.strategy == "beam" else 1, max_length=512,
                                bad_words_ids=[[i] for i in sorted({ids[1][0], ids[1][1]})])  # <pad>, <s>
    if decode.len_penalty_rule == "power":
        hf.generation_config.length_penalty = decode.len_penalty
    remove(out)
    hf.save_pretrained(out)
    if any(cfg.model.side_positions(side) != "sinusoidal" for side in ("encoder", "decoder")) \
            or cfg.model.sinusoid != "halves":
        file = out / "model.safetensors"  # save_pretrained leaves the position tables out: Hugging Face's own
        tensors = load_file(str(file))
        for side in ("encoder", "decoder"):
            tensors[f"model.{side}.embed_positions.weight"] = getattr(hf.model, side).embed_positions.weight.detach()
        save_file(tensors, str(file), metadata={"format": "pt"})
    separate = src_tok.vocab != tgt_tok.vocab or ids[0] != ids[1]  # one table (two SentencePiece models or one)
    for tok, name in ((src_tok, "source.spm"), (tgt_tok, "target.spm")):
        (out / name).write_bytes(tok.model_bytes)
    (out / "vocab.json").write_text(json.dumps(_vocab_json(src_tok, ids[0]), ensure_ascii=False, indent=1),
                                    encoding="utf-8")
    if separate:
        (out / "target_vocab.json").write_text(json.dumps(_vocab_json(tgt_tok, ids[1]), ensure_ascii=False,
                                                          indent=1), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "source_lang": cfg.data.src_lang, "target_lang": cfg.data.tgt_lang, "separate_vocabs": separate,
        "tokenizer_class": "MarianTokenizer", "model_max_length": cfg.model.max_positions}, indent=1),
        encoding="utf-8")
    return out
