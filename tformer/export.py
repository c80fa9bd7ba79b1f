"""Export a trained model to CTranslate2 (through CTranslate2's own converter API).

    tformer export --format ctranslate2 RUN_DIR OUT [--quantization int8]

`TformerConverter` is a `ctranslate2.converters.Converter`: it builds CTranslate2's `TransformerSpec` (pre- or
post-norm, ReLU or GELU, sinusoidal or learned absolute positions as a table) and fills it with the
checkpoint's tensors; CTranslate2's `convert()` validates, optionally quantizes and writes the folder. The
vocabularies are the checkpoint's own (ids 0..3: <pad> <s> </s> <unk>), so CTranslate2 reads and writes the
same pieces tformer does; `</s>` is appended to every source (add_source_eos), the decoder starts from <s>.
Models CTranslate2 cannot express (TUPE, a universal transformer, frame encoders, sparse structures) are
refused with the reason. Translating with the export: `translate_ctranslate2`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.model.cache import DecoderCache
from tformer.positions import sinusoidal_table


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError("export to CTranslate2 needs the ctranslate2 package: pip install ctranslate2") from None
    return ctranslate2


def check_exportable(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the setting CTranslate2's Transformer cannot express."""
    problems = []
    if cfg.kind != "vanilla":
        problems.append(f"model.kind={cfg.kind} (ACT halting has no CTranslate2 counterpart)")
    if cfg.source != "tokens":
        problems.append("model.source=features (a frame encoder)")
    for key, value, default in (("norm_layer", cfg.norm_layer, "layernorm"), ("ffn", cfg.ffn, "standard"),
                                ("qk_norm", cfg.qk_norm, False),
                                ("kv_heads", 0 if cfg.kv_heads == cfg.n_heads else cfg.kv_heads, 0)):
        if value != default:
            problems.append(f"model.{key}={value}")
    for side in ("encoder", "decoder"):
        if cfg.side_positions(side) not in ("sinusoidal", "learned"):
            problems.append(f"{side} positions {cfg.side_positions(side)} (an attention bias)")
    if not (cfg.encoder_structure.window == cfg.decoder_structure.window == 0
            and not cfg.encoder_structure.edges and not cfg.decoder_structure.edges
            and cfg.encoder_structure.dilation == cfg.decoder_structure.dilation == 1
            and cfg.encoder_structure.global_tokens == cfg.decoder_structure.global_tokens == 0):
        problems.append("a sparse attention structure")
    if problems:
        raise ConfigError("CTranslate2 cannot run this model: " + "; ".join(problems))


