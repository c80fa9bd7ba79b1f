"""Hugging Face's fairseq-born multilingual folders as tformer checkpoints that translate between all their
languages: M2M-100 (facebook/m2m100_418M), NLLB-200 (facebook/nllb-200-distilled-600M: the same network, another
tokenizer) and mBART-50 (facebook/mbart-large-50-many-to-many-mmt).

    FOLDER/config.json               model_type "m2m_100" or "mbart": the architecture and the special ids
    FOLDER/model.safetensors         the weights (or shards, or pytorch_model.bin: tformer.convert.hf_marian)
    FOLDER/sentencepiece.bpe.model   text -> pieces
    FOLDER/tokenizer_config.json     which tokenizer (tformer.convert.hf_languages: the ids and the languages)
    FOLDER/vocab.json | tokenizer.json

M2M-100 is a pre-norm Transformer with a final LayerNorm on each side, ReLU, embeddings scaled by sqrt(d),
fairseq's sinusoids (`model.sinusoid: fairseq`) and one table for source, target and output, without an output
bias. mBART adds a LayerNorm on the embeddings (`model.embed_norm`), learns its positions in a table whose first two
rows are never read (`model.position_offset: 2`), runs GELU and may carry an output bias (final_logits_bias).
A source is its language's token (__en__, eng_Latn, en_XX), its pieces and </s>; the decoder starts from </s>,
and its first output is the target's token (generate's forced_bos_token_id). That is tformer's
`data.tag_sides: both`, and translate(..., source="en", target="fr") asks for it.

The entries are renumbered into tformer's layout: <pad> (1), <s> (the decoder's start: a copy of </s> whose
output takes no probability, NO_PROBABILITY, so tformer's softmax over V + 1 entries equals the folder's over
V), </s> (2), <unk> (3); then fairseq's <s> (0, named <bos>) and every other entry in the order of its id.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer.checkpoint import FORMAT, FORMAT_VERSION
from tformer.config import Config, ConfigError, DataConfig, ModelConfig, from_dict, merge_overrides, to_dict
from tformer.convert.hf_languages import read_table
from tformer.convert.hf_marian import (NO_PROBABILITY, ImportedCheckpoint, _decode_defaults, _json, layer_tensors,
                                       read_weights)
from tformer.data.tokenizer import PieceTableTokenizer
from tformer.errors import CheckpointError, DataError

ARCHITECTURES = {"m2m_100": "M2M-100", "mbart": "mBART"}  # config.json's model_type -> its name in messages


def model_config(hf: dict[str, Any], file: Path) -> ModelConfig:
    """The ModelConfig of an M2M-100 or mBART config.json; an architecture tformer cannot run is named. mBART
    differs by a LayerNorm on the embeddings and a learned position table whose first two rows are never read."""
    kind = hf.get("model_type", "m2m_100")
    name = ARCHITECTURES.get(kind)
    if name is None:
        raise CheckpointError(f"{file}: model_type {kind!r}; this reader takes {', '.join(ARCHITECTURES)}")

    def get(key: str, default: Any = None) -> Any:
        if key not in hf and default is None:
            raise CheckpointError(f"{file}: no '{key}'; an {name} config.json has it")
        return hf.get(key, default)

    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(enc) != get(dec):
            raise CheckpointError(f"{file}: '{enc}' is {get(enc)} but '{dec}' is {get(dec)}; tformer's encoder and "
                                  "decoder layers have one size")
    activation = get("activation_function", "relu" if kind == "m2m_100" else "gelu")
    if activation not in ("relu", "gelu"):
        raise CheckpointError(f"{file}: 'activation_function' is {activation!r}; tformer runs relu and gelu")
    for key, want in (("pad_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 2)):
        if hf.get(key, want) != want:
            raise CheckpointError(f"{file}: '{key}' is {hf[key]!r}; {name}'s is {want} (fairseq's dictionary)")
    positions = (dict(positions="sinusoidal", sinusoid="fairseq") if kind == "m2m_100" else
                 dict(positions="learned", position_offset=2, embed_norm=True))
    try:
        return ModelConfig(
            d_model=get("d_model"), n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
            encoder_layers=get("encoder_layers"), decoder_layers=get("decoder_layers"),
            dropout=float(hf.get("dropout") or 0.0), attention_dropout=float(hf.get("attention_dropout") or 0.0),
            ffn_dropout=float(hf.get("activation_dropout") or 0.0), activation=activation, norm="pre",
            scale_embedding=bool(hf.get("scale_embedding", kind == "m2m_100")),
            max_positions=get("max_position_embeddings", 1024), share_embeddings=True, tie_generator=True,
            output_bias=False, start_row=2, **positions)  # M2M-100 has no output bias, mBART's is a buffer:
        # neither trains; the decoder starts from </s>'s row, as generate does
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def to_tformer(hf: dict[str, Tensor], cfg: ModelConfig, rows: list[int], where: Path) -> dict[str, Tensor]:
    """M2M-100's or mBART's tensors under tformer's names, rows permuted; unknown or missing tensors are named."""
    used: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in hf:
            raise CheckpointError(f"{where}: no tensor '{name}'; the weights do not fit config.json")
        used.add(name)
        return hf[name]

    table = next((hf[n] for n in ("model.shared.weight", "model.encoder.embed_tokens.weight") if n in hf), None)
    if table is None:
        raise CheckpointError(f"{where}: no embedding table (model.shared.weight)")
    if tuple(table.shape) != (len(rows) - 1, cfg.d_model):
        raise CheckpointError(f"{where}: the embedding table is {tuple(table.shape)}, the vocabulary needs "
                              f"({len(rows) - 1}, {cfg.d_model})")
    used.update({"model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"} & set(hf))
    out = {"src_embed.tokens.weight": table[rows].contiguous()}
    bias = hf["final_logits_bias"].reshape(-1)[rows].clone() if "final_logits_bias" in hf else torch.zeros(len(rows))
    used.add("final_logits_bias")  # mBART's (zeros unless trained)
    bias[1] = NO_PROBABILITY  # the start row's copy takes no probability
    out["generator.bias"] = bias
    for side, embed in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        if cfg.positions == "learned":  # mBART's table, its first position_offset rows kept as they are
            out[f"{embed}.positions.table.weight"] = take(f"model.{side}.embed_positions.weight")
            for p in ("weight", "bias"):
                out[f"{embed}.norm.{p}"] = take(f"model.{side}.layernorm_embedding.{p}")
        used.add(f"model.{side}.embed_positions.weights")  # M2M-100's sinusoids, computed (model.sinusoid)
        for p in ("weight", "bias"):
            out[f"{side}.norm.{p}"] = take(f"model.{side}.layer_norm.{p}")
        out.update(layer_tensors(cfg, side, take))
    extra = sorted(set(hf) - used)
    if extra:
        raise CheckpointError(f"{where}: unexpected tensors {extra[:5]}: not a network of this kind tformer knows")
    return out


