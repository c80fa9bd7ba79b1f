"""Checkpoints: safetensors weights with config and vocabularies beside them as text.

    RUN_DIR/checkpoints/step_000500/
        model.safetensors       weights (tied tensors stored once)
        optimizer.safetensors   optimizer moments and the RNG state, for resume
        trainer.json            step, epoch, position in the epoch, optimizer hyper-parameters, metrics
        config.yaml             the full configuration
        vocab.src.txt, vocab.tgt.txt
        spm.src.model, spm.tgt.model   SentencePiece tokenizers (translation task)
    RUN_DIR/checkpoints/latest, best     text files naming a checkpoint folder

A checkpoint is written under a temporary name and renamed into place, then `latest` is replaced
atomically: a crash at any moment leaves the previous checkpoint and pointer intact. Nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tformer.config import Config, ConfigError, load_config, save_config
from tformer.data.speech import CharTokenizer, FrameInput
from tformer.data.tokenizer import SubwordTokenizer, Tokenizer, WordTokenizer
from tformer.data.vocab import Vocab

Tokenizers = tuple[Tokenizer, Tokenizer]

FORMAT = "tformer-checkpoint"
FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, foreign or does not fit the model."""


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _fsync_write(tmp, text.encode("utf-8"))
    os.replace(tmp, path)


def unique_state(model: nn.Module) -> dict[str, Tensor]:
    """state_dict with each tied tensor once (under its first name)."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict().items():
        key = t.untyped_storage().data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().cpu().contiguous()
    return out


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
    sd = optimizer.state_dict()
    tensors = {f"state.{pid}.{k}": v.cpu().contiguous() for pid, st in sd["state"].items() for k, v in st.items()
               if isinstance(v, Tensor)}
    return tensors, sd["param_groups"]


def optimizer_state(tensors: dict[str, Tensor], param_groups: list[dict[str, Any]]) -> dict[str, Any]:
    state: dict[int, dict[str, Tensor]] = {}
    for key, v in tensors.items():
        if key.startswith("state."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    return {"state": state, "param_groups": param_groups}


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer: dict[str, Any],
    cfg: Config,
    tokenizers: Tokenizers,
    best: bool = False,
    keep_last: int = 3,
    rng_states: list[Tensor] | None = None,
) -> Path:
    """Write step `step` (see the module docstring). `rng_states`: the random state of every process of a
    torchrun job, rank order (default: this process's)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    final = root / name
    if not (final / "trainer.json").exists():  # a step's state is fixed: never rewrite a finished one
        tmp = root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(unique_state(model), str(tmp / "model.safetensors"),
                  metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
        info = {"format": FORMAT, "version": FORMAT_VERSION, "step": step, **trainer}
        if optimizer is not None:
            tensors, groups = optimizer_tensors(optimizer)
            states = rng_states or [torch.get_rng_state()]
            tensors["rng.torch"] = states[0]
            tensors.update({f"rng.torch.rank{r}": st for r, st in enumerate(states) if r})
            info["world_size"] = len(states)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            info["param_groups"] = groups
        save_config(cfg, tmp / "config.yaml")
        save_tokenizers(tokenizers, tmp)
        _fsync_write(tmp / "trainer.json", json.dumps(info, indent=1).encode("utf-8"))  # written last
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of a crash, if any
        os.rename(tmp, final)
    _replace_text(root / "latest", name + "\n")
    if best:
        _replace_text(root / "best", name + "\n")
    _prune(root, keep_last)
    return final


def _pointer(root: Path, which: str) -> str | None:
    try:
        return (root / which).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    dirs = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / "trainer.json").exists()]
    return sorted(dirs, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def _prune(root: Path, keep_last: int) -> None:
    keep = {_pointer(root, "best"), _pointer(root, "latest")}
    complete = list_checkpoints(root)
    for p in complete[:-keep_last] if keep_last else complete:
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-*"):  # left by a crash of an earlier process
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def resolve_checkpoint(path: str | Path, which: str = "best") -> Path:
    """A checkpoint folder, or a run folder (its `which` checkpoint, else its latest)."""
    path = Path(path)
    if (path / "trainer.json").exists():
        return path
    root = path / "checkpoints"
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a run folder or a checkpoint folder")
    if not root.is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint folder (no trainer.json) nor a run folder "
                              "(no checkpoints/ inside)")
    for name in (_pointer(root, which), _pointer(root, "latest")):
        if name and (root / name / "trainer.json").exists():
            return root / name
    complete = list_checkpoints(root)
    if not complete:
        raise CheckpointError(f"{root} holds no complete checkpoint")
    return complete[-1]


