"""What a model computed for given sentence pairs: the attention of every head of every layer (or ACT step),
and a universal transformer's steps per token, labelled with the tokens. Pictures of them: tformer.viz.

    attention_maps(model, pairs, src_labels, tgt_labels)   teacher-forced forward, need_weights=True
                                                           -> one AttentionMaps per pair
    token_labels(tokenizer, ids)                           the vocabulary entry of each id

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

import numpy as np
import torch
from torch import Tensor

from tformer.data.batching import pad_frames, pad_sequences
from tformer.data.vocab import Vocab
from tformer.errors import TformerError

KINDS = ("encoder", "decoder", "cross")


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
        raise TformerError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")

    def layers(self, kind: str) -> int:
        return self.weights[kind].shape[0]

    def heads(self) -> int:
        return self.weights["encoder"].shape[1]

    def get(self, kind: str, layer: int, head: int | None = None) -> np.ndarray:
        """(queries, keys) of one head, or (H, queries, keys) of a layer; errors name the valid range."""
        self.labels(kind)  # names the valid kinds
        w = self.weights[kind]
        if not 0 <= layer < w.shape[0]:
            raise TformerError(f"{kind} has {w.shape[0]} {self.layer_name}s (0..{w.shape[0] - 1}); got {layer}")
        if head is None:
            return w[layer]
        if not 0 <= head < w.shape[1]:
            raise TformerError(f"the model has {w.shape[1]} heads (0..{w.shape[1] - 1}); got {head}")
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
            src = pad_sequences([s for s, _ in pairs], Vocab.pad, last=Vocab.eos)[0].to(device)
            src_lengths = torch.tensor([len(s) + 1 for s, _ in pairs], device=device)
        tgt_in = pad_sequences([t for _, t in pairs], Vocab.pad, first=Vocab.bos)[0].to(device)
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


def _model_frames(model, counts: Tensor) -> Tensor:
    skip = model.cfg.frame_skip
    return torch.div(counts + skip - 1, skip, rounding_mode="floor")
