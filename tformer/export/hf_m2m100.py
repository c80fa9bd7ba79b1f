"""Export to a Hugging Face M2M-100, NLLB-200 or mBART-50 folder: the formats `tformer import` reads
(tformer.convert.hf_m2m100).

    tformer export --format hf-m2m100 RUN_DIR OUT     M2M-100 or NLLB-200 (the tokenizer it was imported with)
    tformer export --format hf-mbart RUN_DIR OUT      mBART-50

For a model imported from such a folder (and fine-tuned, or not): the network must be the folder's kind (M2M-100:
pre-norm, final norms, fairseq's sinusoids, no output bias; mBART: an embedding norm and a learned table with two
unused rows first) and its tokenizer must remember the original ids (PieceTableTokenizer.original). Every entry
goes back to its original id, and the start row's copy (tformer's <s>) is left out: an imported folder's tensors
come back as they were.

The tokenizer files are those its family reads (tformer.convert.hf_languages): M2M-100's vocab.json, or NLLB's and
mBART-50's tokenizer.json, which transformers builds from the SentencePiece model and which is checked, id for id,
against the model's own table before it is kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tformer.errors import ConfigError
from tformer.export.hf_marian import _last_rows, copy_layers

KINDS = {"hf-m2m100": "M2M-100", "hf-mbart": "mBART"}
CLASSES = {"nllb": "NllbTokenizer", "mbart50": "MBart50Tokenizer", "m2m100": "M2M100Tokenizer"}


def _hf_classes(fmt: str):
    try:
        from transformers import M2M100Config, M2M100ForConditionalGeneration, MBartConfig, \
            MBartForConditionalGeneration
    except ImportError:
        raise ConfigError("the Hugging Face export needs transformers: pip install 'tformer[hf]'") from None
    return {"hf-m2m100": (M2M100Config, M2M100ForConditionalGeneration),
            "hf-mbart": (MBartConfig, MBartForConditionalGeneration)}[fmt]


def to_hf_m2m100(model, original: list[int], fmt: str = "hf-m2m100"):
    """The same network as a Hugging Face `M2M100ForConditionalGeneration` (fmt hf-m2m100) or
    `MBartForConditionalGeneration` (hf-mbart), weights copied, built from a config (nothing downloaded);
    `original`: the id each tformer entry has in the folder's numbering."""
    config_class, model_class = _hf_classes(fmt)
    cfg = model.cfg
    mbart = fmt == "hf-mbart"
    want = (("positions", "learned"), ("position_offset", 2), ("embed_norm", True)) if mbart else (
        ("positions", "sinusoidal"), ("sinusoid", "fairseq"), ("embed_norm", False))
    problems = [f"model.{k}={getattr(cfg, k)!r} ({KINDS[fmt]}'s is {v!r})" for k, v in
                (("norm", "pre"), *want, ("share_embeddings", True), ("tie_generator", True), ("kind", "vanilla"))
                if getattr(cfg, k) != v]
    if problems:
        raise ConfigError(f"an {KINDS[fmt]} folder cannot hold this model: {', '.join(problems)}")
    rows = _last_rows(original)
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    bias = ours["generator.bias"][rows]
    if not mbart and bias.abs().max() > 0:
        raise ConfigError(f"M2M-100 has no output bias, but this model's is not zero (largest {bias.abs().max():.3g}): "
                          "it was trained (model.output_bias true); export another format")
    hf_cfg = config_class(
        vocab_size=len(rows), d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embedding, dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout, activation_dropout=cfg.ffn_dropout, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2)
    hf = model_class(hf_cfg).eval()
    with torch.no_grad():
        m = hf.model
        m.shared.weight.copy_(ours["src_embed.tokens.weight"][rows])
        for side, embed, hf_side in (("encoder", "src_embed", m.encoder), ("decoder", "tgt_embed", m.decoder)):
            hf_side.layer_norm.weight.copy_(ours[f"{side}.norm.weight"])
            hf_side.layer_norm.bias.copy_(ours[f"{side}.norm.bias"])
            if mbart:
                hf_side.embed_positions.weight.copy_(ours[f"{embed}.positions.table.weight"])
                hf_side.layernorm_embedding.weight.copy_(ours[f"{embed}.norm.weight"])
                hf_side.layernorm_embedding.bias.copy_(ours[f"{embed}.norm.bias"])
            copy_layers(hf_side, ours, side, cfg.d_model)
        if mbart:
            hf.final_logits_bias.copy_(bias[None])
    return hf


