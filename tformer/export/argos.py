"""Export to an Argos Translate package, which argostranslate installs and LibreTranslate serves.

    tformer export --format argos RUN_DIR OUT.argosmodel [--quantization float32]

The package is the CTranslate2 export (tformer.export.ctranslate2, int8 by default) with the one SentencePiece
model Argos tokenises both sides with, metadata.json and, where spaCy is installed, a blank spaCy pipeline of
the source language for Argos's sentence splitting.
"""

from __future__ import annotations

import json
from pathlib import Path

from tformer.errors import ConfigError
from tformer.export.ctranslate2 import export_ctranslate2


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
