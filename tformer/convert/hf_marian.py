"""A Hugging Face MarianMT folder (an OPUS-MT model saved by `transformers`) as a tformer checkpoint.

    FOLDER/config.json                    model_type "marian": the architecture and the special ids
    FOLDER/model.safetensors              the weights (or model.safetensors.index.json + shards, or
                                          pytorch_model.bin, read with torch's tensors-only unpickler)
    FOLDER/source.spm, target.spm         SentencePiece models: text -> pieces
    FOLDER/vocab.json                     pieces -> ids (+ target_vocab.json when tokenizer_config.json says
                                          separate_vocabs)

MarianMT is the paper's post-norm Transformer with Hugging Face's sinusoidal table (sines, then cosines:
`model.sinusoid: halves`), embeddings scaled by sqrt(d) when `scale_embedding`, ReLU, GELU or swish (SiLU),
an output bias (`final_logits_bias`) and, usually, one embedding table for source, target and output.

Its vocabulary numbers </s> 0, <unk> 1 and <pad> last, and the decoder starts from <pad>: there is no <s>.
Imported, the entries are renumbered into tformer's layout (`vocab_rows`): <pad>, <s>, </s>, <unk>, then the
others in their original order, and every weight row with them. The start row (the original <pad>) becomes
<s>; tformer's <pad> is a copy of it whose output bias is `NO_PROBABILITY`, so the softmax over tformer's
V + 1 outputs equals MarianMT's over its V (the extra entry's exp is 0 in every float format, and the value
stays finite for the checkpoint checks, weight decay and label smoothing).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, from_dict, merge_overrides, \
    to_dict
from tformer.data.tokenizer import PieceTableTokenizer
from tformer.data.vocab import SPECIALS, Vocab
from tformer.errors import CheckpointError, DataError
from tformer.positions import sinusoidal_table
from tformer.checkpoint import FORMAT, FORMAT_VERSION, Checkpoint

NO_PROBABILITY = -1e4  # output bias of the duplicated <pad> entry (see the module docstring)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}  # transformers -> tformer
UNSUPPORTED = {  # config.json flags of BART-family models that MarianMT does not have: true means another network
    "normalize_before": "pre-norm layers", "add_final_layer_norm": "a final LayerNorm",
    "normalize_embedding": "a LayerNorm on the embeddings", "add_bias_logits": "a second output bias",
}


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a Hugging Face config.json that is not a tformer checkpoint or run folder."""
    path = Path(path)
    return (path / "config.json").is_file() and not (path / "trainer.json").exists() \
        and not (path / "checkpoints").is_dir()


def _json(file: Path, what: str) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{file} does not exist: a Hugging Face Marian folder needs {what}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e})") from None


def model_config(hf: dict[str, Any], file: Path) -> ModelConfig:
    """The ModelConfig of a MarianMT config.json; an architecture tformer cannot run is a CheckpointError naming
    the field and its value."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{file} is not a JSON object")
    kind = hf.get("model_type")
    if kind != "marian":
        raise CheckpointError(f"{file}: model_type {kind!r} is not supported; tformer imports Hugging Face 'marian' "
                              "models (MarianMTModel, the OPUS-MT family), 'm2m_100' ones (M2M-100, NLLB-200) and "
                              "'mbart' ones (mBART-50)")

    def get(key: str, default: Any = None) -> Any:
        if key not in hf and default is None:
            raise CheckpointError(f"{file}: no '{key}'; a MarianMT config.json has it")
        return hf.get(key, default)

    for key, what in UNSUPPORTED.items():
        if hf.get(key) and what:
            raise CheckpointError(f"{file}: '{key}' is {hf[key]!r} ({what}); tformer's Marian import reads "
                                  "post-norm MarianMT models only")
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(enc) != get(dec):
            raise CheckpointError(f"{file}: '{enc}' is {get(enc)} but '{dec}' is {get(dec)}; tformer's encoder and "
                                  "decoder layers have one size")
    activation = get("activation_function", "swish")
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{file}: 'activation_function' is {activation!r}; tformer runs "
                              f"{', '.join(sorted(ACTIVATIONS))}")
    share = bool(hf.get("share_encoder_decoder_embeddings", True))
    if share and hf.get("decoder_vocab_size") not in (None, get("vocab_size")):
        raise CheckpointError(f"{file}: 'share_encoder_decoder_embeddings' is true but 'decoder_vocab_size' "
                              f"({hf['decoder_vocab_size']}) differs from 'vocab_size' ({hf['vocab_size']})")
    try:
        return ModelConfig(
            d_model=get("d_model"), n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
            encoder_layers=get("encoder_layers"), decoder_layers=get("decoder_layers"),
            dropout=float(hf.get("dropout") or 0.0), attention_dropout=float(hf.get("attention_dropout") or 0.0),
            ffn_dropout=float(hf.get("activation_dropout") or 0.0), activation=ACTIVATIONS[activation], norm="post",
            positions="sinusoidal", sinusoid="halves", scale_embedding=bool(hf.get("scale_embedding", False)),
            max_positions=get("max_position_embeddings", 1024), share_embeddings=share,
            tie_generator=bool(hf.get("tie_word_embeddings", True)))
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {e}") from None


@dataclass(frozen=True)
class SpecialIds:
    """The original ids of the entries tformer numbers 0..3: <pad>, the decoder's start (<s>), </s>, <unk>."""

    pad: int
    start: int
    eos: int
    unk: int


