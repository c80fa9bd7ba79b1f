"""Attention over training: fixed validation examples recorded at every evaluation, animated afterwards.

With `train.attention_examples: N`, the training loop calls `AttentionRecorder.record(model, step)` before the
first update and after every evaluation. Each call writes

    RUN_DIR/attention/step_0000500.safetensors
        "{i}.encoder" / "{i}.decoder" / "{i}.cross"   (layers, H, queries, keys) float16 of example i
        "{i}.steps.source" / "{i}.steps.target"       ACT steps per position (universal transformer)
        metadata "labels": JSON [[source labels, target labels], ...]

teacher-forced on the references, so every frame has the same axes. Written under a temporary name and
renamed; a resumed run drops the files of steps after its checkpoint (they will be recorded again).

    load_recording(run_dir)                     -> Recording (steps, per-step AttentionMaps)
    animate_attention(rec, example, kind, layer, head, path)   one GIF, one frame per recorded step
    animate_head_grid(rec, example, kind, layer, path)         every head of a layer
    animate_steps(rec, example, path)           universal transformer: steps per token over training
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors import SafetensorError, safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from tformer.errors import DataError  # noqa: E402
from tformer.viz.attention import (KIND_TITLES, KINDS, AttentionMaps, _heatmap, attention_maps,  # noqa: E402
                                   head_grid, token_labels)

FOLDER = "attention"
STEP_FILE = re.compile(r"^step_(\d+)\.safetensors$")


class AttentionRecorder:
    """Records the attention of the first `n` examples of a split (their references as targets)."""

    def __init__(self, run_dir: str | Path, examples, tokenizers, n: int) -> None:
        self.folder = Path(run_dir) / FOLDER
        self.examples = list(examples[:n])
        src_tok, tgt_tok = tokenizers
        frames = bool(self.examples) and isinstance(self.examples[0][0], torch.Tensor)
        self.labels = [[None if frames else token_labels(src_tok, list(s)), token_labels(tgt_tok, list(t))]
                       for s, t in self.examples]

    def record(self, model, step: int) -> Path | None:
        if not self.examples:
            return None
        maps = attention_maps(model, self.examples, None if self.labels[0][0] is None else
                              [lab[0] for lab in self.labels], [lab[1] for lab in self.labels])
        tensors: dict[str, np.ndarray] = {}
        for i, m in enumerate(maps):
            for kind in KINDS:
                tensors[f"{i}.{kind}"] = m.weights[kind].astype(np.float16)
            if m.steps is not None:
                tensors[f"{i}.steps.source"] = np.asarray(m.steps[0], dtype=np.int32)
                tensors[f"{i}.steps.target"] = np.asarray(m.steps[1], dtype=np.int32)
        labels = [[m.source, m.target_out[:-1]] for m in maps]
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"step_{step:07d}.safetensors"
        tmp = self.folder / f".{final.name}.tmp-{os.getpid()}"
        save_file(tensors, str(tmp), metadata={"labels": json.dumps(labels), "step": str(step),
                                               "layer_name": maps[0].layer_name})
        os.replace(tmp, final)
        return final

    def truncate(self, step: int) -> None:
        """A resume from `step`: drop what was recorded after it."""
        for path in recorded_steps(self.folder.parent):
            if path[0] > step:
                path[1].unlink()


def recorded_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_FILE.match(p.name))]
    return sorted(found)


@dataclass
class Recording:
    steps: list[int]  # training steps recorded
    maps: list[list[AttentionMaps]]  # [frame][example]

    @property
    def n_examples(self) -> int:
        return len(self.maps[0])


def load_recording(run_dir: str | Path) -> Recording:
    """Every recorded step of a run, in order. Errors say what is missing and how to record it."""
    found = recorded_steps(run_dir)
    if not found:
        raise DataError(f"{run_dir} has no recorded attention ({Path(run_dir) / FOLDER}/step_*.safetensors); train "
                        "with train.attention_examples=N (N fixed validation examples recorded at every evaluation)")
    steps, frames = [], []
    for step, path in found:
        try:
            frames.append(_read_step(path))
        except (SafetensorError, OSError, KeyError, TypeError, ValueError) as e:  # json's errors are ValueErrors
            raise DataError(f"{path} is not a tformer attention recording ({type(e).__name__}: {e}); delete it "
                            "or re-record") from None
        steps.append(step)
    if len({len(f) for f in frames}) != 1:
        raise DataError(f"{run_dir}: the recorded steps hold different numbers of examples; was "
                        "train.attention_examples changed on resume? Delete the attention/ folder's older files")
    return Recording(steps, frames)


def _read_step(path: Path) -> list[AttentionMaps]:
    """The maps of every example in one step's file (labels in the metadata, weights as tensors)."""
    tensors = load_file(str(path))
    with safe_open(str(path), "np") as f:
        meta = f.metadata() or {}
    maps = []
    for i, (source, target) in enumerate(json.loads(meta["labels"])):
        steps = None
        if f"{i}.steps.source" in tensors:
            steps = (tensors[f"{i}.steps.source"].tolist(), tensors[f"{i}.steps.target"].tolist())
        maps.append(AttentionMaps(source, ["<s>"] + target, target + ["</s>"],
                                  {k: tensors[f"{i}.{k}"].astype(np.float32) for k in KINDS},
                                  meta.get("layer_name", "layer"), steps))
    return maps


# ------------------------------------------------------------------------------------------ animation


