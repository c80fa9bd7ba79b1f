"""Pictures of attention structures, drawn from the Graph objects the kernel computes on.

    plot_seed_graphs   the DGL seed's three graphs for one sentence pair, as key -> query edges
    plot_pattern       a packed batch's graph as a (query x key) pattern: sentences on the diagonal
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import torch  # noqa: E402
from matplotlib.collections import LineCollection

from tformer.masks import Graph, bipartite_graph, self_graph  # noqa: E402
from tformer.structures import FULL, Structure  # noqa: E402


def _draw_edges(ax, graph: Graph, keys: list[str], queries: list[str], title: str, color: str) -> LineCollection:
    """Keys in a top row, queries in a bottom row, one line per edge key -> query."""
    kx = torch.arange(graph.n_keys, dtype=torch.float) - (graph.n_keys - 1) / 2
    qx = torch.arange(graph.n_queries, dtype=torch.float) - (graph.n_queries - 1) / 2
    segments = [[(float(kx[k]), 1.0), (float(qx[q]), 0.0)] for q, k in zip(graph.query.tolist(), graph.key.tolist())]
    lines = LineCollection(segments, colors=color, linewidths=1.0, alpha=0.55)
    ax.add_collection(lines)
    ax.scatter(kx.numpy(), [1.0] * len(kx), s=180, color="white", edgecolors="black", zorder=3)
    ax.scatter(qx.numpy(), [0.0] * len(qx), s=180, color="white", edgecolors="black", zorder=3)
    for x, t in zip(kx.tolist(), keys):
        ax.annotate(t, (x, 1.0), xytext=(0, 11), textcoords="offset points", ha="center", fontsize=8)
    for x, t in zip(qx.tolist(), queries):
        ax.annotate(t, (x, 0.0), xytext=(0, -17), textcoords="offset points", ha="center", fontsize=8)
    ax.set_title(f"{title}\n{graph.n_edges} edges", fontsize=10)
    width = max(graph.n_keys, graph.n_queries) / 2 + 0.5
    ax.set_xlim(-width - 1.0, width)
    ax.set_ylim(-0.45, 1.45)
    ax.text(-width - 0.9, 1.0, "keys", fontsize=8, va="center", color="gray")
    ax.text(-width - 0.9, 0.0, "queries", fontsize=8, va="center", color="gray")
    ax.axis("off")
    return lines


def plot_seed_graphs(source: list[str], target: list[str], path: str | Path | None = None):
    """The three graphs of one sentence pair: source fully connected, target causal, source -> target.
    Returns the figure; its three LineCollections hold exactly the graphs' edges."""
    S, T = torch.tensor([len(source)]), torch.tensor([len(target)])
    graphs = [(self_graph(S, FULL, causal=False), source, source, "encoder: source tokens, fully connected", "C0"),
              (self_graph(T, FULL, causal=True), target, target, "decoder: target tokens, causal", "C1"),
              (bipartite_graph(T, S), source, target, "cross: every source token -> every target token", "C2")]
    fig, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 3.2))
    for ax, (graph, keys, queries, title, color) in zip(axes, graphs):
        _draw_edges(ax, graph, keys, queries, title, color)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_pattern(lengths: list[int], structure: Structure = FULL, causal: bool = False,
                 path: str | Path | None = None):
    """A packed batch of sentences of `lengths` under `structure`, as the (query x key) grid of its edges."""
    graph = self_graph(torch.tensor(lengths), structure, causal)
    fig, ax = plt.subplots(figsize=(5.2, 5.2))
    ax.imshow(graph.dense().float().numpy(), cmap="Blues", interpolation="nearest", vmin=0, vmax=1.25)
    for edge in torch.cumsum(torch.tensor(lengths), 0)[:-1].tolist():  # sentence boundaries
        ax.axhline(edge - 0.5, color="gray", lw=0.5)
        ax.axvline(edge - 0.5, color="gray", lw=0.5)
    kind = structure.describe() + (", causal" if causal else "")
    ax.set_title(f"packed batch, sentences of {', '.join(map(str, lengths))} tokens\n{kind}: {graph.n_edges} edges "
                 f"of {sum(lengths) ** 2} pairs", fontsize=9)
    ax.set_xlabel("key token (packed)")
    ax.set_ylabel("query token (packed)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig, graph