def check_pieces(pieces: list[str], file: Path) -> None:
    """Every entry non-empty and without whitespace, as tformer's vocabulary files need them."""
    for p in pieces:
        if not p or any(c.isspace() for c in p):
            raise CheckpointError(f"{file}: entry {p!r} is empty or holds whitespace; tformer's vocabularies cannot "
                                  "hold it")


def vocab_rows(table: Any, size: int, ids: SpecialIds, file: Path, size_key: str) -> tuple[Vocab, list[int]]:
    """vocab.json (piece -> original id) as tformer's Vocab and, per tformer id, the original id of its row."""
    if not isinstance(table, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in table.values()):
        raise CheckpointError(f"{file} must map each piece to a whole-number id")
    if not isinstance(size, int) or isinstance(size, bool):
        raise CheckpointError(f"config.json: '{size_key}' must be a whole number, got {size!r}")
    if len(table) != size or set(table.values()) != set(range(size)):
        raise CheckpointError(f"{file} has {len(table)} entries numbered {min(table.values(), default=0)}.."
                              f"{max(table.values(), default=0)}, but config.json's '{size_key}' is {size}: the "
                              "vocabulary does not match the weights (files from different models?)")
    piece = {i: p for p, i in table.items()}
    for what, i, want in (("config.json's 'pad_token_id'", ids.pad, "<pad>"),
                          ("config.json's 'eos_token_id'", ids.eos, "</s>"), ("<unk>", ids.unk, "<unk>")):
        if i < 0:
            raise CheckpointError(f"{file} has no {want!r} entry")
        if not i < size or piece[i] != want:
            raise CheckpointError(f"{file}: {what} is id {i}, but that entry is {piece.get(i)!r}, not {want!r}")
    if not 0 <= ids.start < size:
        raise CheckpointError(f"config.json: 'decoder_start_token_id' {ids.start} is not an id of {file}")
    rows = [ids.pad, ids.start, ids.eos, ids.unk]
    rows += [i for i in range(size) if i not in set(rows)]
    others = [piece[i] for i in rows[4:]]
    check_pieces(others, file)
    clash = [p for p in others if p in SPECIALS]
    if clash:
        raise CheckpointError(f"{file}: entry {clash[0]!r} (id {table[clash[0]]}) is not the model's "
                              f"{'decoder start' if clash[0] == '<s>' else 'special'} token; tformer cannot map it")
    return Vocab(others), rows


def _weights_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json(index, "")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map' of tensor names to files")
        return [folder / name for name in sorted(set(weight_map.values()))]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise CheckpointError(f"{folder} holds no weights: a Hugging Face Marian folder needs model.safetensors "
                          "(or pytorch_model.bin)")


def read_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder as float32. A pickled .bin is read with torch's tensors-only unpickler
    (weights_only): anything else in it is refused, never run."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    out: dict[str, Tensor] = {}
    for file in _weights_files(folder):
        try:
            if file.suffix == ".bin":
                tensors = torch.load(file, map_location="cpu", weights_only=True)
            else:
                tensors = load_file(str(file))
        except FileNotFoundError:
            raise CheckpointError(f"{file} does not exist (named by model.safetensors.index.json)") from None
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: cannot be read as safetensors ({e})") from None
        except Exception as e:  # torch.load: pickle.UnpicklingError and whatever a hostile pickle raises
            raise CheckpointError(f"{file}: holds something other than tensors, which tformer does not unpickle "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); use the folder's "
                                  "model.safetensors, or convert the file with a tool you trust") from None
        if not isinstance(tensors, dict) or not all(isinstance(v, Tensor) for v in tensors.values()):
            raise CheckpointError(f"{file}: not a mapping of names to tensors")
        out.update({k: v.float() for k, v in tensors.items()})
    return out


