"""The run-folder format every side of tformer stands on: training writes it, inference (tformer.api,
tformer.inference) reads it, import (tformer.convert) writes it from other toolkits' models and export
(tformer.export) reads it. Safetensors weights with config and vocabularies beside them as text.

    RUN_DIR/checkpoints/step_000500/
        model.safetensors       weights (tied tensors stored once)
        ema.safetensors         their exponential moving average (train.ema), same names; inference loads it
        optimizer.safetensors   optimizer moments and the RNG state, for resume
        trainer.json            the TrainerState (step, epoch, data cursor, best, ...; tformer.training.state
                                reads it), optimizer hyper-parameters
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
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tformer.config import Config, ConfigError, load_config, save_config
from tformer.data.speech import CharTokenizer, FrameInput
from tformer.data.tokenizer import PieceTableTokenizer, SubwordTokenizer, Tokenizer, WordTokenizer
from tformer.data.vocab import Vocab
from tformer.errors import CheckpointError, DataError, NoCheckpointError, option
from tformer.files import nearest, replace_atomically
from tformer.model.transformer import legacy_parameter_order, upgrade_state

Tokenizers = tuple[Tokenizer, Tokenizer]

FORMAT = "tformer-checkpoint"
FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d+)$")


def validation_key(metrics: dict[str, Any]) -> tuple[float, float]:
    """How validations rank, larger is better: BLEU (translation; many directions: their mean, or the
    `selection` of train.best_direction), lower character error rate (speech) or exact match (synthetic
    tasks), ties going to the lower validation loss. Never the test set. Training
    points `best` at the checkpoint ranked first; pruning keeps the `keep_best` first (`ranked_checkpoints`)."""
    if "cer" in metrics:
        return -metrics["cer"], -metrics["loss"]
    if "selection" in metrics:  # a multilingual run's chosen direction (train.best_direction)
        return metrics["selection"], -metrics["loss"]
    return metrics.get("bleu" if "bleu" in metrics else "exact_match", 0.0), -metrics["loss"]


_COUNTS = ("step", "epoch", "cursor", "bad_evals", "bad_updates", "skipped_updates", "world_size", "ema_updates")
_KINDS: dict[str, tuple[type, ...]] = {**{k: (int,) for k in _COUNTS}, "update_in_epoch": (int,),
                                       "elapsed": (int, float), "param_groups": (list,)}


def check_fields(info: dict[str, Any], file: Path | str) -> None:
    """The kinds of trainer.json's values: a CheckpointError naming the key of `file` that is not one."""
    for key, kind in _KINDS.items():
        if key not in info:
            continue
        v = info[key]
        if not isinstance(v, kind) or isinstance(v, bool) or (kind == (int,) and v < 0):
            what = {(int,): "whole number >= 0", (int, float): "number", (list,): "list"}[kind]
            raise CheckpointError(f"{file}: '{key}' is {v!r}, not a {what}; the file is damaged or tampered (use "
                                  "an earlier checkpoint)")


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically and durably (temporary file, fsync, rename, fsync of the folder)."""
    with replace_atomically(path, fsync=True) as f:
        f.write(text)
    _fsync_dir(path.parent)


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


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (POSIX: the directory entry lives in the folder's own data)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _write_checkpoint(tmp: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                      trainer: dict[str, Any], cfg: Config, tokenizers: Tokenizers,
                      rng_states: list[Tensor] | None, ema: dict[str, Tensor] | None = None) -> None:
    """Every file of a checkpoint into the fresh folder `tmp`, each fsynced; trainer.json last (its presence
    marks a complete checkpoint)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(unique_state(model), str(tmp / "model.safetensors"),
              metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
    if ema is not None:
        save_file(ema, str(tmp / EMA_FILE), metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
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
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_write(tmp / "trainer.json", json.dumps(info, indent=1).encode("utf-8"))  # written last


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
    ema: dict[str, Tensor] | None = None,
    keep_best: int = 0,
) -> Path:
    """Write step `step` (see the module docstring). `rng_states`: the random state of every process of a
    torchrun job, rank order (default: this process's). `ema`: the weights' moving average (train.ema).
    Kept afterwards: the `keep_last` latest, the `keep_best` best validated (`ranked_checkpoints`), and the
    ones `best` and `latest` name."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    final = root / name
    if not (final / "trainer.json").exists():  # a step's state is fixed: never rewrite a finished one
        tmp = root / f".tmp-{name}-{os.getpid()}"
        try:
            _write_checkpoint(tmp, step, model, optimizer, trainer, cfg, tokenizers, rng_states, ema)
            shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of a crash, if any
            os.rename(tmp, final)
            _fsync_dir(root)
        except (OSError, SafetensorError) as e:  # a full disk, a vanished folder: the previous one is untouched
            shutil.rmtree(tmp, ignore_errors=True)
            previous = _pointer(root, "latest")
            why = getattr(e, "strerror", None) or str(e)
            raise CheckpointError(f"could not write checkpoint {final} ({why}); "
                                  + (f"the previous one, {root / previous}, is intact: " if previous else "")
                                  + f"free space (or fix the folder) and continue with {option('resume', True)}"
                                  ) from None
    try:
        _replace_text(root / "latest", name + "\n")
        if best:
            _replace_text(root / "best", name + "\n")
    except OSError as e:
        raise CheckpointError(f"wrote {final}, but could not update {root / 'latest'} ({e.strerror or e}); "
                              "free space and continue with --resume") from None
    _prune(root, keep_last, keep_best)
    return final


EMA_FILE = "ema.safetensors"
BYTES_PER_PARAMETER = 12  # a checkpoint: float32 weights + Adam's two float32 moments
ROOM_MARGIN = 16 << 20  # configs, vocabularies, tokenizers, logs


def check_room(run_dir: str | Path, n_params: int, keep_last: int) -> None:
    """Before training: the run folder can be created and written, and its filesystem holds the checkpoints
    the run will keep at once (keep_last + the best + the one being written). Raises CheckpointError saying
    what to change; writes nothing that stays."""
    run_dir = Path(run_dir)
    folder = run_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise CheckpointError(f"cannot create the run folder {run_dir}: {folder} is a file, not a folder; "
                              "choose another --run-dir")
    try:
        fd, probe = tempfile.mkstemp(prefix=".tformer-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"cannot write into {folder} ({e.strerror or e}); the run folder {run_dir} needs a "
                              "writable place: choose another --run-dir") from None
    per = BYTES_PER_PARAMETER * n_params
    root = run_dir / "checkpoints"
    have = len(list_checkpoints(root)) if root.is_dir() else 0
    need = max(keep_last + 2 - have, 1) * per + ROOM_MARGIN
    free = shutil.disk_usage(folder).free
    if free < need:
        raise CheckpointError(
            f"{folder} has {free / 2**20:.1f} MiB free, but this run needs about {need / 2**20:.1f} MiB: it keeps up to "
            f"{keep_last + 2} checkpoints of {per / 2**20:.1f} MiB ({n_params:,} parameters: weights and Adam "
            f"moments; train.keep_last={keep_last} + the best + the one being written). Free space, lower "
            "train.keep_last, or choose another --run-dir")


def _pointer(root: Path, which: str) -> str | None:
    """The checkpoint folder `latest`/`best` names; None when missing, unreadable, or not a step_N name (a
    damaged or tampered pointer never leads outside the checkpoints folder)."""
    try:
        name = (root / which).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return name if STEP_DIR.match(name) else None


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    dirs = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / "trainer.json").exists()]
    return sorted(dirs, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def _prune(root: Path, keep_last: int, keep_best: int = 0) -> None:
    keep = {_pointer(root, "best"), _pointer(root, "latest")}
    keep |= {p.name for p in ranked_checkpoints(root)[:keep_best]}
    complete = list_checkpoints(root)
    for p in complete[:-keep_last] if keep_last else complete:
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-*"):  # left by a crash of an earlier process
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def ranked_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints in `root` that were written at a validation, best first (`validation_key` of
    the metrics their trainer.json records; a tie keeps the earlier step first)."""
    scored = []
    for p in list_checkpoints(root):
        try:
            valid = json.loads((p / "trainer.json").read_text(encoding="utf-8")).get("valid")
        except (OSError, ValueError):
            continue
        if isinstance(valid, dict) and "loss" in valid:
            scored.append((validation_key(valid), p))
    return [p for _, p in sorted(scored, key=lambda kp: kp[0], reverse=True)]


def resolve_checkpoint(path: str | Path, which: str = "best") -> Path:
    """A checkpoint folder, or a run folder (its `which` checkpoint, else its latest)."""
    path = Path(path)
    if (path / "trainer.json").exists():
        return path
    root = path / "checkpoints"
    if not path.exists():
        raise CheckpointError(f"{path} does not exist{nearest(path)}; pass a run folder or a checkpoint folder")
    if not root.is_dir():
        raise NoCheckpointError(f"{path} is neither a checkpoint folder (no trainer.json) nor a run folder "
                              "(no checkpoints/ inside)")
    for name in (_pointer(root, which), _pointer(root, "latest")):
        if name and (root / name / "trainer.json").exists():
            return root / name
    complete = list_checkpoints(root)
    if not complete:
        raise NoCheckpointError(f"{root} holds no complete checkpoint")
    return complete[-1]


def _kind(tok: Tokenizer) -> str:
    return {SubwordTokenizer: "subword", CharTokenizer: "char", FrameInput: "frames",
            PieceTableTokenizer: "pieces"}.get(type(tok), "word")


KINDS = ("word", "subword", "char", "frames", "pieces")


def save_tokenizers(tokenizers: Tokenizers, folder: Path) -> None:
    """vocab.{src,tgt}.txt always; spm.{src,tgt}.model for SentencePiece tokenizers (+ table.{src,tgt}.json for a
    piece table's); tokenizers.txt names the kind of each side when one is not a word or SentencePiece
    tokenizer (characters, frames, a piece table)."""
    kinds = []
    for side, tok in zip(("src", "tgt"), tokenizers):
        tok.vocab.save(folder / f"vocab.{side}.txt")
        if isinstance(tok, SubwordTokenizer):
            tok.save(folder / f"spm.{side}.model")
        elif isinstance(tok, PieceTableTokenizer):
            tok.save(folder, side)
        kinds.append(f"{side} {_kind(tok)}\n")
    if any(k.split()[1] in ("char", "frames", "pieces") for k in kinds):
        (folder / "tokenizers.txt").write_text("".join(kinds), encoding="utf-8")


def load_tokenizers(folder: Path) -> Tokenizers:
    kinds = {"src": "", "tgt": ""}
    if (folder / "tokenizers.txt").exists():
        for n, line in enumerate((folder / "tokenizers.txt").read_text(encoding="utf-8").splitlines(), 1):
            side, _, kind = line.partition(" ")
            if side not in kinds or kind not in KINDS:
                raise CheckpointError(f"{folder / 'tokenizers.txt'}, line {n}: expected 'src|tgt "
                                      f"{'|'.join(KINDS)}', got {line!r}")
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
            elif kinds[side] == "pieces":
                tok = PieceTableTokenizer.load(folder, side, vocab)
            else:
                tok = SubwordTokenizer.load(model) if model.exists() else WordTokenizer(vocab)
        except DataError as e:  # a missing or damaged vocabulary or SentencePiece file
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
    legacy: bool = False  # tensor names from before the model was a composition (see load_model_state)

    @property
    def has_ema(self) -> bool:
        return (self.path / EMA_FILE).is_file()

    def weights_file(self, which: str = "auto") -> Path:
        """model.safetensors ('raw') or ema.safetensors ('ema': train.ema's moving average); 'auto': the average
        when the checkpoint has one (validation chose the best checkpoint by it), else the raw weights."""
        if which not in ("auto", "raw", "ema"):
            raise ValueError(f"which must be 'auto', 'raw' or 'ema', got {which!r}")
        if which == "ema" and not self.has_ema:
            raise CheckpointError(f"{self.path} holds no {EMA_FILE}: its run did not average the weights "
                                  "(train.ema=0)")
        return self.path / (EMA_FILE if which == "ema" or (which == "auto" and self.has_ema) else "model.safetensors")

    def weights(self, which: str = "auto") -> dict[str, Tensor]:
        """The tensors of `weights_file(which)`."""
        file = self.weights_file(which)
        try:
            return load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: cannot be read as safetensors ({e})") from None

    def load_model_state(self, model: nn.Module, which: str = "auto") -> None:
        """Load the weights into `model` (`which`: see `weights_file`), rejecting missing, extra or mis-shaped
        tensors by name."""
        file, tensors = self.weights_file(which), self.weights(which)
        upgraded = upgrade_state(tensors)
        self.legacy = upgraded.keys() != tensors.keys()  # written before the model was a composition
        tensors = upgraded
        expected = unique_state(model)
        fits = (f"the weights do not fit the model {self.path / 'config.yaml'} describes (files from different "
                "runs, an edited config, or a tampered file)")
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        if missing or extra:
            raise CheckpointError(f"{file}: {fits}: missing tensors {missing[:5]}, unexpected tensors {extra[:5]}")
        for k, v in expected.items():
            if tensors[k].shape != v.shape:
                raise CheckpointError(f"{file}: {fits}: tensor '{k}' has shape {tuple(tensors[k].shape)}, the "
                                      f"model needs {tuple(v.shape)}")
            if tensors[k].dtype != v.dtype:
                raise CheckpointError(f"{file}: tensor '{k}' is {tensors[k].dtype}, the model needs {v.dtype}")
            if v.is_floating_point() and not bool(torch.isfinite(tensors[k]).all()):
                raise CheckpointError(f"{file}: tensor '{k}' holds NaN or inf values; the checkpoint is corrupt "
                                      "(use an earlier one)")
        model.load_state_dict(tensors, strict=False)  # tied aliases are filled through their first name

    def load_training_state(self, optimizer: torch.optim.Optimizer, rank: int = 0, model: nn.Module | None = None
                            ) -> None:
        """Optimizer moments and this process's random state (`rank` of a torchrun job); `model` (whose weights
        `load_model_state` loaded) maps an older checkpoint's parameter order onto today's."""
        file = self.path / "optimizer.safetensors"
        if not file.exists() or "param_groups" not in self.trainer:
            raise CheckpointError(f"{self.path} holds no optimizer state: it cannot be resumed")
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{file}: cannot be read as safetensors ({e})") from None
        if self.legacy:  # its moments are listed in the older parameter order
            if model is None:
                raise CheckpointError(f"{self.path} was written by an older tformer: pass the model to map its "
                                      "optimizer state")
            order = legacy_parameter_order(model)
            tensors = {re.sub(r"^state\.(\d+)\.", lambda m: f"state.{order[int(m.group(1))]}.", k): v
                       for k, v in tensors.items()}
        _check_optimizer_tensors(file, tensors, self.trainer["param_groups"], optimizer)
        rng = tensors.get("rng.torch" if rank == 0 else f"rng.torch.rank{rank}")
        if rng is None or rng.dtype != torch.uint8 or rng.dim() != 1:
            raise CheckpointError(f"{file}: no random state for process {rank}; the file is damaged or tampered")
        optimizer.load_state_dict(optimizer_state(tensors, self.trainer["param_groups"]))
        try:
            torch.set_rng_state(rng)
        except RuntimeError as e:
            raise CheckpointError(f"{file}: the random state of process {rank} is not valid ({e})") from None


def _check_optimizer_tensors(file: Path, tensors: dict[str, Tensor], groups: Any,
                             optimizer: torch.optim.Optimizer) -> None:
    """The saved moments must be exactly the optimizer's: one entry per parameter, the parameter's shape."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    want = [g["params"] for g in optimizer.state_dict()["param_groups"]]  # the parameter indices of each group
    if not (isinstance(groups, list) and [g.get("params") if isinstance(g, dict) else None for g in groups] == want):
        raise CheckpointError(f"{file.parent / 'trainer.json'}: 'param_groups' do not describe this model's "
                              f"{len(params)} parameters; the checkpoint is damaged or from another model")
    for key, v in tensors.items():
        if key.startswith("rng."):
            continue
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit() or int(parts[1]) >= len(params):
            raise CheckpointError(f"{file}: unexpected tensor '{key}'; the file is damaged or from another model")
        shape = params[int(parts[1])].shape
        if parts[2] != "step" and v.shape != shape:
            raise CheckpointError(f"{file}: tensor '{key}' has shape {tuple(v.shape)}, its parameter "
                                  f"{tuple(shape)}; the checkpoint is damaged or from another model")
        if not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{file}: tensor '{key}' holds NaN or inf values; the checkpoint is corrupt")
    have = {int(k.split(".")[1]) for k in tensors if k.startswith("state.")}
    if have and have != set(range(len(params))):
        raise CheckpointError(f"{file}: optimizer state for {len(have)} of {len(params)} parameters; the file is "
                              "damaged or from another model")


def load_checkpoint(path: str | Path, which: str = "best", overrides: list[str] = ()) -> Checkpoint:
    """A run folder's `which` checkpoint or a checkpoint folder (tformer.convert.open_checkpoint also reads
    other toolkits' folders)."""
    ckpt = resolve_checkpoint(path, which)
    try:
        info = json.loads((ckpt / "trainer.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt / 'trainer.json'} is corrupt ({e})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt} is not a tformer checkpoint (trainer.json has no format '{FORMAT}')")
    if not isinstance(info.get("version"), int) or not isinstance(info.get("step"), int) or info["step"] < 0:
        raise CheckpointError(f"{ckpt / 'trainer.json'}: 'version' and 'step' must be whole numbers >= 0; the file "
                              "is damaged or tampered")
    check_fields(info, ckpt / "trainer.json")
    if info["version"] > FORMAT_VERSION:
        raise CheckpointError(f"{ckpt} has format version {info['version']}, newer than this tformer "
                              f"reads ({FORMAT_VERSION}); upgrade tformer")
    try:  # the checkpoint's own file: a problem there is the checkpoint's
        cfg = load_config(ckpt / "config.yaml")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    if overrides:  # the caller's: a problem there stays a ConfigError naming the override
        cfg = load_config(ckpt / "config.yaml", overrides)
    return Checkpoint(ckpt, cfg, load_tokenizers(ckpt), info)
