"""Pictures of attention maps (computed by tformer.inspection): what each head of each layer attends to, for
one sentence pair, with tokens as labels.

    plot_attention(maps, kind, l, h) one head as a heatmap        plot_head_grid(maps, kind, l)  all heads
    head_grid(w, queries, keys)      the labelled grid of heads both use (and the animations)
    save_figure(fig, path)           PNG, SVG (by suffix) or both (no suffix)

Rows are queries, columns keys; NaN cells (positions a universal transformer had halted) are drawn blank.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np  # noqa: E402

from tformer.inspection import KINDS, AttentionMaps, attention_maps, token_labels  # noqa: E402,F401 (re-exported)

KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "encoder-decoder attention"}


# ------------------------------------------------------------------------------------------ pictures


def _heatmap(ax, w: np.ndarray, queries: list[str], keys: list[str], title: str, labels: bool = True):
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")  # NaN: halted positions (universal)
    im = ax.imshow(np.ma.masked_invalid(w), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    size = 8 if max(len(queries), len(keys)) <= 30 else 6
    if labels:  # past 60 keys (frames of speech, long sentences), every k-th labelled
        every = -(-len(keys) // 60)
        ax.set_xticks(range(0, len(keys), every), keys[::every], rotation=90, fontsize=size)
        ax.set_yticks(range(len(queries)), queries, fontsize=size)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    return im


def plot_attention(maps: AttentionMaps, kind: str, layer: int, head: int, path: str | Path | None = None):
    """One head of one layer as a heatmap: rows are queries, columns keys, both labelled with tokens."""
    queries, keys = maps.labels(kind)
    w = maps.get(kind, layer, head)
    fig, ax = plt.subplots(figsize=(1.6 + 0.28 * len(keys), 1.4 + 0.28 * len(queries)))
    im = _heatmap(ax, w, queries, keys, f"{KIND_TITLES[kind]}, {maps.layer_name} {layer}, head {head}")
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    return fig


def head_grid(w: np.ndarray, queries: list[str], keys: list[str], cols: int = 4):
    """A figure with one labelled heatmap per head of w (H, Lq, Lk): token labels on the left column and the
    bottom row. Returns (figure, axes grid, one image per head)."""
    H = w.shape[0]
    cols = min(cols, H)
    rows = -(-H // cols)
    cell_w, cell_h = 0.9 + 0.2 * len(keys), 0.7 + 0.2 * len(queries)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * cell_w + 1.2, rows * cell_h + 0.9), squeeze=False)
    images = []
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.axis("off")
            continue
        images.append(_heatmap(ax, w[h], queries, keys, f"head {h}"))
        if h % cols:
            ax.set_yticks([])
        if h + cols < H:  # a head below this one carries the key labels
            ax.set_xticks([])
    return fig, axes, images


def plot_head_grid(maps: AttentionMaps, kind: str, layer: int, path: str | Path | None = None, cols: int = 4):
    """Every head of one layer, side by side."""
    queries, keys = maps.labels(kind)
    fig, axes, images = head_grid(maps.get(kind, layer), queries, keys, cols)
    fig.suptitle(f"{KIND_TITLES[kind]}, {maps.layer_name} {layer}", fontsize=10)
    fig.tight_layout()
    fig.colorbar(images[-1], ax=axes, shrink=0.6)
    if path is not None:
        save_figure(fig, path)
    return fig


def save_figure(fig, path: str | Path | list[Path], dpi: int = 110) -> list[Path]:
    """Save as each path's format (.png, .svg, .pdf); a path without a suffix gives both PNG and SVG. Closes
    the figure."""
    paths = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
    paths = [q for p in paths for q in ([p] if p.suffix else [p.with_suffix(".png"), p.with_suffix(".svg")])]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return paths