def _write_gif(fig, frames, path: str | Path, ms_per_frame: int, dpi: int | None = None) -> Path:
    """Render each frame (a callable that updates `fig`) and write them as a looping GIF."""
    if dpi:
        fig.set_dpi(dpi)
    images = []
    for update in frames:
        update()
        fig.canvas.draw()
        rgba = np.asarray(fig.canvas.buffer_rgba())
        images.append(Image.fromarray(rgba[..., :3].copy()))
    plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the last frame stays up longer, so the trained state is readable before the loop restarts
    durations = [ms_per_frame] * (len(images) - 1) + [ms_per_frame * 4]
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=True)
    return path


def _frame_maps(rec: Recording, example: int) -> list[AttentionMaps]:
    if not 0 <= example < rec.n_examples:
        raise DataError(f"the recording has {rec.n_examples} examples (0..{rec.n_examples - 1}); got {example}")
    return [frame[example] for frame in rec.maps]


def _layers_at(maps: AttentionMaps, kind: str, layer: int) -> np.ndarray:
    """(H, Lq, Lk) of `layer`, or NaN when a universal transformer ran fewer steps at this point of training."""
    w = maps.weights[kind]
    if layer < w.shape[0]:
        return w[layer]
    return np.full(w.shape[1:], np.nan, dtype=np.float32)


def animate_attention(rec: Recording, example: int, kind: str, layer: int, head: int, path: str | Path,
                      ms_per_frame: int = 400, dpi: int | None = None) -> Path:
    """One head of one layer over training: a GIF with one frame per recorded step."""
    frames = _frame_maps(rec, example)
    first = frames[0]
    queries, keys = first.labels(kind)
    n_layers = max(m.layers(kind) for m in frames)
    if not 0 <= layer < n_layers:
        raise DataError(f"{kind} has {n_layers} {first.layer_name}s (0..{n_layers - 1}); got {layer}")
    if not 0 <= head < first.heads():
        raise DataError(f"the model has {first.heads()} heads (0..{first.heads() - 1}); got {head}")
    fig, ax = plt.subplots(figsize=(1.8 + 0.28 * len(keys), 1.7 + 0.28 * len(queries)))
    title = lambda i: f"{KIND_TITLES[kind]}, {first.layer_name} {layer}, head {head}\ntraining step {rec.steps[i]}"  # noqa: E731
    im = _heatmap(ax, _layers_at(first, kind, layer)[head], queries, keys, title(0))
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    fig.tight_layout()  # with the two-line title in place, so every frame has room for it

    def update(i: int):
        def draw() -> None:
            im.set_data(np.ma.masked_invalid(_layers_at(frames[i], kind, layer)[head]))
            ax.set_title(title(i), fontsize=9)
        return draw

    return _write_gif(fig, [update(i) for i in range(len(frames))], path, ms_per_frame, dpi)


def animate_head_grid(rec: Recording, example: int, kind: str, layer: int, path: str | Path,
                      ms_per_frame: int = 400, cols: int = 4, dpi: int | None = None) -> Path:
    """Every head of one layer over training."""
    frames = _frame_maps(rec, example)
    first = frames[0]
    queries, keys = first.labels(kind)
    fig, _, images = head_grid(_layers_at(first, kind, layer), queries, keys, cols)
    fig.tight_layout(rect=(0, 0, 1, 0.93))

    def update(i: int):
        def draw() -> None:
            w = _layers_at(frames[i], kind, layer)
            for h, im in enumerate(images):
                im.set_data(np.ma.masked_invalid(w[h]))
            fig.suptitle(f"{KIND_TITLES[kind]}, {first.layer_name} {layer}: training step {rec.steps[i]}",
                         fontsize=10)
        return draw

    return _write_gif(fig, [update(i) for i in range(len(frames))], path, ms_per_frame, dpi)


def animate_steps(rec: Recording, example: int, path: str | Path, max_steps: int | None = None,
                  ms_per_frame: int = 400, dpi: int | None = None) -> Path:
    """A universal transformer's ACT steps per source and target token over training."""
    frames = _frame_maps(rec, example)
    if frames[0].steps is None:
        raise DataError("this recording has no ACT steps: the model is not a universal transformer")
    top = max_steps or max(max(max(m.steps[0]), max(m.steps[1])) for m in frames)
    source, target = frames[0].source, frames[0].target_in
    fig, axes = plt.subplots(2, 1, figsize=(max(4.0, 0.42 * max(len(source), len(target)) + 1.8), 3.2))
    fig.subplots_adjust(hspace=1.0, top=0.78)
    strips, texts = [], []
    for ax, tokens, name, values in ((axes[0], source, "source", frames[0].steps[0]),
                                     (axes[1], target, "target", frames[0].steps[1])):
        strips.append(ax.imshow([values], cmap="viridis", vmin=1, vmax=top, aspect="auto"))
        ax.set_xticks(range(len(tokens)), tokens, fontsize=8)
        ax.set_yticks([0], [name], fontsize=8)
        texts.append([ax.text(x, 0, "", ha="center", va="center", fontsize=8) for x in range(len(tokens))])
    fig.colorbar(strips[0], ax=axes, label="ACT steps", shrink=0.8)

    def update(i: int):
        def draw() -> None:
            for strip, labels, values in zip(strips, texts, frames[i].steps):
                strip.set_data([values])
                for t, v in zip(labels, values):
                    t.set_text(str(v))
                    t.set_color("white" if v < (top + 1) / 2 else "black")
            fig.suptitle(f"ACT steps per token, training step {rec.steps[i]}", fontsize=10)
        return draw

    return _write_gif(fig, [update(i) for i in range(len(frames))], path, ms_per_frame, dpi)
