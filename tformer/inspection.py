"""What a model computed for given sentence pairs: the attention of every head of every layer (or ACT step),
and a universal transformer's steps per token, labelled with the tokens. Pictures of them: tformer.viz.

    attention_maps(model, pairs, src_labels, tgt_labels)   teacher-forced forward, need_weights=True
                                                           -> one AttentionMaps per pair
    hard_alignments(model, pairs, layer, heads)            batched teacher-forced forwards -> for each pair,
                                                           (source index, target index) per target piece
    token_labels(tokenizer, ids)                           the vocabulary entry of each id

The weights are the kernels' own softmax outputs (`Transformer.forward(..., need_weights=True)`), in any
layout: padded (B, H, Lq, Lk) tensors are cut to the sentence, the packed layout's per-edge weights (E, H)
are scattered onto their graph's (query, key) pairs. Nothing is re-normalised or re-computed here.

Labels. Source keys and queries are the source pieces and </s>. Decoder queries are labelled by the token
each position *produces* (y1 .. yn, </s>), so a copy model's cross-attention is a diagonal; the decoder's own
keys are the tokens it *reads* (<s>, y1 .. yn). A universal transformer's "layers" are its ACT steps; a
position that had already halted before a step is NaN in that step's rows (drawn blank): its state no
longer changes there.

Hard alignment (fairseq's --print-alignment, Marian's --alignment hard): each target piece (not </s>) is
aligned to the source piece (not </s>; a frame encoder's model frame) with the largest cross-attention weight
of the query that produces it, averaged over the chosen heads of the chosen decoder layer (default: all heads
of the last layer); ties go to the first. A universal transformer's layers are its ACT steps, per position:
step k means min(k, the position's last step), and -1 each position's own last step (-2 the one before, ...),
so an alignment does not depend on how long the other sentences of its batch pondered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from tformer.data.batching import pad_frames, pad_sequences
from tformer.data.vocab import Vocab
from tformer.errors import ConfigError, TformerError
from tformer.inference import BatchType, decode_batches

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
    for w in weights:
        if graph is not None:  # packed: (E, H) per edge of `graph` -> padded (B, H, Lq, Lk)
            w = _padded(w, graph, q_lens, k_lens)
        w = w.float().cpu()  # (B, H, Lq, Lk)
        for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
            out[b].append(w[b, :, :lq, :lk].numpy())
    return [np.stack(layers) for layers in out]


def _padded(w: Tensor, graph, q_lens: list[int], k_lens: list[int]) -> Tensor:
    """(E, H) weights on the edges of a packed batch's graph -> (B, H, Lq, Lk), zero off the graph; every edge
    joins a query and a key of the same sentence."""
    device = graph.query.device
    q_sent = torch.repeat_interleave(torch.arange(len(q_lens), device=device), torch.tensor(q_lens, device=device))
    q_start = torch.tensor([0] + q_lens[:-1], device=device).cumsum(0)  # (B,)
    k_start = torch.tensor([0] + k_lens[:-1], device=device).cumsum(0)  # (B,)
    sent = q_sent[graph.query]  # (E,)
    dense = w.new_zeros(len(q_lens), w.shape[1], max(q_lens), max(k_lens))  # (B, H, Lq, Lk)
    dense[sent, :, graph.query - q_start[sent], graph.key - k_start[sent]] = w  # (E, H)
    return dense


def _teacher_forced(model, pairs: list[tuple[list[int] | Tensor, list[int]]]):
    """One forward pass over the pairs with need_weights=True: (ModelOutput, model source lengths, target
    lengths with <s>, frames?)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        frames = isinstance(pairs[0][0], Tensor)
        if frames:
            src = pad_frames([s for s, _ in pairs]).to(device)  # (B, S, F)
            src_lengths = torch.tensor([len(s) for s, _ in pairs], device=device)
        else:
            src = pad_sequences([s for s, _ in pairs], Vocab.pad, last=Vocab.eos)[0].to(device)  # (B, S)
            src_lengths = torch.tensor([len(s) + 1 for s, _ in pairs], device=device)
        tgt_in = pad_sequences([t for _, t in pairs], Vocab.pad, first=Vocab.bos)[0].to(device)  # (B, T)
        tgt_lengths = torch.tensor([len(t) + 1 for _, t in pairs], device=device)
        out = model(src, src_lengths, tgt_in, tgt_lengths, need_weights=True)
    finally:
        model.train(was_training)
    s_lens = [int(n) for n in (src_lengths if not frames else _model_frames(model, src_lengths))]
    return out, s_lens, [int(n) for n in tgt_lengths], frames


