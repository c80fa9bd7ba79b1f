"""Pictures of a universal transformer's pondering: steps per position, ponder over training, a step map."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt

from tformer.errors import DataError  # noqa: E402
from tformer.viz.curves import read_metrics  # noqa: E402


def plot_step_histogram(src_steps: list[list[int]], tgt_steps: list[list[int]], max_steps: int,
                        path: str | Path | None = None):
    """Share of source and target positions that took 1 .. max_steps steps."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = list(range(1, max_steps + 1))
    for k, (name, steps) in enumerate((("encoder (source)", src_steps), ("decoder (target)", tgt_steps))):
        counts = Counter(s for row in steps for s in row)
        total = max(1, sum(counts.values()))
        mean = sum(s * c for s, c in counts.items()) / total
        ax.bar([x + (k - 0.5) * 0.4 for x in xs], [counts[x] / total for x in xs], width=0.4,
               label=f"{name}: mean {mean:.2f}")
    ax.set_xticks(xs)
    ax.set_xlabel("ACT steps taken")
    ax.set_ylabel("share of positions")
    ax.legend(fontsize=8)
    ax.set_title("Steps per position", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_ponder_curve(metrics: str | Path, path: str | Path | None = None):
    """Mean steps per position (training log) and validation exact match / BLEU over the updates."""
    records = read_metrics(metrics)  # a missing file or a bad line: DataError with the file and line
    train = [r for r in records if r.get("kind") == "train" and "ponder" in r]
    if not train:
        raise DataError(f"{metrics} has no ponder records: was this run a universal transformer (model.kind)?")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([r["step"] for r in train], [r["ponder"] for r in train], color="C0")
    ax.set_xlabel("update")
    ax.set_ylabel("mean ACT steps per position", color="C0")
    valid = [r for r in records if r.get("kind") == "valid"]
    key = "bleu" if valid and "bleu" in valid[0] else "exact_match"
    if valid and key in valid[0]:
        twin = ax.twinx()
        twin.plot([r["step"] for r in valid], [r[key] for r in valid], color="C1", marker=".")
        twin.set_ylabel(f"validation {key.replace('_', ' ')}", color="C1")
    ax.set_title("Pondering over training", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_step_map(src_tokens: list[str], tgt_tokens: list[str], src_steps: list[int], tgt_steps: list[int],
                  max_steps: int, path: str | Path | None = None):
    """Steps each token of one sentence pair took, as two labelled strips."""
    fig, axes = plt.subplots(2, 1, figsize=(max(4, 0.45 * max(len(src_tokens), len(tgt_tokens)) + 1.5), 3.0))
    fig.subplots_adjust(hspace=0.9)
    for ax, tokens, steps, name in ((axes[0], src_tokens, src_steps, "source"),
                                    (axes[1], tgt_tokens, tgt_steps, "target")):
        im = ax.imshow([steps], cmap="viridis", vmin=1, vmax=max_steps, aspect="auto")
        every = -(-len(tokens) // 40)  # long sources (speech frames): every k-th labelled
        ax.set_xticks(range(0, len(tokens), every), tokens[::every], fontsize=8, rotation=90 if every > 1 else 0)
        ax.set_yticks([0], [name], fontsize=8)
        for x, s in enumerate(steps):
            ax.text(x, 0, str(s), ha="center", va="center", fontsize=8, color="white" if s < max_steps / 2 else "black")
    fig.colorbar(im, ax=axes, label="ACT steps", shrink=0.8)
    fig.suptitle("Steps per token", fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