def _layers(side: str, i: int) -> list[tuple[str, str]]:
    """(tformer name, Hugging Face name) of one layer's modules, the fused attention projections aside."""
    ours, hf = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
    pairs = [(f"{ours}.self_attn.out_proj", f"{hf}.self_attn.out_proj"), (f"{ours}.ffn.linear1", f"{hf}.fc1"),
             (f"{ours}.ffn.linear2", f"{hf}.fc2"), (f"{ours}.res_ffn.norm", f"{hf}.final_layer_norm"),
             (f"{ours}.{'res_attn' if side == 'encoder' else 'res_self'}.norm", f"{hf}.self_attn_layer_norm")]
    if side == "decoder":
        pairs += [(f"{ours}.cross_attn.out_proj", f"{hf}.encoder_attn.out_proj"),
                  (f"{ours}.res_cross.norm", f"{hf}.encoder_attn_layer_norm")]
    return pairs


def _attention(side: str, i: int) -> list[tuple[str, str]]:
    """(tformer fused in_proj, Hugging Face attention module) of one layer: q, k, v are stacked in that order."""
    ours, hf = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
    out = [(f"{ours}.self_attn.in_proj", f"{hf}.self_attn")]
    if side == "decoder":
        out.append((f"{ours}.cross_attn.in_proj", f"{hf}.encoder_attn"))
    return out


def layer_tensors(cfg: ModelConfig, side: str, take) -> dict[str, Tensor]:
    """One side's layers under tformer's names, each tensor read by `take(Hugging Face name)`: the layout
    BART-family models share (MarianMT, M2M-100); q, k, v fused."""
    out = {}
    for i in range(getattr(cfg, f"{side}_layers")):
        for ours, theirs in _layers(side, i):
            for p in ("weight", "bias"):
                out[f"{ours}.{p}"] = take(f"{theirs}.{p}")
        for ours, theirs in _attention(side, i):
            for p in ("weight", "bias"):
                out[f"{ours}.{p}"] = torch.cat([take(f"{theirs}.{x}_proj.{p}") for x in "qkv"])
    return out


def tables(cfg: ModelConfig, hf: dict[str, Tensor]) -> ModelConfig:
    """Which embedding tables are one. With tie_word_embeddings true, Hugging Face ties the output layer to the
    target table and (share_encoder_decoder_embeddings) both sides to one; false, transformers 5 unties all
    three and runs each as saved, while earlier versions still shared the two sides: the source and target
    tables are then one exactly when the file holds them equal."""
    if cfg.tie_generator:
        return cfg
    enc, dec = hf.get("model.encoder.embed_tokens.weight"), hf.get("model.decoder.embed_tokens.weight")
    one = enc is None or dec is None or (enc.shape == dec.shape and torch.equal(enc, dec))
    return dataclasses.replace(cfg, share_embeddings=cfg.share_embeddings and one)


def position_tables(cfg: ModelConfig, hf: dict[str, Tensor], where: Path) -> ModelConfig:
    """The positions the file's tables mean. Hugging Face computes its own sinusoids and leaves them out of the
    file; a table in the file is read: one of the sinusoid layouts (tformer's own, Marian's), or otherwise a
    learned table (tformer trains it; MarianMTModel keeps it fixed)."""
    tables = [hf.get(f"model.{side}.embed_positions.weight") for side in ("encoder", "decoder")]
    if all(t is None for t in tables):
        return cfg
    if any(t is None or t.dim() != 2 for t in tables) or tables[0].shape != tables[1].shape \
            or tables[0].shape[1] != cfg.d_model:
        raise CheckpointError(f"{where}: the encoder's and decoder's position tables must both be there, "
                              f"(max_position_embeddings, d_model) each; the file has "
                              f"{[None if t is None else tuple(t.shape) for t in tables]}")
    rows = tables[0].shape[0]
    for layout in ("halves", "interleaved", "marian"):
        want = sinusoidal_table(rows, cfg.d_model, layout)
        if all(torch.allclose(t, want, atol=1e-5) for t in tables):
            return dataclasses.replace(cfg, positions="sinusoidal", sinusoid=layout)
    return dataclasses.replace(cfg, positions="learned", max_positions=rows)