def _kind(tok: Tokenizer) -> str:
    return {SubwordTokenizer: "subword", CharTokenizer: "char", FrameInput: "frames"}.get(type(tok), "word")


def save_tokenizers(tokenizers: Tokenizers, folder: Path) -> None:
    """vocab.{src,tgt}.txt always; spm.{src,tgt}.model for SentencePiece tokenizers; tokenizers.txt names the
    kind of each side when one is not a word or SentencePiece tokenizer (characters, frames)."""
    kinds = []
    for side, tok in zip(("src", "tgt"), tokenizers):
        tok.vocab.save(folder / f"vocab.{side}.txt")
        if isinstance(tok, SubwordTokenizer):
            tok.save(folder / f"spm.{side}.model")
        kinds.append(f"{side} {_kind(tok)}\n")
    if any(k.split()[1] in ("char", "frames") for k in kinds):
        (folder / "tokenizers.txt").write_text("".join(kinds), encoding="utf-8")


def load_tokenizers(folder: Path) -> Tokenizers:
    kinds = {"src": "", "tgt": ""}
    if (folder / "tokenizers.txt").exists():
        for n, line in enumerate((folder / "tokenizers.txt").read_text(encoding="utf-8").splitlines(), 1):
            side, _, kind = line.partition(" ")
            if side not in kinds or kind not in ("word", "subword", "char", "frames"):
                raise CheckpointError(f"{folder / 'tokenizers.txt'}, line {n}: expected 'src|tgt word|subword|"
                                      f"char|frames', got {line!r}")
            kinds[side] = kind
    out = []
    for side in ("src", "tgt"):
        try:
            vocab = Vocab.load(folder / f"vocab.{side}.txt")
            model = folder / f"spm.{side}.model"
            if kinds[side] == "char":
                tok = CharTokenizer(vocab)
            elif kinds[side] == "frames":
                tok = FrameInput(vocab)
            else:
                tok = SubwordTokenizer.load(model) if model.exists() else WordTokenizer(vocab)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        if tok.vocab != vocab:
            raise CheckpointError(f"{model} and {folder / f'vocab.{side}.txt'} disagree: the checkpoint was "
                                  "assembled from different runs")
        out.append(tok)
    if out[0].fingerprint() == out[1].fingerprint():
        out[1] = out[0]
    return out[0], out[1]


@dataclass
class Checkpoint:
    path: Path
    cfg: Config
    tokenizers: Tokenizers  # (source, target); each has .vocab
    trainer: dict[str, Any]

    def load_model_state(self, model: nn.Module) -> None:
        """Load the weights into `model`, rejecting missing, extra or mis-shaped tensors by name."""
        file = self.path / "model.safetensors"
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: cannot be read as safetensors ({e})") from None
        expected = unique_state(model)
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        if missing or extra:
            raise CheckpointError(f"{file} does not fit this model: missing {missing[:5]}, unexpected {extra[:5]}")
        for k, v in expected.items():
            if tensors[k].shape != v.shape:
                raise CheckpointError(f"{file}: tensor '{k}' has shape {tuple(tensors[k].shape)}, "
                                      f"the model needs {tuple(v.shape)}")
        model.load_state_dict(tensors, strict=False)  # tied aliases are filled through their first name

    def load_training_state(self, optimizer: torch.optim.Optimizer, rank: int = 0) -> None:
        """Optimizer moments and this process's random state (`rank` of a torchrun job)."""
        file = self.path / "optimizer.safetensors"
        if not file.exists() or "param_groups" not in self.trainer:
            raise CheckpointError(f"{self.path} holds no optimizer state: it cannot be resumed")
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: cannot be read as safetensors ({e})") from None
        optimizer.load_state_dict(optimizer_state(tensors, self.trainer["param_groups"]))
        torch.set_rng_state(tensors["rng.torch" if rank == 0 else f"rng.torch.rank{rank}"])


def load_checkpoint(path: str | Path, which: str = "best", overrides: list[str] = ()) -> Checkpoint:
    ckpt = resolve_checkpoint(path, which)
    try:
        info = json.loads((ckpt / "trainer.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt / 'trainer.json'} is corrupt ({e})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt} is not a tformer checkpoint (trainer.json has no format '{FORMAT}')")
    if info.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{ckpt} has format version {info['version']}, newer than this tformer "
                              f"reads ({FORMAT_VERSION}); upgrade tformer")
    try:
        cfg = load_config(ckpt / "config.yaml", overrides)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    return Checkpoint(ckpt, cfg, load_tokenizers(ckpt), info)
