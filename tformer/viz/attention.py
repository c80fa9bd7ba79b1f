"""Attention maps: what each head of each layer attends to, for one sentence pair, with tokens as labels.

    attention_maps(model, pairs)     teacher-forced forward with need_weights=True -> one AttentionMaps per pair
    plot_attention(maps, kind, l, h) one head as a heatmap        plot_head_grid(maps, kind, l)  all heads
    save_figure(fig, path)           PNG, SVG (by suffix) or both (no suffix)

The weights are the kernels' own softmax outputs (`Transformer.forward(..., need_weights=True)`), in any
layout: padded (B, H, Lq, Lk) tensors are cut to the sentence, the packed layout's per-edge weights (E, H)
are scattered onto their graph's (query, key) pairs. Nothing is re-normalised or re-computed here.

Labels. Source keys and queries are the source pieces and </s>. Decoder queries are labelled by the token
each position *produces* (y1 .. yn, </s>), so a copy model's cross-attention is a diagonal; the decoder's own
keys are the tokens it *reads* (<s>, y1 .. yn). A universal transformer's "layers" are its ACT steps; a
position that had already halted before a step is NaN in that step's rows (drawn blank): its state no
longer changes there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from tformer.data.batching import pad_frames, pad_sequences  # noqa: E402
from tformer.data.vocab import Vocab  # noqa: E402

KINDS = ("encoder", "decoder", "cross")
KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "encoder-decoder attention"}


@dataclass
class AttentionMaps:
    """The attention of one sentence pair. weights[kind]: (layers, H, queries, keys) float32."""

    source: list[str]  # S labels: source pieces + </s> (or model frames)
    target_in: list[str]  # T labels of what the decoder reads: <s> y1 .. yn
    target_out: list[str]  # T labels of what it produces: y1 .. yn </s>
    weights: dict[str, np.ndarray]
    layer_name: str = "layer"  # "step" for a universal transformer
    steps: tuple[list[int], list[int]] | None = None  # ACT steps per source / target position (universal)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query labels, key labels) of `kind`."""
        if kind == "encoder":
            return self.source, self.source
        if kind == "decoder":
            return self.target_out, self.target_in
        if kind == "cross":
            return self.target_out, self.source
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")

    def layers(self, kind: str) -> int:
        return self.weights[kind].shape[0]

    def heads(self) -> int:
        return self.weights["encoder"].shape[1]

    def get(self, kind: str, layer: int, head: int | None = None) -> np.ndarray:
        """(queries, keys) of one head, or (H, queries, keys) of a layer; errors name the valid range."""
        self.labels(kind)  # names the valid kinds
        w = self.weights[kind]
        if not 0 <= layer < w.shape[0]:
            raise ValueError(f"{kind} has {w.shape[0]} {self.layer_name}s (0..{w.shape[0] - 1}); got {layer}")
        if head is None:
            return w[layer]
        if not 0 <= head < w.shape[1]:
            raise ValueError(f"the model has {w.shape[1]} heads (0..{w.shape[1] - 1}); got {head}")
        return w[layer, head]


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """The vocabulary entry of each id (SentencePiece pieces keep their '▁' word marks)."""
    itos = tokenizer.vocab.itos
    return [itos[i] if 0 <= i < len(itos) else f"<{i}>" for i in ids]


def _per_example(weights: list[Tensor], graph, q_lens: list[int], k_lens: list[int]) -> list[np.ndarray]:
    """Per-layer weights of a batch -> per example (layers, H, lq, lk)."""
    out: list[list[np.ndarray]] = [[] for _ in q_lens]
    q_off = np.concatenate([[0], np.cumsum(q_lens)])
    k_off = np.concatenate([[0], np.cumsum(k_lens)])
    for w in weights:
        if graph is not None:  # packed: (E, H) per edge of `graph`
            dense = w.new_zeros(w.shape[1], graph.n_queries, graph.n_keys)  # (H, Nq, Nk)
            dense[:, graph.query, graph.key] = w.t()
            for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
                out[b].append(dense[:, q_off[b] : q_off[b] + lq, k_off[b] : k_off[b] + lk].float().numpy())
        else:  # padded: (B, H, Lq, Lk)
            for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
                out[b].append(w[b, :, :lq, :lk].float().numpy())
    return [np.stack(layers) for layers in out]