def _converter_class():
    """TformerConverter, defined once ctranslate2 is known to be importable (it is an optional dependency)."""
    _require_ctranslate2()
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import common_spec, transformer_spec

    class TformerConverter(Converter):
        """A tformer checkpoint (run folder or checkpoint folder) as a CTranslate2 model specification."""

        def __init__(self, checkpoint: str | Path, which: str = "best") -> None:
            self.checkpoint, self.which = str(checkpoint), which

        def _load(self):
            from tformer.api import load

            translator = load(self.checkpoint, which=self.which, device="cpu")
            cfg, model = translator.config.model, translator.model
            check_exportable(cfg)
            state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
            activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                          "silu": common_spec.Activation.SWISH}[cfg.activation]
            spec = transformer_spec.TransformerSpec.from_config(
                (cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=cfg.norm == "pre",
                activation=activation)
            spec.config.add_source_eos = True
            spec.config.decoder_start_token = "<s>"
            spec.config.layer_norm_epsilon = cfg.layer_norm_eps
            _fill(spec.encoder, state, "encoder", cfg, model)
            _fill(spec.decoder, state, "decoder", cfg, model)
            spec.decoder.projection.weight = state["generator.weight"]
            spec.decoder.projection.bias = state["generator.bias"]
            spec.register_source_vocabulary(list(translator.source_tokenizer.vocab.itos))
            spec.register_target_vocabulary(list(translator.target_tokenizer.vocab.itos))
            return spec

    return TformerConverter


def _positions(cfg: ModelConfig, model, side: str) -> np.ndarray:
    embed = model.src_embed if side == "encoder" else model.tgt_embed
    if cfg.side_positions(side) == "sinusoidal":
        return sinusoidal_table(cfg.max_positions, cfg.d_model, cfg.sinusoid).numpy()
    return embed.positions.table.weight.detach().float().numpy()  # learned


def _fill(spec, state: dict[str, np.ndarray], side: str, cfg: ModelConfig, model) -> None:
    D = cfg.d_model
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # encoder: a list
    embeddings.weight = state[("src" if side == "encoder" else "tgt") + "_embed.tokens.weight"]
    spec.scale_embeddings = cfg.scale_embedding
    spec.position_encodings.encodings = _positions(cfg, model, side)
    if cfg.norm == "pre":
        spec.layer_norm.gamma, spec.layer_norm.beta = state[f"{side}.norm.weight"], state[f"{side}.norm.bias"]

    def linear(target, name: str, rows: slice = slice(None)) -> None:
        target.weight = state[f"{name}.weight"][rows]
        target.bias = state[f"{name}.bias"][rows]

    def norm(target, name: str) -> None:
        target.gamma, target.beta = state[f"{name}.weight"], state[f"{name}.bias"]

    for i, layer in enumerate(spec.layer):
        p = f"{side}.layers.{i}"
        linear(layer.self_attention.linear[0], f"{p}.self_attn.in_proj")  # fused q, k, v: the same row order
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.res_attn.norm" if side == "encoder" else f"{p}.res_self.norm")
        if side == "decoder":
            linear(layer.attention.linear[0], f"{p}.cross_attn.in_proj", slice(0, D))
            linear(layer.attention.linear[1], f"{p}.cross_attn.in_proj", slice(D, 3 * D))  # fused k, v
            linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
            norm(layer.attention.layer_norm, f"{p}.res_cross.norm")
        linear(layer.ffn.linear_0, f"{p}.ffn.linear1")
        linear(layer.ffn.linear_1, f"{p}.ffn.linear2")
        norm(layer.ffn.layer_norm, f"{p}.res_ffn.norm")


def export_ctranslate2(checkpoint: str | Path, out: str | Path, quantization: str | None = None,
                       force: bool = False, which: str = "best", shortlist: str | Path | None = None) -> Path:
    """Write the CTranslate2 model folder `out`; returns it. `shortlist` (a tformer.shortlist file for this
    checkpoint's vocabularies): written as the folder's vocabulary map, vmap.txt, which CTranslate2 applies with
    translate_batch(..., use_vmap=True) (to the batch's union of lists, where tformer applies each sentence's)."""
    import tempfile

    converter = _converter_class()(checkpoint, which)
    if shortlist is None:
        return Path(converter.convert(str(out), quantization=quantization, force=force))
    from tformer.api import load
    from tformer.shortlist import Shortlist, write_vmap

    table, translator = Shortlist.load(shortlist), load(checkpoint, which=which, device="cpu")
    table.check(translator)
    with tempfile.TemporaryDirectory() as tmp:
        vmap = write_vmap(table, translator, Path(tmp) / "vmap.txt")
        return Path(converter.convert(str(out), vmap=str(vmap), quantization=quantization, force=force))


def translate_ctranslate2(model_dir: str | Path, translator, sources: list[str], beam: int = 5,
                          len_penalty: float = 0.0, max_len: int = 256, min_len: int = 0, batch_size: int = 64,
                          compute_type: str = "default", threads: int = 0, use_vmap: bool = False) -> list[str]:
    """Translate raw sentences with an exported model, tokenised and detokenised by the checkpoint's own
    tokenizers (`translator`, a tformer.api.Translator of the exported checkpoint). len_penalty: CTranslate2's
    (score / length**alpha), not tformer's GNMT penalty; at 0 both rank by the summed log-probability.
    min_len: as tformer's decode.min_len (CTranslate2's default is 1). use_vmap: restrict the output to the
    model's vocabulary map (an export with a shortlist)."""
    ctranslate2 = _require_ctranslate2()
    ct2 = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                 intra_threads=threads or torch.get_num_threads())
    pieces = [translator.pieces(translator.encode(s), "source") for s in sources]
    results = ct2.translate_batch(pieces, max_batch_size=batch_size, beam_size=beam, length_penalty=len_penalty,
                                  max_decoding_length=max_len, min_decoding_length=min_len, use_vmap=use_vmap)
    stoi = translator.target_tokenizer.vocab.stoi
    return [translator.decode([stoi.get(t, 3) for t in r.hypotheses[0]]) for r in results]