def read_hf_m2m100(folder: str | Path, overrides: list[str] = ()) -> ImportedCheckpoint:
    """The checkpoint an M2M-100, NLLB-200 or mBART-50 folder holds (see the module docstring); `overrides` as
    for a tformer checkpoint (decode.*, model.attention)."""
    folder = Path(folder)
    hf = _json(folder / "config.json", "config.json")
    model = model_config(hf, folder / "config.json")
    table = read_table(folder, hf.get("vocab_size"))
    try:
        tok = PieceTableTokenizer(table.spm.read_bytes(), table.vocab, table.rows, str(table.spm),
                                  controls=table.controls)
    except DataError as e:
        raise CheckpointError(str(e)) from None
    tensors = to_tformer(read_weights(folder), model, table.rows, folder)
    tok_cfg = table.settings
    data = DataConfig(task="translation", dir=str(folder.resolve()), languages=tuple(table.codes),
                      language_tag=table.tag, tag_sides="both",
                      src_lang=str(tok_cfg.get("src_lang") or table.codes[0]),
                      tgt_lang=str(tok_cfg.get("tgt_lang") or tok_cfg.get("src_lang") or table.codes[0]))
    decode = dataclasses.replace(_decode_defaults(folder), prefix_score="zero")  # generate scores forced tokens 0
    cfg = Config(model=model, data=data, decode=decode)
    if overrides:
        cfg = from_dict(merge_overrides(to_dict(cfg), list(overrides)))
    fmt = "hf-m2m100" if hf.get("model_type", "m2m_100") == "m2m_100" else "hf-mbart"
    trainer = {"format": FORMAT, "version": FORMAT_VERSION, "step": 0,
               "imported_from": {"format": fmt, "path": str(folder.resolve()), "tokenizer": table.family}}
    return ImportedCheckpoint(folder, cfg, (tok, tok), trainer, tensors=tensors)