@torch.inference_mode()
def attention_maps(model, pairs: list[tuple[list[int] | Tensor, list[int]]],
                   src_labels: list[list[str]] | None = None,
                   tgt_labels: list[list[str]] | None = None) -> list[AttentionMaps]:
    """Attention of the model on each (source, target) pair, teacher-forced: source ids without </s> (or
    frames (S, F)), target ids without <s>/</s> (a reference, or the model's own output: the cached decoding
    steps compute exactly these weights). Labels: the pieces of source and target (default: the ids)."""
    if not pairs:
        return []
    out, s_lens, t_lens, frames = _teacher_forced(model, pairs)
    att = out.attentions
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
            source = frame_times(s_lens[b], model.cfg.frame_rate) if frames else [str(i) for i in s] + ["</s>"]
        target = list(tgt_labels[b]) if tgt_labels is not None else [str(i) for i in t]
        maps.append(AttentionMaps(source, ["<s>"] + target, target + ["</s>"], weights,
                                  "step" if universal else "layer", steps))
    return maps


def check_alignment(model, layer: int, heads: Sequence[int] | None) -> tuple[int, ...] | None:
    """The alignment's layer and heads checked against the model (ConfigError naming the valid range);
    returns the heads as a tuple."""
    cfg = model.cfg
    universal = cfg.kind == "universal"
    n, what = (cfg.max_steps, "ACT steps (model.max_steps)") if universal else (cfg.decoder_layers, "decoder layers")
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
        raise ConfigError(f"alignment_layer (--alignment-layer) must be a whole number in {-n}..{n - 1} ({what}: "
                          f"{n}; -1: the last), got {layer!r}")
    if heads is None:
        return None
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence) or not heads:
        raise ConfigError(f"alignment_heads (--alignment-heads) must be a non-empty list of head indices, or None "
                          f"for all; got {heads!r}")
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < cfg.n_heads:
            raise ConfigError(f"alignment_heads (--alignment-heads): the model has {cfg.n_heads} heads "
                              f"(0..{cfg.n_heads - 1}); got {h!r}")
    return tuple(heads)


def _argmax_pairs(cross: np.ndarray, frames: bool) -> list[tuple[int, int]]:
    """(T, S) cross-attention of one pair (rows: the queries producing y1 .. yn </s>; columns: the source and
    its </s>) -> (source index, target index) of each row's largest weight, without </s> on either side."""
    keys = cross[:-1] if frames else cross[:-1, :-1]  # (n, S) no </s> query, no </s> key
    if keys.shape[0] == 0 or keys.shape[1] == 0:
        return []
    return [(int(s), t) for t, s in enumerate(keys.argmax(axis=1))]  # argmax: the first of equal weights


@torch.inference_mode()
def hard_alignments(model, pairs: list[tuple[list[int] | Tensor, list[int]]], layer: int = -1,
                    heads: Sequence[int] | None = None, batch_size: int = 250,
                    batch_type: BatchType = "examples") -> list[list[tuple[int, int]]]:
    """Hard alignment of each (source, target) pair (ids as attention_maps takes them): for every target piece
    in order, (source index, target index), 0-based over the pieces without </s> (see the module's notes).
    `layer`: a decoder layer (negative counts from the last; a universal transformer's ACT step); `heads`:
    the heads averaged (None: all). Teacher-forced forward passes over batches of pairs, chosen as decoding
    chooses them (`batch_size` pairs, or padded tokens with batch_type 'tokens')."""
    heads = check_alignment(model, layer, heads)
    universal = model.cfg.kind == "universal"
    out: list[list[tuple[int, int]]] = [[] for _ in pairs]
    frames = bool(pairs) and isinstance(pairs[0][0], Tensor)
    lengths = [max(len(s) + (0 if frames else 1), len(t) + 1) for s, t in pairs]
    for rows in decode_batches(lengths, batch_size, batch_type):
        result, s_lens, t_lens, _ = _teacher_forced(model, [pairs[i] for i in rows])
        att = result.attentions
        chosen = att.cross if universal else [att.cross[layer]]  # all steps, or the one layer
        per_pair = _per_example(chosen, att.graphs.get("cross"), t_lens, s_lens)  # (layers, H, T, S) each
        for b, i in enumerate(rows):
            w = per_pair[b] if heads is None else per_pair[b][:, list(heads)]
            w = w.mean(axis=1)  # (layers, T, S) averaged over the heads
            if universal:  # each target position's own step: min(layer, its last) or counted from its last
                steps = result.ponder[1].steps[b, : t_lens[b]].long().cpu().numpy()  # (T,)
                step = np.minimum(layer, steps - 1) if layer >= 0 else np.maximum(steps + layer, 0)
                w = w[step, np.arange(len(step))]  # (T, S)
            else:
                w = w[0]  # (T, S)
            out[i] = _argmax_pairs(w, frames)
    return out


def frame_times(n: int, frame_rate: int, shift_ms: float = 10.0) -> list[str]:
    """Labels of n model frames: the time each starts at in its recording ('0.36s'), input frames shift_ms
    apart (the filterbanks' 10 ms) and frame_rate input frames per model frame."""
    return [f"{i * frame_rate * shift_ms / 1000:.2f}s" for i in range(n)]


def _model_frames(model, counts: Tensor) -> Tensor:
    skip = model.cfg.frame_rate
    return torch.div(counts + skip - 1, skip, rounding_mode="floor")