# ------------------------------------------------------------------------------------------ Hugging Face


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
        raise ConfigError("the Hugging Face export needs transformers: pip install transformers") from None
    cfg = model.cfg
    check_exportable(cfg)
    if cfg.norm != "post":
        raise ConfigError("MarianMT is post-norm only; this model is model.norm=pre")
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
    D = cfg.d_model
    with torch.no_grad():
        m = hf.model

        def copy(module: torch.nn.Module, name: str, rows: slice = slice(None)) -> None:
            """module.weight/bias <- ours[name.weight/bias] (rows of a fused projection)."""
            module.weight.copy_(ours[f"{name}.weight"][rows])
            module.bias.copy_(ours[f"{name}.bias"][rows])

        def attention(hf_attn, name: str) -> None:  # our fused (3D, D) in_proj -> q, k, v
            for j, proj in enumerate((hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj)):
                copy(proj, f"{name}.in_proj", slice(j * D, (j + 1) * D))
            copy(hf_attn.out_proj, f"{name}.out_proj")

        m.encoder.embed_tokens.weight.copy_(ours["src_embed.tokens.weight"][src_rows])
        m.decoder.embed_tokens.weight.copy_(ours["tgt_embed.tokens.weight"][tgt_rows])
        if shared and m.shared.weight.data_ptr() != m.encoder.embed_tokens.weight.data_ptr():
            m.shared.weight.copy_(ours["src_embed.tokens.weight"][src_rows])  # untied output: its own table
        for side, hf_side in (("encoder", m.encoder), ("decoder", m.decoder)):
            hf_side.embed_positions.weight.copy_(torch.from_numpy(_positions(cfg, model, side))[
                : hf_side.embed_positions.weight.shape[0]])
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
        if hf.lm_head.weight.data_ptr() != m.decoder.embed_tokens.weight.data_ptr():
            hf.lm_head.weight.copy_(ours["generator.weight"][tgt_rows])
        hf.final_logits_bias.copy_(ours["generator.bias"][tgt_rows][None])
    return hf


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


# ------------------------------------------------------------------------------------------ ONNX


class OnnxEncoder(torch.nn.Module):
    """The encoder and the first decoding step (from <s>), as one graph: src (B, S) int64 ids with </s>,
    src_lengths (B,) -> log-probabilities of the first token (B, V), src_mask (B, S), the cross-attention
    keys and values of every layer (L, B, H, S, Dh) and the self-attention cache after position 0
    (L, B, H, 1, Dh). Starting the step graph from a cache of length >= 1 keeps its shapes free of zeros."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, src, src_lengths):
        from tformer.data.vocab import Vocab

        enc = self.model.encode(src, src_lengths)
        cache = dataclasses.replace(self.model.init_cache(enc), preallocated=False)  # traced: plain tensors
        bos = torch.full((src.shape[0],), Vocab.bos, dtype=torch.long, device=src.device)
        logits, cache = self.model.decode_step(bos, cache)
        return (torch.log_softmax(logits, -1), cache.src_mask, torch.stack([k for k, _ in cache.cross]),
                torch.stack([v for _, v in cache.cross]), torch.stack([k for k, _ in cache.self_kv]),
                torch.stack([v for _, v in cache.self_kv]))


class OnnxStep(torch.nn.Module):
    """One decoding step: tokens (N,) at position t = the cache length, src_mask (N, S), cross keys/values
    (L, N, H, S, Dh), self cache (L, N, H, t, Dh) -> log-probabilities (N, V) and the cache with position t
    (L, N, H, t+1, Dh). One row per hypothesis: for a beam, repeat a sentence's rows."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens, src_mask, cross_k, cross_v, self_k, self_v):
        cache = DecoderCache(src_mask, list(zip(cross_k, cross_v)), list(zip(self_k, self_v)))
        logits, new = self.model.decode_step(tokens, cache)
        return (torch.log_softmax(logits, -1), torch.stack([k for k, _ in new.self_kv]),
                torch.stack([v for _, v in new.self_kv]))


