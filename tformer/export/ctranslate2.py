"""Export to CTranslate2 (through CTranslate2's own converter API).

    tformer export --format ctranslate2 RUN_DIR OUT [--quantization int8] [--shortlist FILE]

`TformerConverter` is a `ctranslate2.converters.Converter`: it builds CTranslate2's `TransformerSpec` (pre- or
post-norm, ReLU or GELU, sinusoidal or learned absolute positions as a table) and fills it with the
checkpoint's tensors; CTranslate2's `convert()` validates, optionally quantizes and writes the folder. The
vocabularies are the checkpoint's own (ids 0..3: <pad> <s> </s> <unk>), so CTranslate2 reads and writes the
same pieces tformer does; `</s>` is appended to every source (add_source_eos), the decoder starts from <s>.
Models CTranslate2 cannot express (TUPE, a universal transformer, frame encoders, sparse structures) are
refused with the reason (tformer.export.check_exportable). The folder also holds the SentencePiece models
(source.spm, target.spm), so that it translates without tformer. Translating with the export from tformer:
`translate_ctranslate2`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.export import check_exportable, position_table


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError("export to CTranslate2 needs the ctranslate2 package: pip install 'tformer[export]'") from None
    return ctranslate2


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
                activation=activation, layernorm_embedding=cfg.embed_norm)
            spec.config.add_source_eos = True
            spec.config.decoder_start_token = translator.target_tokenizer.vocab.itos[cfg.start_row]  # <s>'s row
            spec.config.layer_norm_epsilon = cfg.layer_norm_eps
            _fill(spec.encoder, state, "encoder", cfg, model)
            _fill(spec.decoder, state, "decoder", cfg, model)
            spec.decoder.projection.weight = state["generator.weight"]
            spec.decoder.projection.bias = state["generator.bias"]
            spec.register_source_vocabulary(list(translator.source_tokenizer.vocab.itos))
            spec.register_target_vocabulary(list(translator.target_tokenizer.vocab.itos))
            return spec

    return TformerConverter


def _fill(spec, state: dict[str, np.ndarray], side: str, cfg: ModelConfig, model) -> None:
    D = cfg.d_model
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # encoder: a list
    embeddings.weight = state[("src" if side == "encoder" else "tgt") + "_embed.tokens.weight"]
    spec.scale_embeddings = cfg.scale_embedding
    spec.position_encodings.encodings = position_table(cfg, model, side)
    if cfg.norm == "pre":
        spec.layer_norm.gamma, spec.layer_norm.beta = state[f"{side}.norm.weight"], state[f"{side}.norm.bias"]
    if cfg.embed_norm:
        embed = ("src" if side == "encoder" else "tgt") + "_embed.norm"
        spec.layernorm_embedding.gamma, spec.layernorm_embedding.beta = (state[f"{embed}.weight"],
                                                                         state[f"{embed}.bias"])

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

    from tformer.api import load

    converter = _converter_class()(checkpoint, which)
    translator = load(checkpoint, which=which, device="cpu")
    if shortlist is None:
        written = Path(converter.convert(str(out), quantization=quantization, force=force))
    else:
        from tformer.shortlist import Shortlist, write_vmap

        table = Shortlist.load(shortlist)
        table.check(translator)
        with tempfile.TemporaryDirectory() as tmp:
            vmap = write_vmap(table, translator, Path(tmp) / "vmap.txt")
            written = Path(converter.convert(str(out), vmap=str(vmap), quantization=quantization, force=force))
    for name, data in tokenizer_files(translator).items():
        (written / name).write_bytes(data)
    return written


def tokenizer_files(translator) -> dict[str, bytes]:
    """The SentencePiece models that cut text into the pieces of the exported vocabularies: source.spm and
    target.spm (the same model twice for a joint one), as OPUS-MT's CTranslate2 folders hold them; none for a
    model whose tokenizers are not SentencePiece (characters, words)."""
    sides = {"source.spm": translator.source_tokenizer, "target.spm": translator.target_tokenizer}
    return {name: tok.model_bytes for name, tok in sides.items() if getattr(tok, "model_bytes", None)}


def translate_ctranslate2(model_dir: str | Path, translator, sources: list[str], beam: int = 5,
                          len_penalty: float = 0.0, max_len: int = 256, min_len: int = 0, batch_size: int = 64,
                          compute_type: str = "default", threads: int = 0, use_vmap: bool = False,
                          target: str | None = None, source: str | None = None) -> list[str]:
    """Translate raw sentences with an exported model, tokenised and detokenised by the checkpoint's own
    tokenizers (`translator`, a tformer.api.Translator of the exported checkpoint). len_penalty: CTranslate2's
    (score / length**alpha), not tformer's GNMT penalty; at 0 both rank by the summed log-probability.
    min_len: as tformer's decode.min_len (CTranslate2's default is 1). use_vmap: restrict the output to the
    model's vocabulary map (an export with a shortlist). target (and source): a multilingual model's languages,
    whose tokens start every source (<2fr>; M2M-100: __en__) and every output (a target prefix: __fr__), as in
    tformer; the output's token is left out of the text."""
    ctranslate2 = _require_ctranslate2()
    ct2 = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                 intra_threads=threads or torch.get_num_threads())
    tags = translator.language_tags(target, source)
    lead = [] if tags is None or tags.source is None else [tags.source]
    pieces = [translator.pieces(lead + translator.encode(s), "source") for s in sources]
    prefix = None if tags is None or tags.target is None else [translator.pieces([tags.target])] * len(sources)
    results = ct2.translate_batch(pieces, target_prefix=prefix, max_batch_size=batch_size, beam_size=beam,
                                  length_penalty=len_penalty, max_decoding_length=max_len,
                                  min_decoding_length=min_len, use_vmap=use_vmap)
    stoi = translator.target_tokenizer.vocab.stoi
    return [translator.decode([stoi.get(t, 3) for t in r.hypotheses[0]]) for r in results]
