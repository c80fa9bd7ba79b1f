"""Models trained elsewhere, read as tformer checkpoints: a Hugging Face MarianMT folder
(tformer.convert.hf_marian), a Hugging Face M2M-100, NLLB-200 or mBART-50 folder (tformer.convert.hf_m2m100:
many languages in one model) or a Marian model folder, OPUS-MT's native release (tformer.convert.marian).
tformer.export.export_hf_marian writes the first kind back.

    tformer.load("opus-mt-en-de")                     a local folder of any kind, converted in memory
    tformer import hf-marian opus-mt-en-de runs/ende  converted once into a tformer run folder
    tformer import marian opus-2020-02-26 runs/ende

The vocabulary is mapped at this boundary and nowhere else: the imported table's entries are renumbered into
tformer's layout (<pad> <s> </s> <unk> first) and the weight rows permuted with them; the original number of
every entry travels with the tokenizer (`PieceTableTokenizer.original`) so that export puts them back.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tformer.errors import CheckpointError
from tformer.files import nearest

FORMATS = ("hf-marian", "hf-m2m100", "hf-nllb", "hf-mbart", "marian")
HF_KINDS = {"marian": "hf-marian", "m2m_100": "hf-m2m100", "mbart": "hf-mbart"}  # config.json's model_type ->


def hub_name(src: Path) -> bool:
    """'Helsinki-NLP/opus-mt-en-de': a name on the Hugging Face hub rather than a folder here."""
    parts = str(src).split("/")
    return (not src.exists() and len(parts) == 2 and all(parts) and not str(src).startswith((".", "~"))
            and not Path(parts[0]).is_dir())  # runs/m30q, a local folder's missing run, is no hub name


def replaceable(out: Path, src: Path, force: bool) -> None:
    """Check that `out` may be written: absent or an empty folder, or (with `force`) a folder or file that is
    neither `src` nor holds it. Raises the error that says which; removes nothing."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise CheckpointError(f"{out} exists; choose another folder or pass --force to replace it")
    if out.resolve() == src.resolve() or src.resolve().is_relative_to(out.resolve()):
        raise CheckpointError(f"{out} is (or holds) the model being read, {src}; choose another folder")


def remove(out: Path) -> None:
    """What `replaceable` allowed to replace."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()


def read(fmt: str, src: str | Path, overrides: list[str] = ()):
    """The checkpoint a foreign model folder holds (converted in memory), as tformer.checkpoint reads
    its own."""
    from tformer.convert.hf_m2m100 import read_hf_m2m100
    from tformer.convert.hf_marian import read_hf_marian
    from tformer.convert.marian import read_marian

    if fmt not in FORMATS:
        raise CheckpointError(f"unknown import format {fmt!r}; choose one of {', '.join(FORMATS)}")
    src = Path(src)
    if not src.exists():
        hint = (f"; if {src} is a Hugging Face hub name: tformer never downloads, so fetch the folder first, e.g. "
                f"`huggingface-cli download {src} --local-dir {src.name}`, and pass that folder"
                if hub_name(src) else "")
        raise CheckpointError(f"{src} does not exist{nearest(src)}: pass a tformer run or checkpoint folder, or a "
                              f"local model folder{hint}")
    reader = {"hf-marian": read_hf_marian, "hf-m2m100": read_hf_m2m100, "hf-nllb": read_hf_m2m100,
              "hf-mbart": read_hf_m2m100, "marian": read_marian}[fmt]
    return reader(src, list(overrides))


def open_checkpoint(path: str | Path, which: str = "best", overrides: list[str] = ()):
    """What every --checkpoint reads: a tformer run or checkpoint folder (its `which` checkpoint), a Hugging
    Face MarianMT folder or a Marian model folder, converted in memory."""
    from tformer.convert.hf_marian import is_hf_folder
    from tformer.convert.marian import is_marian_folder
    from tformer.checkpoint import load_checkpoint

    if is_hf_folder(path) or hub_name(Path(path)):
        return read(hf_format(Path(path)), path, list(overrides))
    if is_marian_folder(path) and not (Path(path) / "checkpoints").is_dir():
        return read("marian", path, list(overrides))
    return load_checkpoint(path, which, list(overrides))


def hf_format(folder: Path) -> str:
    """The import format of a Hugging Face folder, by its config.json's model_type (hf-marian when unreadable:
    that reader names what is wrong)."""
    import json

    try:
        kind = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return "hf-marian"
    return HF_KINDS.get(kind, "hf-marian")


def import_model(fmt: str, src: str | Path, out: str | Path, force: bool = False) -> Path:
    """Convert the model folder `src` once into the tformer run folder `out` (its one checkpoint is `best` and
    `latest`; trainer.json records where it came from). Everything is read and checked before anything is
    written; `out` must not exist unless `force`. Returns the checkpoint folder."""
    from tformer.model import build_model
    from tformer.checkpoint import save_checkpoint

    out = Path(out)
    replaceable(out, Path(src), force)
    ckpt = read(fmt, src)
    model = build_model(ckpt.cfg.model, *(len(t.vocab) for t in ckpt.tokenizers))
    ckpt.load_model_state(model)
    remove(out)
    return save_checkpoint(out, 0, model, None, {"imported_from": ckpt.trainer["imported_from"]}, ckpt.cfg,
                           ckpt.tokenizers, best=True)