@torch.inference_mode()
def attention_maps(model, pairs: list[tuple[list[int] | Tensor, list[int]]],
                   src_labels: list[list[str]] | None = None,
                   tgt_labels: list[list[str]] | None = None) -> list[AttentionMaps]:
    """Attention of the model on each (source, target) pair, teacher-forced: source ids without </s> (or
    frames (S, F)), target ids without <s>/</s> (a reference, or the model's own output: the cached decoding
    steps compute exactly these weights). Labels: the pieces of source and target (default: the ids)."""
    if not pairs:
        return []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        frames = isinstance(pairs[0][0], Tensor)
        if frames:
            src = pad_frames([s for s, _ in pairs]).to(device)
            src_lengths = torch.tensor([len(s) for s, _ in pairs], device=device)
        else:
            src = pad_sequences([list(s) + [Vocab.eos] for s, _ in pairs], Vocab.pad).to(device)
            src_lengths = torch.tensor([len(s) + 1 for s, _ in pairs], device=device)
        tgt_in = pad_sequences([[Vocab.bos] + list(t) for _, t in pairs], Vocab.pad).to(device)
        tgt_lengths = torch.tensor([len(t) + 1 for _, t in pairs], device=device)
        out = model(src, src_lengths, tgt_in, tgt_lengths, need_weights=True)
    finally:
        model.train(was_training)
    att = out.attentions
    s_lens = [int(n) for n in (src_lengths if not frames else _model_frames(model, src_lengths))]
    t_lens = [int(n) for n in tgt_lengths]
    per_kind = {
        "encoder": _per_example(att.encoder, att.graphs.get("encoder"), s_lens, s_lens),
        "decoder": _per_example(att.decoder, att.graphs.get("decoder"), t_lens, t_lens),
        "cross": _per_example(att.cross, att.graphs.get("cross"), t_lens, s_lens),
    }
    universal = out.ponder is not None
    maps = []
    for b, (s, t) in enumerate(pairs):
        steps = None
        if universal:
            src_steps = out.ponder[0].steps[b, : s_lens[b]].long().tolist()
            tgt_steps = out.ponder[1].steps[b, : t_lens[b]].long().tolist()
            steps = (src_steps, tgt_steps)
        weights = {k: per_kind[k][b].copy() for k in KINDS}
        if steps is not None:  # blank the rows of positions that had halted before the step
            for kind, rows in (("encoder", steps[0]), ("decoder", steps[1]), ("cross", steps[1])):
                for step in range(weights[kind].shape[0]):
                    weights[kind][step][:, np.asarray(rows) <= step, :] = np.nan  # (H, halted rows, keys)
        if src_labels is not None:
            source = list(src_labels[b]) + ([] if frames else ["</s>"])
        else:
            source = [f"f{i}" for i in range(s_lens[b])] if frames else [str(i) for i in s] + ["</s>"]
        target = list(tgt_labels[b]) if tgt_labels is not None else [str(i) for i in t]
        maps.append(AttentionMaps(source, ["<s>"] + target, target + ["</s>"], weights,
                                  "step" if universal else "layer", steps))
    return maps


@dataclass
class Inspection:
    """A sentence, the model's n-best translations of it and the attention of each."""

    source: str
    pieces: list[str]  # source pieces
    hypotheses: list[tuple[str, float, list[str]]]  # (text, score, pieces), best first
    maps: list[AttentionMaps]  # one per hypothesis


def inspect_sentence(model, tokenizers, text: str, decode, target: str | None = None) -> Inspection:
    """Translate `text` with `decode` (a DecodeConfig) and compute the attention of every hypothesis; with
    `target`, the attention of that forced translation instead (score: its log-probability)."""
    from tformer.data.corpus import normalize
    from tformer.inference import translate_ids

    src_tok, tgt_tok = tokenizers
    ids = src_tok.encode(normalize(text))
    if not ids:
        raise ValueError("the sentence is empty")
    if target is not None:
        hyps = [tgt_tok.encode(normalize(target))]
        if not hyps[0]:
            raise ValueError("the forced target is empty")
        scores = [_log_prob(model, ids, hyps[0])]
    else:
        nbest = translate_ids(model, [ids], decode)
        hyps, scores = nbest.tokens[0], nbest.scores[0]
    pieces = token_labels(src_tok, ids)
    hyp_pieces = [token_labels(tgt_tok, h) for h in hyps]
    maps = attention_maps(model, [(ids, h) for h in hyps], [pieces] * len(hyps), hyp_pieces)
    return Inspection(text, pieces, [(tgt_tok.decode(h), float(sc), p) for h, sc, p in zip(hyps, scores, hyp_pieces)],
                      maps)


@torch.inference_mode()
def _log_prob(model, src: list[int], tgt: list[int]) -> float:
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = model(torch.tensor([src + [Vocab.eos]], device=device), torch.tensor([len(src) + 1], device=device),
                    torch.tensor([[Vocab.bos] + tgt], device=device), torch.tensor([len(tgt) + 1], device=device))
        logp = torch.log_softmax(model.generator(out.real()).float(), -1)  # (T, V)
        gold = torch.tensor(tgt + [Vocab.eos], device=device)
        return float(logp.gather(1, gold[:, None]).sum())
    finally:
        model.train(was_training)


def _model_frames(model, counts: Tensor) -> Tensor:
    skip = model.cfg.frame_skip
    return torch.div(counts + skip - 1, skip, rounding_mode="floor")


# ------------------------------------------------------------------------------------------ pictures


def _heatmap(ax, w: np.ndarray, queries: list[str], keys: list[str], title: str, labels: bool = True):
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")  # NaN: halted positions (universal)
    im = ax.imshow(np.ma.masked_invalid(w), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    size = 8 if max(len(queries), len(keys)) <= 30 else 6
    if labels:
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=size)
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