def to_tformer(hf: dict[str, Tensor], cfg: ModelConfig, src_rows: list[int], tgt_rows: list[int],
               where: Path) -> dict[str, Tensor]:
    """MarianMT's tensors (float32) under tformer's names, vocabulary rows permuted; each tied tensor once, as
    the checkpoint files hold it. Missing, unknown or mis-shaped tensors are a CheckpointError naming them."""
    used: set[str] = set()

    def take(*names: str) -> Tensor:
        for name in names:
            if name in hf:
                used.add(name)
                return hf[name]
        raise CheckpointError(f"{where}: no tensor '{names[0]}'; the weights do not fit config.json")

    def shaped(t: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{where}: tensor '{name}' has shape {tuple(t.shape)}, config.json and the "
                                  f"vocabulary need {shape}: the vocabulary does not match the weights")
        return t

    D = cfg.d_model
    out: dict[str, Tensor] = {}
    used.update({"model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
                & set(hf))  # one table under several names, or tables of their own (read below)
    src = shaped(take("model.encoder.embed_tokens.weight", "model.shared.weight"), (max(src_rows) + 1, D),
                 "model.encoder.embed_tokens.weight")
    tgt = shaped(take("model.decoder.embed_tokens.weight", "model.shared.weight"), (max(tgt_rows) + 1, D),
                 "model.decoder.embed_tokens.weight")
    out["src_embed.tokens.weight"] = src[src_rows].contiguous()
    if not cfg.share_embeddings:
        out["tgt_embed.tokens.weight"] = tgt[tgt_rows].contiguous()
    if cfg.tie_generator:
        used.add("lm_head.weight")  # the target table under another name, when the file holds it
    else:
        out["generator.weight"] = shaped(take("lm_head.weight"), tuple(tgt.shape), "lm_head.weight")[tgt_rows]
    bias = hf.get("final_logits_bias", torch.zeros(1, tgt.shape[0]))
    used.add("final_logits_bias")
    bias = shaped(bias, (1, tgt.shape[0]), "final_logits_bias")[0, tgt_rows].clone()
    if tgt_rows[0] == tgt_rows[1]:  # <pad> duplicates the start row: it must take no probability
        bias[0] = NO_PROBABILITY
    out["generator.bias"] = bias
    for side in ("encoder", "decoder"):
        name = f"model.{side}.embed_positions.weight"
        used.add(name)
        if cfg.positions == "learned":  # a table of its own (position_tables)
            out[f"{'src' if side == 'encoder' else 'tgt'}_embed.positions.table.weight"] = take(name)
        out.update(layer_tensors(cfg, side, take))
    extra = sorted(set(hf) - used)
    if extra:
        raise CheckpointError(f"{where}: unexpected tensors {extra[:5]}: not a MarianMT network tformer knows "
                              f"(config.json says {cfg.encoder_layers}+{cfg.decoder_layers} layers)")
    return out


def piece_tokenizers(folder: Path, sides: list[tuple[Vocab, list[int]]], one_table: bool, what: str
                     ) -> list[PieceTableTokenizer]:
    """The tokenizers of FOLDER/source.spm and target.spm over each side's (vocabulary, original ids); one
    object for both when the table is one and the two SentencePiece models are the same."""
    tokenizers = []
    for name, (vocab, rows) in zip(("source.spm", "target.spm"), sides):
        file = folder / name
        try:
            tokenizers.append(PieceTableTokenizer(file.read_bytes(), vocab, rows, str(file)))
        except FileNotFoundError:
            raise CheckpointError(f"{file} does not exist: {what} needs source.spm and target.spm (the "
                                  "SentencePiece models)") from None
        except DataError as e:
            raise CheckpointError(str(e)) from None
    if one_table and tokenizers[0].fingerprint() == tokenizers[1].fingerprint():
        tokenizers[1] = tokenizers[0]
    return tokenizers


@dataclass
class ImportedCheckpoint(Checkpoint):
    """A checkpoint read from another toolkit's folder: its weights are converted in memory, never written."""

    tensors: dict[str, Tensor] = field(default_factory=dict)

    @property
    def has_ema(self) -> bool:
        return False

    def weights_file(self, which: str = "auto") -> Path:
        if which == "ema":
            raise CheckpointError(f"{self.path} is an imported model: it has no moving average of its weights")
        return self.path

    def weights(self, which: str = "auto") -> dict[str, Tensor]:
        self.weights_file(which)
        return self.tensors


def read_hf_marian(folder: str | Path, overrides: list[str] = ()) -> ImportedCheckpoint:
    """The checkpoint a Hugging Face MarianMT folder holds (see the module docstring); `overrides` as for a
    tformer checkpoint (decode.*, model.attention)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    hf = _json(folder / "config.json", "config.json")
    model = model_config(hf, folder / "config.json")
    tok_cfg = _json(folder / "tokenizer_config.json", "") if (folder / "tokenizer_config.json").is_file() else {}
    if not isinstance(tok_cfg, dict):
        raise CheckpointError(f"{folder / 'tokenizer_config.json'} is not a JSON object")
    separate = bool(tok_cfg.get("separate_vocabs", False))
    src_table = _json(folder / "vocab.json", "vocab.json (the pieces' ids)")
    tgt_file = folder / ("target_vocab.json" if separate else "vocab.json")
    tgt_table = _json(tgt_file, "target_vocab.json (tokenizer_config.json says separate_vocabs)") \
        if separate else src_table
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        if not isinstance(hf.get(key), int):
            raise CheckpointError(f"{folder / 'config.json'}: '{key}' must be a whole number, got {hf.get(key)!r}")
    unk = src_table.get("<unk>") if isinstance(src_table, dict) else None
    if not isinstance(unk, int):
        raise CheckpointError(f"{folder / 'vocab.json'} has no '<unk>' entry")
    ids = SpecialIds(hf["pad_token_id"], hf["decoder_start_token_id"], hf["eos_token_id"], unk)
    V = hf["vocab_size"]
    src_vocab, src_rows = vocab_rows(src_table, V, ids, folder / "vocab.json", "vocab_size")
    tgt_unk = tgt_table.get("<unk>") if isinstance(tgt_table, dict) else None
    tgt_ids = SpecialIds(ids.pad, ids.start, ids.eos, tgt_unk if isinstance(tgt_unk, int) else -1)
    tgt_vocab, tgt_rows = vocab_rows(tgt_table, hf.get("decoder_vocab_size") or V, tgt_ids, tgt_file,
                                     "decoder_vocab_size")
    tokenizers = piece_tokenizers(folder, [(src_vocab, src_rows), (tgt_vocab, tgt_rows)], not separate,
                                  "a Hugging Face Marian folder")
    weights = read_weights(folder)
    model = position_tables(tables(model, weights), weights, folder)
    tensors = to_tformer(weights, model, src_rows, tgt_rows, folder)
    cfg = Config(model=model, data=DataConfig(task="translation", dir=str(folder.resolve()),
                                              src_lang=str(tok_cfg.get("source_lang") or "src"),
                                              tgt_lang=str(tok_cfg.get("target_lang") or "tgt")),
                 decode=_decode_defaults(folder))
    if overrides:  # the caller's: a problem there is a ConfigError naming the override
        cfg = from_dict(merge_overrides(to_dict(cfg), list(overrides)))
    trainer = {"format": FORMAT, "version": FORMAT_VERSION, "step": 0,
               "imported_from": {"format": "hf-marian", "path": str(folder.resolve())}}
    return ImportedCheckpoint(folder, cfg, (tokenizers[0], tokenizers[1]), trainer, tensors=tensors)


def _decode_defaults(folder: Path) -> DecodeConfig:
    """Decoding as the folder publishes it (generation_config.json, else config.json): beam search of its
    num_beams (greedy when 1) ranked by Hugging Face's rule, logprob / length ** length_penalty (default 1.0);
    tformer's defaults for the rest (the length limit is tformer's a * source + b)."""
    for name in ("generation_config.json", "config.json"):
        gen = _json(folder / name, name) if (folder / name).is_file() else None
        if isinstance(gen, dict) and "num_beams" in gen:
            beams, alpha = gen.get("num_beams"), gen.get("length_penalty", 1.0)
            if not isinstance(beams, int) or isinstance(beams, bool) or beams < 1:
                raise CheckpointError(f"{folder / name}: 'num_beams' must be a whole number >= 1, got {beams!r}")
            if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha < 0:
                raise CheckpointError(f"{folder / name}: 'length_penalty' must be a number >= 0, got {alpha!r}")
            return DecodeConfig(strategy="beam" if beams > 1 else "greedy", beam_size=beams,
                                len_penalty=float(alpha), len_penalty_rule="power")
    return DecodeConfig(len_penalty=1.0, len_penalty_rule="power")
