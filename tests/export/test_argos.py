"""An Argos Translate package (`tformer export --format argos`) against oracles: the real argostranslate
installs it and translates with it offline (in a child process whose home, data and cache folders are
temporary, so nothing of the machine's is read or written), and its answers are what CTranslate2 gives for the
packaged model with Argos's own settings (beam 4, length penalty 0.2, unknowns replaced), tokenised and
detokenised by the packaged SentencePiece model; the exported CTranslate2 model itself is held to tformer in
test_export. A model Argos cannot hold is refused by name (two SentencePiece models: test_import_hf)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("argostranslate")
import ctranslate2  # noqa: E402
import sentencepiece as spm  # noqa: E402

from tformer.errors import CheckpointError, ConfigError  # noqa: E402
from tformer.export import export_argos  # noqa: E402

from helpers.serve import CHECKPOINT, LINES  # noqa: E402

ARGOS = """
import json, sys
import argostranslate.package as package, argostranslate.translate as translate
package.install_from_path(sys.argv[1])
installed = [(p.from_code, p.to_code, p.package_version) for p in package.get_installed_packages()]
print(json.dumps({"installed": installed, "out": [translate.translate(q, "en", "de") for q in sys.argv[2:]]}))
"""


def argos(tmp_path: Path, package: Path, texts: list[str]) -> dict:
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "ARGOS_CHUNK_TYPE": "SPACY", "ARGOS_DEVICE_TYPE": "cpu"}
    r = subprocess.run([sys.executable, "-c", ARGOS, str(package), *texts], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def ct2_as_argos(folder: Path, texts: list[str]) -> list[str]:
    """What Argos does with one sentence: SentencePiece pieces, CTranslate2 with its settings, pieces decoded."""
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.model"))
    ct2 = ctranslate2.Translator(str(folder / "model"), device="cpu")
    out = ct2.translate_batch([sp.encode(t, out_type=str) for t in texts], replace_unknowns=True, beam_size=4,
                              num_hypotheses=1, length_penalty=0.2)
    return [sp.decode_pieces(r.hypotheses[0]).replace("▁", " ").replace("_", " ").lstrip(" ") for r in out]


def test_argostranslate_installs_the_package_and_translates_as_ctranslate2_does(tmp_path):
    package = export_argos(CHECKPOINT, tmp_path / "en_de.argosmodel")
    with zipfile.ZipFile(package) as z:
        z.extractall(tmp_path / "unzipped")
        top = {Path(n).parts[0] for n in z.namelist()}
    assert top == {"translate-en_de-1_0"}
    folder = tmp_path / "unzipped" / "translate-en_de-1_0"
    meta = json.loads((folder / "metadata.json").read_text())
    assert (meta["from_code"], meta["to_code"], meta["from_name"], meta["to_name"]) == ("en", "de", "English", "German")
    assert json.loads((folder / "model" / "config.json").read_text())  # a CTranslate2 model folder
    texts = LINES[:6]
    got = argos(tmp_path, package, texts)
    assert got["installed"] == [["en", "de", "1.0"]]
    assert got["out"] == ct2_as_argos(folder, texts)
    assert all(got["out"])


def test_a_model_argos_cannot_hold_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="is a .argosmodel file"):
        export_argos(CHECKPOINT, tmp_path / "en_de.zip")
    export_argos(CHECKPOINT, tmp_path / "p.argosmodel")
    with pytest.raises(CheckpointError, match="exists; choose another folder or pass --force"):
        export_argos(CHECKPOINT, tmp_path / "p.argosmodel")
    assert export_argos(CHECKPOINT, tmp_path / "p.argosmodel", force=True).exists()
