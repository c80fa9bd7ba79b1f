"""A model trained by Marian (the C++ toolkit behind OPUS-MT) read from its own files.

    FOLDER/decoder.yml           names the model and vocabularies (optional when there is one *.npz and one
                                 *.vocab.yml / vocab.yml)
    FOLDER/*.npz                 the weights, numpy arrays named as Marian names them; the architecture in
                                 the array 'special:model.yml' (YAML bytes)
    FOLDER/*.vocab.yml           pieces -> ids (</s> 0, <unk> 1); one file, or one per side
    FOLDER/source.spm, target.spm  SentencePiece models: text -> pieces

Marian's Transformer, as its source (src/models/transformer.h, src/graph/node_initializers.cpp) builds it:
post-norm layers ('transformer-postprocess: dan'; pre-norm is refused) with LayerNorm eps 1e-6, embeddings
always x sqrt(dim-emb), swish or ReLU, an output bias, and sinusoids of its own: sines then cosines with
frequencies 10000^(-i / (dim/2 - 1)) (tensor2tensor's timescales, `model.sinusoid: marian`). Hugging Face's
MarianMT and CTranslate2's Marian converter use 10000^(-2i / dim) instead, so a model converted by them runs
with other positions than it was trained with; imported here it keeps Marian's. Matrices are stored
(in, out): they are transposed. The decoder starts from a zero vector, not from a token: tformer's <s> and
<pad> are zero rows that take no probability (`hf_marian.NO_PROBABILITY`); exported to Hugging Face they become
its <pad>, id V, as Hugging Face's own conversion adds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from tformer.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, from_dict, merge_overrides, \
    to_dict
from tformer.convert.hf_marian import NO_PROBABILITY, ImportedCheckpoint, check_pieces, piece_tokenizers
from tformer.data.vocab import SPECIALS, Vocab
from tformer.errors import CheckpointError
from tformer.checkpoint import FORMAT, FORMAT_VERSION

ACTIVATIONS = {"swish": "silu", "relu": "relu"}
LAYER_NORM_EPS = 1e-6  # Marian's layer_norm(..., 1e-6)


def is_marian_folder(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "decoder.yml").is_file() or any(path.glob("*.npz")))


def _yaml(file: Path) -> Any:
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{file} does not exist") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid YAML ({e})") from None


def files(folder: Path) -> tuple[Path, list[Path], dict[str, Any]]:
    """The model file, the vocabulary files (source, target; one file for both when shared) and decoder.yml's
    decoding options ({} without one)."""
    spec = _yaml(folder / "decoder.yml") if (folder / "decoder.yml").is_file() else {}
    if not isinstance(spec, dict):
        raise CheckpointError(f"{folder / 'decoder.yml'} is not a mapping")
    models = spec.get("models") or sorted(p.name for p in folder.glob("*.npz"))
    vocabs = spec.get("vocabs") or sorted(p.name for p in folder.glob("*vocab.yml"))
    where = folder / "decoder.yml" if spec else folder
    if len(models) != 1:
        raise CheckpointError(f"{where}: expected one model (.npz), found {models or 'none'}; an ensemble imports "
                              "one model at a time (tformer.load takes a list)")
    if len(vocabs) not in (1, 2):
        raise CheckpointError(f"{where}: expected the vocabularies of both sides (.yml), found {vocabs or 'none'}")
    return folder / str(models[0]), [folder / str(v) for v in vocabs], spec


def model_yaml(weights: dict[str, np.ndarray], file: Path) -> dict[str, Any]:
    if "special:model.yml" not in weights:
        raise CheckpointError(f"{file} has no 'special:model.yml': not a Marian model file")
    text = weights["special:model.yml"].tobytes().rstrip(b"\0").decode("utf-8")
    cfg = yaml.safe_load(text)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: 'special:model.yml' is not a mapping")
    return cfg


def model_config(m: dict[str, Any], file: Path) -> ModelConfig:
    """The ModelConfig of Marian's options; anything tformer cannot run is a CheckpointError naming the option."""

    def need(key: str, want: Any, what: str) -> None:
        if m.get(key, want) != want:
            raise CheckpointError(f"{file}: option '{key}' is {m[key]!r}; tformer imports {what} ({key}: {want!r})")

    need("type", "transformer", "Transformers")
    need("transformer-preprocess", "", "post-norm models")
    need("transformer-postprocess", "dan", "post-norm models")
    need("transformer-postprocess-emb", "d", "models without a LayerNorm on the embeddings")
    need("transformer-decoder-autoreg", "self-attention", "self-attention decoders")
    need("transformer-ffn-depth", 2, "two-layer FFNs")
    need("transformer-no-projection", False, "attention with its output projection")
    activation = m.get("transformer-ffn-activation", "swish")
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{file}: option 'transformer-ffn-activation' is {activation!r}; tformer runs "
                              f"{', '.join(ACTIVATIONS)}")
    tied_all, tied_src = bool(m.get("tied-embeddings-all")), bool(m.get("tied-embeddings-src"))
    try:
        return ModelConfig(
            d_model=int(m["dim-emb"]), n_heads=int(m["transformer-heads"]), d_ff=int(m["transformer-dim-ffn"]),
            encoder_layers=int(m["enc-depth"]), decoder_layers=int(m["dec-depth"]),
            dropout=float(m.get("transformer-dropout", 0.1)),
            attention_dropout=float(m.get("transformer-dropout-attention", 0.0)),
            ffn_dropout=float(m.get("transformer-dropout-ffn", 0.0)), activation=ACTIVATIONS[activation],
            norm="post", layer_norm_eps=LAYER_NORM_EPS, positions="sinusoidal", sinusoid="marian",
            scale_embedding=True, share_embeddings=tied_all or tied_src,
            tie_generator=tied_all or bool(m.get("tied-embeddings")))
    except KeyError as e:
        raise CheckpointError(f"{file}: 'special:model.yml' has no option {e}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def read_vocab(file: Path) -> list[str]:
    """A Marian vocabulary (YAML, piece: id) as the list of pieces by id. Read as plain strings, so that no
    piece turns into a number, a boolean or null."""
    try:
        table = yaml.load(file.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    except FileNotFoundError:
        raise CheckpointError(f"{file} does not exist") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid YAML ({e})") from None
    if not isinstance(table, dict) or not all(isinstance(v, str) and v.isdigit() for v in table.values()):
        raise CheckpointError(f"{file} must map each piece to a whole-number id")
    by_id = {int(i): p for p, i in table.items()}
    if sorted(by_id) != list(range(len(table))):
        raise CheckpointError(f"{file}: the ids are not 0 .. {len(table) - 1} once each")
    pieces = [by_id[i] for i in range(len(table))]
    if pieces[:2] != ["</s>", "<unk>"]:
        raise CheckpointError(f"{file}: ids 0 and 1 must be </s> and <unk>, found {pieces[:2]}")
    check_pieces(pieces[2:], file)
    clash = [p for p in pieces[2:] if p in SPECIALS]
    if clash:
        raise CheckpointError(f"{file}: entry {clash[0]!r} is a special token in the middle of the vocabulary; "
                              "tformer cannot map it")
    return pieces


def vocab_rows(pieces: list[str]) -> tuple[Vocab, list[int]]:
    """tformer's Vocab and, per tformer id, the id it gets exported to Hugging Face: <pad> and <s> (the zero
    start vector) -> V, </s> 0, <unk> 1, the others their own."""
    V = len(pieces)
    return Vocab(pieces[2:]), [V, V, 0, 1] + list(range(2, V))


def to_tformer(w: dict[str, np.ndarray], cfg: ModelConfig, V_src: int, V_tgt: int, file: Path) -> dict[str, Tensor]:
    used = {"special:model.yml"}

    def take(name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in w:
            raise CheckpointError(f"{file}: no array '{name}'; the weights do not fit 'special:model.yml'")
        used.add(name)
        a = w[name]
        if a.shape != shape:
            raise CheckpointError(f"{file}: array '{name}' has shape {a.shape}, the options and the vocabulary need "
                                  f"{shape}: the vocabulary does not match the weights")
        return torch.from_numpy(np.array(a, dtype=np.float32))

    D, F = cfg.d_model, cfg.d_ff

    def table(name: str, V: int) -> Tensor:  # (V, D) -> tformer rows: two zero rows (<pad>, <s>), then as is
        return torch.cat([torch.zeros(2, D), take(name, (V, D))])

    out: dict[str, Tensor] = {}
    src_name = "Wemb" if cfg.share_embeddings else "encoder_Wemb"
    tgt_name = "Wemb" if cfg.share_embeddings or "decoder_Wemb" not in w else "decoder_Wemb"
    out["src_embed.tokens.weight"] = table(src_name, V_src)
    if not cfg.share_embeddings:
        out["tgt_embed.tokens.weight"] = table(tgt_name, V_tgt)
    if not cfg.tie_generator:
        out["generator.weight"] = torch.cat([torch.zeros(2, D), take("decoder_ff_logit_out_W", (D, V_tgt)).T])
    out["generator.bias"] = torch.cat([torch.full((2,), NO_PROBABILITY), take("decoder_ff_logit_out_b", (1, V_tgt))[0]])

    def linear(ours: str, theirs: str, n_in: int, n_out: int, suffix: str) -> None:
        out[f"{ours}.weight"] = take(f"{theirs}_W{suffix}", (n_in, n_out)).T.contiguous()
        out[f"{ours}.bias"] = take(f"{theirs}_b{suffix}", (1, n_out))[0]

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"] = take(f"{theirs}_ln_scale", (1, D))[0]
        out[f"{ours}.bias"] = take(f"{theirs}_ln_bias", (1, D))[0]

    for side in ("encoder", "decoder"):
        for i in range(getattr(cfg, f"{side}_layers")):
            ours, theirs = f"{side}.layers.{i}", f"{side}_l{i + 1}"
            blocks = [("self_attn", "self", "res_attn" if side == "encoder" else "res_self")]
            if side == "decoder":
                blocks.append(("cross_attn", "context", "res_cross"))
            for attn, name, residual in blocks:
                for p in ("weight", "bias"):  # q, k, v stacked in that order, as tformer's fused projection
                    out[f"{ours}.{attn}.in_proj.{p}"] = torch.cat([
                        take(f"{theirs}_{name}_W{x}", (D, D)).T if p == "weight" else take(f"{theirs}_{name}_b{x}",
                                                                                             (1, D))[0]
                        for x in "qkv"])
                linear(f"{ours}.{attn}.out_proj", f"{theirs}_{name}", D, D, "o")
                norm(f"{ours}.{residual}.norm", f"{theirs}_{name}_Wo")
            linear(f"{ours}.ffn.linear1", f"{theirs}_ffn", D, F, "1")
            linear(f"{ours}.ffn.linear2", f"{theirs}_ffn", F, D, "2")
            norm(f"{ours}.res_ffn.norm", f"{theirs}_ffn_ffn")
    extra = sorted(set(w) - used)
    if extra:
        raise CheckpointError(f"{file}: unexpected arrays {extra[:5]}: not a Marian Transformer tformer knows")
    return out


def read_marian(folder: str | Path, overrides: list[str] = ()) -> ImportedCheckpoint:
    """The checkpoint a Marian model folder holds (see the module docstring)."""
    folder = Path(folder)
    model_file, vocab_files, spec = files(folder)
    try:
        with np.load(model_file, allow_pickle=False) as npz:
            weights = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise CheckpointError(f"{model_file} does not exist (decoder.yml names it)") from None
    except (OSError, ValueError) as e:  # not a zip, a truncated file, or pickled objects (refused)
        raise CheckpointError(f"{model_file}: cannot be read as a numpy .npz of arrays ({e})") from None
    options = model_yaml(weights, model_file)
    model = model_config(options, model_file)
    src_pieces = read_vocab(vocab_files[0])
    tgt_pieces = read_vocab(vocab_files[-1])
    dims = options.get("dim-vocabs")
    if isinstance(dims, list) and len(dims) == 2 and [len(src_pieces), len(tgt_pieces)] != [int(d) for d in dims]:
        raise CheckpointError(f"{model_file}: 'dim-vocabs' is {dims}, but {vocab_files[0].name} has "
                              f"{len(src_pieces)} entries and {vocab_files[-1].name} {len(tgt_pieces)}: the "
                              "vocabulary does not match the weights")
    tokenizers = piece_tokenizers(folder, [vocab_rows(src_pieces), vocab_rows(tgt_pieces)], len(vocab_files) == 1,
                                  "a Marian model folder")
    if model.share_embeddings and src_pieces != tgt_pieces:
        raise CheckpointError(f"{model_file}: the embeddings are tied across sides, but the two vocabularies differ")
    tensors = to_tformer(weights, model, len(src_pieces), len(tgt_pieces), model_file)
    decode = _decode_defaults(spec, folder / "decoder.yml")
    cfg = Config(model=model, data=DataConfig(task="translation", dir=str(folder.resolve()), src_lang="src",
                                              tgt_lang="tgt"), decode=decode)
    if overrides:  # the caller's: a problem there is a ConfigError naming the override
        cfg = from_dict(merge_overrides(to_dict(cfg), list(overrides)))
    trainer = {"format": FORMAT, "version": FORMAT_VERSION, "step": 0,
               "imported_from": {"format": "marian", "path": str(model_file.resolve())}}
    return ImportedCheckpoint(folder, cfg, (tokenizers[0], tokenizers[1]), trainer, tensors=tensors)


def _decode_defaults(spec: dict[str, Any], file: Path) -> DecodeConfig:
    """decoder.yml's beam-size and normalize (Marian's length penalty: score / length ** normalize); Marian's
    defaults (12, 0) without them; OPUS-MT ships beam-size 6 and normalize 1."""
    beam, alpha = spec.get("beam-size", 12), spec.get("normalize", 0.0)
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise CheckpointError(f"{file}: 'beam-size' must be a whole number >= 1, got {beam!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
        raise CheckpointError(f"{file}: 'normalize' must be a number >= 0, got {alpha!r}")
    return DecodeConfig(strategy="beam" if beam > 1 else "greedy", beam_size=beam, len_penalty=float(alpha),
                        len_penalty_rule="power")