def export_onnx(checkpoint: str | Path, out: str | Path, which: str = "best") -> tuple[Path, Path]:
    """Write OUT/encoder.onnx and OUT/step.onnx (dynamic batch, source and cache lengths) plus the
    vocabularies; returns the two model paths."""
    from tformer.api import load
    from tformer.training.checkpoint import save_tokenizers

    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError("ONNX export needs onnx and onnxscript: pip install onnx onnxscript") from None
    translator = load(checkpoint, which=which, device="cpu", attention="sdpa")  # graph weights run padded too
    cfg, model = translator.config.model, translator.model
    check_exportable(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    L, H, Dh = len(model.decoder.layers), cfg.n_heads, cfg.d_model // cfg.n_heads
    B, S, T = 2, 7, 3
    src = torch.randint(4, 10, (B, S))
    lengths = torch.tensor([S, S - 2])
    batch, source, past = torch.export.Dim("batch"), torch.export.Dim("source"), torch.export.Dim("past")
    enc_path, step_path = out / "encoder.onnx", out / "step.onnx"
    with torch.inference_mode():
        torch.onnx.export(OnnxEncoder(model).eval(), (src, lengths), str(enc_path), dynamo=True,
                          input_names=["src", "src_lengths"],
                          output_names=["log_probs", "src_mask", "cross_k", "cross_v", "self_k", "self_v"],
                          dynamic_shapes=({0: batch, 1: source}, {0: batch}))
        step_args = (torch.randint(4, 10, (B,)), torch.ones(B, S, dtype=torch.bool), torch.randn(L, B, H, S, Dh),
                     torch.randn(L, B, H, S, Dh), torch.randn(L, B, H, T, Dh), torch.randn(L, B, H, T, Dh))
        torch.onnx.export(OnnxStep(model).eval(), step_args, str(step_path), dynamo=True,
                          input_names=["tokens", "src_mask", "cross_k", "cross_v", "self_k", "self_v"],
                          output_names=["log_probs", "new_self_k", "new_self_v"],
                          dynamic_shapes=({0: batch}, {0: batch, 1: source}, {1: batch, 3: source},
                                          {1: batch, 3: source}, {1: batch, 3: past}, {1: batch, 3: past}))
    save_tokenizers(translator.checkpoint.tokenizers, out)
    return enc_path, step_path


def onnx_greedy(folder: str | Path, sources: list[list[int]], max_len: int = 100) -> list[list[int]]:
    """Greedy decoding with the exported graphs in onnxruntime (ids in, ids out; <pad> and <s> never
    chosen, as in tformer's search): the reference use of the export, and its test."""
    import onnxruntime as ort

    folder = Path(folder)
    enc = ort.InferenceSession(str(folder / "encoder.onnx"), providers=["CPUExecutionProvider"])
    step = ort.InferenceSession(str(folder / "step.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for ids in sources:  # one sentence at a time: the simplest correct loop
        src = np.array([ids + [2]], dtype=np.int64)
        logp, mask, ck, cv, sk, sv = enc.run(None, {"src": src, "src_lengths": np.array([src.shape[1]])})
        tokens: list[int] = []
        for _ in range(max_len):
            logp[:, :2] = -np.inf
            tok = int(logp[0].argmax())
            if tok == 2:
                break
            tokens.append(tok)
            logp, sk, sv = step.run(None, {"tokens": np.array([tok], dtype=np.int64), "src_mask": mask,
                                           "cross_k": ck, "cross_v": cv, "self_k": sk, "self_v": sv})
        out.append(tokens)
    return out


# ------------------------------------------------------------------------------------------ Argos Translate


def export_argos(checkpoint: str | Path, out: str | Path, quantization: str | None = "int8", force: bool = False,
                 which: str = "best", version: str = "1.0") -> Path:
    """An Argos Translate package (`out`, a .argosmodel zip) that argostranslate installs
    (argostranslate.package.install_from_path) and LibreTranslate serves: the CTranslate2 model (`model/`,
    int8 by default), the SentencePiece model (`sentencepiece.model`, one for both sides, as Argos reads it),
    metadata.json (the languages), a README.md, and, where spaCy is installed, a blank spaCy pipeline of the
    source language (`spacy/`) to which Argos adds spaCy's rule-based sentencizer, offline, with
    ARGOS_CHUNK_TYPE=SPACY (by default Argos splits sentences with
    MiniSBD, which downloads its model on first use). Returns `out`."""
    import shutil
    import tempfile
    import zipfile

    from tformer.api import load
    from tformer.convert import replaceable
    from tformer.data.tokenizer import PieceTableTokenizer, SubwordTokenizer

    out = Path(out)
    if out.suffix != ".argosmodel":
        raise ConfigError(f"an Argos package is a .argosmodel file; got {out}")
    replaceable(out, Path(checkpoint), force)
    translator = load(checkpoint, which=which, device="cpu")
    src_tok, tgt_tok = translator.source_tokenizer, translator.target_tokenizer
    if not all(isinstance(t, (SubwordTokenizer, PieceTableTokenizer)) for t in (src_tok, tgt_tok)):
        raise ConfigError(f"{translator.path} does not read text with SentencePiece; an Argos package needs one "
                          "SentencePiece model")
    if src_tok.model_bytes != tgt_tok.model_bytes:
        raise ConfigError(f"{translator.path} has two SentencePiece models (source and target); an Argos package "
                          "tokenises and detokenises with one: train with data.joint_vocab=true")
    data = translator.config.data
    from tformer.serve.libretranslate import NAMES

    name = f"translate-{data.src_lang}_{data.tgt_lang}-{version.replace('.', '_')}"
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = Path(tmp) / name
        export_ctranslate2(checkpoint, root / "model", quantization=quantization, force=True, which=which)
        (root / "sentencepiece.model").write_bytes(src_tok.model_bytes)
        metadata = {"package_version": version, "argos_version": "1.9", "from_code": data.src_lang,
                    "from_name": NAMES.get(data.src_lang, data.src_lang), "to_code": data.tgt_lang,
                    "to_name": NAMES.get(data.tgt_lang, data.tgt_lang), "type": "translate", "links": []}
        (root / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n", encoding="utf-8")
        (root / "README.md").write_text(f"# {metadata['from_name']} to {metadata['to_name']}\n\nExported by tformer "
                                        f"from {translator.path} ({quantization or 'float32'} weights).\n",
                                        encoding="utf-8")
        try:
            import spacy
        except ImportError:
            spacy = None
        if spacy is not None:
            # the language's tokenizer rules, no pipes: Argos adds spaCy's rule-based sentencizer when it loads it
            nlp = spacy.blank(data.src_lang) if data.src_lang in _spacy_languages(spacy) else spacy.blank("xx")
            nlp.to_disk(root / "spacy")
        packed = Path(tmp) / "package.zip"
        with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as z:
            for file in sorted(root.rglob("*")):
                z.write(file, file.relative_to(root.parent))
        shutil.move(packed, out)
    return out


def _spacy_languages(spacy) -> set[str]:
    """The language codes spaCy has a blank pipeline (its tokenizer rules) for."""
    from spacy.util import registry

    return set(registry.languages.get_all())