def family(translator) -> tuple[str, list[str]]:
    """Which tokenizer an imported model came with (tformer.convert.hf_languages) and its languages, read from
    the entries its tokenizer leaves out of the text; else a ConfigError."""
    from tformer.convert.hf_languages import M2M_CODES, MASK, TAGS
    from tformer.data.tokenizer import PieceTableTokenizer

    tok = translator.source_tokenizer
    controls = list(tok.controls) if isinstance(tok, PieceTableTokenizer) else []
    if controls and translator.target_tokenizer is tok:
        for codes in M2M_CODES.values():
            if controls == [TAGS["m2m100"].format(c) for c in codes]:
                return "m2m100", codes
        if controls[-1] == MASK:
            return ("mbart50" if translator.config.model.embed_norm else "nllb"), controls[:-1]
    raise ConfigError(f"{translator.path} was not imported from an M2M-100, NLLB-200 or mBART-50 folder (its "
                      "tokenizer has none of their language tokens); export it as another format")


def languages(data, codes: list[str]) -> tuple[str, str]:
    """The source and target language a folder's tokenizer starts with: the run's first direction, else its
    own."""
    from tformer.languages import parse_pairs

    src, tgt = parse_pairs(data.pairs)[0] if data.pairs else (data.src_lang, data.tgt_lang)
    return (src if src in codes else codes[0]), (tgt if tgt in codes else codes[0])


def export_hf_m2m100(checkpoint: str | Path, out: str | Path, force: bool = False, which: str = "best",
                     fmt: str = "hf-m2m100") -> Path:
    """Write the folder (config.json, generation_config.json, model.safetensors, sentencepiece.bpe.model,
    tokenizer_config.json, and vocab.json or tokenizer.json) that transformers loads and `tformer import` reads
    back."""
    from tformer.api import load
    from tformer.convert import remove, replaceable

    out = Path(out)
    replaceable(out, Path(checkpoint), force)
    translator = load(checkpoint, which=which, device="cpu", attention="sdpa")
    kind, codes = family(translator)
    if (kind == "mbart50") != (fmt == "hf-mbart"):
        raise ConfigError(f"{translator.path} holds an {'mBART' if kind == 'mbart50' else 'M2M-100'} network; "
                          f"export it with --format {'hf-mbart' if kind == 'mbart50' else 'hf-m2m100'}")
    tok = translator.source_tokenizer
    hf = to_hf_m2m100(translator.model, tok.original, fmt)
    rows = _last_rows(tok.original)
    names = [{"<bos>": "<s>"}.get(tok.vocab.itos[r], tok.vocab.itos[r]) for r in rows]  # by original id
    remove(out)
    hf.save_pretrained(out)
    (out / "sentencepiece.bpe.model").write_bytes(tok.model_bytes)
    src, tgt = languages(translator.config.data, codes)
    settings = {"tokenizer_class": CLASSES[kind], "src_lang": src, "tgt_lang": tgt, "bos_token": "<s>",
                "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    if kind == "m2m100":
        write_m2m100_vocab(out, names, codes, settings)
    else:
        write_tokenizer_json(out, names, codes, settings, kind)
    return out


def write_m2m100_vocab(out: Path, names: list[str], codes: list[str], settings: dict) -> None:
    """vocab.json (the dictionary: every id before the first language token) and M2M-100's tokenizer_config."""
    from tformer.convert.hf_languages import M2M_CODES, TAGS

    dictionary = names.index(TAGS["m2m100"].format(codes[0]))
    table = {name: i for i, name in enumerate(names[:dictionary])}
    (out / "vocab.json").write_text(json.dumps(table, ensure_ascii=False, indent=1), encoding="utf-8")
    codes_name = next(name for name, c in M2M_CODES.items() if c == codes)
    (out / "tokenizer_config.json").write_text(json.dumps({
        **settings, "language_codes": codes_name, "num_madeup_words": len(names) - dictionary - len(codes)},
        indent=1), encoding="utf-8")


def write_tokenizer_json(out: Path, names: list[str], codes: list[str], settings: dict, kind: str) -> None:
    """NLLB's or mBART-50's tokenizer files: transformers builds its tokenizer from the SentencePiece model and
    these settings; its special tokens then take their ids from the model's table (transformers 5 numbers
    NLLB's <mask> before the languages, fairseq after them), and every id is checked."""
    from transformers import AutoTokenizer

    extra = {"extra_special_tokens": codes, **({"legacy_behaviour": False} if kind == "nllb" else {})}
    (out / "tokenizer_config.json").write_text(json.dumps({**settings, **extra}, indent=1), encoding="utf-8")
    AutoTokenizer.from_pretrained(out).save_pretrained(out)
    file = out / "tokenizer.json"
    spec = json.loads(file.read_text(encoding="utf-8"))
    ids = {name: i for i, name in enumerate(names)}
    for added in spec.get("added_tokens", []):
        added["id"] = ids.get(added["content"], added["id"])
    file.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    got = AutoTokenizer.from_pretrained(out).get_vocab()
    wrong = [(name, got.get(name), i) for i, name in enumerate(names) if not name.startswith("<unused")
             and got.get(name) != i]
    if wrong or len(got) != sum(not n.startswith("<unused") for n in names):
        raise ConfigError(f"{out}: transformers' {CLASSES[kind]} numbers the entries otherwise than the model "
                          f"(entry, its id there, the model's: {wrong[:3]}); the folder's tokenizer is not usable")
