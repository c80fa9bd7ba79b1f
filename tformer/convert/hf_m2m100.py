"""A Hugging Face M2M-100 folder (M2M100ForConditionalGeneration with M2M100Tokenizer, as facebook/m2m100_418M
is saved) as a tformer checkpoint that translates between all its languages.

    FOLDER/config.json               model_type "m2m_100": the architecture and the special ids
    FOLDER/model.safetensors         the weights (or shards, or pytorch_model.bin: tformer.convert.hf_marian)
    FOLDER/sentencepiece.bpe.model   text -> pieces
    FOLDER/vocab.json                pieces -> ids: fairseq's dictionary, <s> 0, <pad> 1, </s> 2, <unk> 3, ...
    FOLDER/tokenizer_config.json     language_codes ('m2m100': 100 languages; 'wmt21': 8), num_madeup_words

M2M-100 is a pre-norm Transformer with a final LayerNorm on each side, ReLU, embeddings scaled by sqrt(d),
fairseq's sinusoids (`model.sinusoid: fairseq`) and one table for source, target and output, without an output
bias. A source is its language's token (__en__), its pieces and </s>; the decoder starts from </s>, and its first
output is the target's token (__fr__: generate's forced_bos_token_id). That is tformer's `data.tag_sides: both`
with `data.language_tag: __{}__`, and translate(..., source="en", target="fr") asks for it.

The entries are renumbered into tformer's layout: <pad> (1), <s> (the decoder's start: a copy of </s> whose
output takes no probability, NO_PROBABILITY, so tformer's softmax over V + 1 entries equals M2M-100's over V),
</s> (2), <unk> (3); then fairseq's <s> (0, named <bos>), the dictionary's pieces, the language tokens (the ids
after the dictionary, in language_codes' order: decoding leaves them out of the text) and the made-up words.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer.checkpoint import FORMAT, FORMAT_VERSION
from tformer.config import Config, ConfigError, DataConfig, ModelConfig, from_dict, merge_overrides, to_dict
from tformer.convert.hf_marian import (NO_PROBABILITY, ImportedCheckpoint, _decode_defaults, _json, check_pieces,
                                       layer_tensors, read_weights)
from tformer.data.tokenizer import PieceTableTokenizer
from tformer.data.vocab import Vocab
from tformer.errors import CheckpointError, DataError

LANGUAGE_CODES = {  # fairseq's language lists, in the order their tokens follow the dictionary
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi "
               "hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns "
               "oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh "
               "zu").split(),
    "wmt21": ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"],
}
TAG = "__{}__"
BOS = "<bos>"  # fairseq's <s> (id 0), which tformer's layout keeps as an ordinary entry


def model_config(hf: dict[str, Any], file: Path) -> ModelConfig:
    """The ModelConfig of an M2M-100 config.json; an architecture tformer cannot run is named."""
    def get(key: str, default: Any = None) -> Any:
        if key not in hf and default is None:
            raise CheckpointError(f"{file}: no '{key}'; an M2M-100 config.json has it")
        return hf.get(key, default)

    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(enc) != get(dec):
            raise CheckpointError(f"{file}: '{enc}' is {get(enc)} but '{dec}' is {get(dec)}; tformer's encoder and "
                                  "decoder layers have one size")
    activation = get("activation_function", "relu")
    if activation not in ("relu", "gelu"):
        raise CheckpointError(f"{file}: 'activation_function' is {activation!r}; tformer runs relu and gelu")
    for key, want in (("pad_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 2)):
        if hf.get(key, want) != want:
            raise CheckpointError(f"{file}: '{key}' is {hf[key]!r}; M2M-100's is {want} (fairseq's dictionary)")
    try:
        return ModelConfig(
            d_model=get("d_model"), n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
            encoder_layers=get("encoder_layers"), decoder_layers=get("decoder_layers"),
            dropout=float(hf.get("dropout") or 0.0), attention_dropout=float(hf.get("attention_dropout") or 0.0),
            ffn_dropout=float(hf.get("activation_dropout") or 0.0), activation=activation, norm="pre",
            positions="sinusoidal", sinusoid="fairseq", scale_embedding=bool(hf.get("scale_embedding", True)),
            max_positions=get("max_position_embeddings", 1024), share_embeddings=True, tie_generator=True)
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def vocabulary(table: Any, size: int, codes: list[str], madeup: int, file: Path) -> tuple[Vocab, list[int]]:
    """vocab.json plus the language tokens and made-up words after it, as tformer's Vocab and, per tformer id,
    the original id of its row."""
    if not isinstance(table, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in table.values()):
        raise CheckpointError(f"{file} must map each piece to a whole-number id")
    n = len(table)
    if set(table.values()) != set(range(n)):
        raise CheckpointError(f"{file}: its ids are not 0 .. {n - 1}")
    piece = {i: p for p, i in table.items()}
    for i, want in enumerate(("<s>", "<pad>", "</s>", "<unk>")):
        if piece.get(i) != want:
            raise CheckpointError(f"{file}: id {i} is {piece.get(i)!r}, not {want!r} (fairseq's dictionary)")
    names = [piece[i] for i in range(n)] + [TAG.format(c) for c in codes]
    names += [f"madeupword{k:04d}" for k in range(madeup)]
    if len(names) != size:
        raise CheckpointError(f"{file} has {n} entries, {len(codes)} language tokens and {madeup} made-up words "
                              f"follow it: {len(names)} in all, but config.json's 'vocab_size' is {size}; the "
                              "vocabulary does not match the weights (check tokenizer_config.json's language_codes)")
    rows = [1, 2, 2, 3, 0, *range(4, size)]  # <pad>, the start (a copy of </s>), </s>, <unk>, <s> as <bos>, ...
    others = [BOS] + names[4:]
    check_pieces(others, file)
    return Vocab(others), rows


def to_tformer(hf: dict[str, Tensor], cfg: ModelConfig, rows: list[int], where: Path) -> dict[str, Tensor]:
    """M2M-100's tensors under tformer's names, rows permuted; unknown or missing tensors are named."""
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
    bias = torch.zeros(len(rows))
    bias[1] = NO_PROBABILITY  # the start row's copy takes no probability
    out["generator.bias"] = bias
    for side in ("encoder", "decoder"):
        used.add(f"model.{side}.embed_positions.weights")  # fairseq's sinusoids, computed (model.sinusoid)
        for p in ("weight", "bias"):
            out[f"{side}.norm.{p}"] = take(f"model.{side}.layer_norm.{p}")
        out.update(layer_tensors(cfg, side, take))
    extra = sorted(set(hf) - used)
    if extra:
        raise CheckpointError(f"{where}: unexpected tensors {extra[:5]}: not an M2M-100 network tformer knows")
    return out


def read_hf_m2m100(folder: str | Path, overrides: list[str] = ()) -> ImportedCheckpoint:
    """The checkpoint an M2M-100 folder holds (see the module docstring); `overrides` as for a tformer
    checkpoint (decode.*, model.attention)."""
    folder = Path(folder)
    hf = _json(folder / "config.json", "config.json")
    model = model_config(hf, folder / "config.json")
    tok_cfg = _json(folder / "tokenizer_config.json", "tokenizer_config.json (its language_codes)")
    codes_name = tok_cfg.get("language_codes", "m2m100") if isinstance(tok_cfg, dict) else None
    if codes_name not in LANGUAGE_CODES:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: language_codes {codes_name!r}; tformer knows "
                              f"{', '.join(LANGUAGE_CODES)}")
    codes = LANGUAGE_CODES[codes_name]
    madeup = tok_cfg.get("num_madeup_words", 8)
    if not isinstance(madeup, int) or isinstance(madeup, bool) or madeup < 0:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: num_madeup_words must be a whole number")
    table = _json(folder / "vocab.json", "vocab.json (the pieces' ids)")
    vocab, rows = vocabulary(table, hf.get("vocab_size"), codes, madeup, folder / "vocab.json")
    spm = folder / "sentencepiece.bpe.model"
    try:
        tok = PieceTableTokenizer(spm.read_bytes(), vocab, rows, str(spm), controls=[TAG.format(c) for c in codes])
    except FileNotFoundError:
        raise CheckpointError(f"{spm} does not exist: an M2M-100 folder needs its SentencePiece model") from None
    except DataError as e:
        raise CheckpointError(str(e)) from None
    tensors = to_tformer(read_weights(folder), model, rows, folder)
    data = DataConfig(task="translation", dir=str(folder.resolve()), languages=tuple(codes), language_tag=TAG,
                      tag_sides="both", src_lang=str(tok_cfg.get("src_lang") or "en"),
                      tgt_lang=str(tok_cfg.get("tgt_lang") or "en"))
    decode = dataclasses.replace(_decode_defaults(folder), prefix_score="zero")  # generate scores forced tokens 0
    cfg = Config(model=model, data=data, decode=decode)
    if overrides:
        cfg = from_dict(merge_overrides(to_dict(cfg), list(overrides)))
    trainer = {"format": FORMAT, "version": FORMAT_VERSION, "step": 0,
               "imported_from": {"format": "hf-m2m100", "path": str(folder.resolve())}}
    return ImportedCheckpoint(folder, cfg, (tok, tok), trainer, tensors=tensors)
