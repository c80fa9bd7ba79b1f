"""Export a trained model: one module per foreign format, as tformer.convert has one per imported format.

    tformer.export.ctranslate2   a CTranslate2 model folder, through CTranslate2's own converter API
                                 (export_ctranslate2; translate_ctranslate2 translates with it)
    tformer.export.argos         an Argos Translate package (.argosmodel) that argostranslate installs and
                                 LibreTranslate serves: the CTranslate2 model, the SentencePiece model, metadata
    tformer.export.hf_marian     a Hugging Face MarianMT folder (to_hf_marian: the same network in memory)
    tformer.export.hf_m2m100     a Hugging Face M2M-100 folder, for a model imported from one
    tformer.export.onnx          ONNX graphs of the encoder and of one decoding step (onnx_greedy decodes them)

    tformer export --format ctranslate2|argos|hf-marian|hf-m2m100|hf-mbart|onnx RUN_DIR OUT     (`export`, below)

Every format reads a tformer run or checkpoint folder through the public API (tformer.load), and all of them
are the same vanilla Transformer written in another toolkit's terms: `check_exportable` refuses, with the
reason, the models they cannot express. A format's modules (and its optional packages) are imported when it
is used, so the command line starts quickly; their functions are importable from here as well:
`from tformer.export import export_ctranslate2`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tformer.config import ModelConfig
from tformer.config_checks import export_problems
from tformer.errors import ConfigError

if TYPE_CHECKING:  # for readers and type checkers; at run time __getattr__ imports on first use
    import numpy as np

    from tformer.export.argos import export_argos
    from tformer.export.ctranslate2 import export_ctranslate2, translate_ctranslate2
    from tformer.export.hf_m2m100 import export_hf_m2m100, to_hf_m2m100
    from tformer.export.hf_marian import export_hf_marian, to_hf_marian
    from tformer.export.onnx import OnnxEncoder, OnnxStep, export_onnx, onnx_greedy

FORMATS = ("ctranslate2", "argos", "hf-marian", "hf-m2m100", "hf-mbart", "onnx")
QUANTIZED = ("ctranslate2", "argos")  # the formats whose weights may be stored quantized
_PUBLIC = {"export_ctranslate2": "ctranslate2", "translate_ctranslate2": "ctranslate2", "export_argos": "argos",
           "export_hf_marian": "hf_marian", "to_hf_marian": "hf_marian", "export_hf_m2m100": "hf_m2m100",
           "to_hf_m2m100": "hf_m2m100", "export_onnx": "onnx",
           "onnx_greedy": "onnx", "OnnxEncoder": "onnx", "OnnxStep": "onnx"}


def export(fmt: str, checkpoint: str | Path, out: str | Path, *, quantization: str | None = None,
           shortlist: str | Path | None = None, force: bool = False, which: str = "best") -> Path:
    """Write `checkpoint` (a run folder's `which` checkpoint, or a checkpoint folder) as `fmt` into `out`; returns
    what was written (a folder, or the Argos package file). `quantization`: for ctranslate2 and argos (argos
    stores int8 unless told otherwise); `shortlist`: for ctranslate2 (its vocabulary map). A setting the format
    does not read is a ConfigError, not ignored."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if quantization and fmt not in QUANTIZED:
        raise ConfigError(f"--quantization is for --format {' and '.join(QUANTIZED)}")
    if shortlist and fmt != "ctranslate2":
        raise ConfigError("--shortlist is for --format ctranslate2 (Argos Translate does not read a vocabulary map)")
    from tformer.export import argos, ctranslate2, hf_m2m100, hf_marian, onnx

    if fmt == "ctranslate2":
        return ctranslate2.export_ctranslate2(checkpoint, out, quantization, force=force, which=which,
                                              shortlist=shortlist)
    if fmt == "argos":
        return argos.export_argos(checkpoint, out, quantization=quantization or "int8", force=force, which=which)
    if fmt == "hf-marian":
        return hf_marian.export_hf_marian(checkpoint, out, force=force, which=which)
    if fmt in ("hf-m2m100", "hf-mbart"):
        return hf_m2m100.export_hf_m2m100(checkpoint, out, force=force, which=which, fmt=fmt)
    return onnx.export_onnx(checkpoint, out, which=which)[0].parent


def check_exportable(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the settings the exported Transformer cannot express. Every format shares
    CTranslate2's limits (the narrowest: a vanilla encoder-decoder, LayerNorm, absolute positions, dense
    attention), and so the message names CTranslate2."""
    problems = export_problems(cfg)
    if problems:
        raise ConfigError("CTranslate2 cannot run this model: " + "; ".join(problems))


def position_table(cfg: ModelConfig, model, side: str) -> np.ndarray:
    """The absolute positions of `side` ('encoder' or 'decoder') as a table (max_positions, D): the sinusoids
    it computes, or its learned table."""
    from tformer.positions import sinusoidal_table

    embed = model.src_embed if side == "encoder" else model.tgt_embed
    if cfg.side_positions(side) == "sinusoidal":
        return sinusoidal_table(cfg.max_positions, cfg.d_model, cfg.sinusoid).numpy()
    return embed.positions.table.weight[embed.positions.skip:].detach().float().numpy()  # learned


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tformer.export' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tformer.export.{_PUBLIC[name]}"), name)
    globals()[name] = value  # found directly next time
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
