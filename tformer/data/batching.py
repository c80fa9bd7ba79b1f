"""Token-budget batching with length bucketing, and collation into padded tensors.

A batch's size is what the model computes on: sentences x longest side, padded, with the source's </s>
and the target's <s> counted. No batch exceeds `max_tokens`; every example appears in exactly one batch per
epoch; the order is a pure function of (seed, epoch).

Notation: B batch, S source length, T target length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from tformer.errors import ConfigError

Example = tuple["list[int] | Tensor", list[int]]  # (source ids, or frames (S, F); target ids), no specials


def model_lengths(examples: Sequence[Example], frame_skip: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Source + </s> (frames: ceil(S / frame_skip), what the frame encoder keeps), <s> + target: the lengths
    the model sees (int64 arrays). Examples that know their lengths (a prepared corpus) say them without
    being read."""
    known = getattr(examples, "model_lengths", None)
    if known is not None:
        return known(frame_skip)
    src = [-(-len(s) // frame_skip) if isinstance(s, Tensor) else len(s) + 1 for s, _ in examples]
    return np.asarray(src, dtype=np.int64), np.asarray([len(t) + 1 for _, t in examples], dtype=np.int64)


class BatchPlan:
    """Token-budget batches of a fixed set of lengths, for any (seed, epoch).

    Examples are ordered by (source, target) length and packed greedily so that sentences x max(S, T) <=
    max_tokens (and at most `max_sentences` sentences). The packing depends on the lengths alone, so it is
    computed once; an epoch shuffles the examples within each (source, target) length bucket and then the
    batches, with a generator seeded by (seed, epoch). Memory: a few bytes per example (numpy, no Python
    objects per example), so a corpus of millions of pairs plans in a second or two.
    """

    def __init__(self, src_lens: Sequence[int] | np.ndarray, tgt_lens: Sequence[int] | np.ndarray, max_tokens: int,
                 max_sentences: int = 0) -> None:
        src = np.asarray(src_lens, dtype=np.int32)  # int32 throughout: a few bytes per example, also transiently
        tgt = np.asarray(tgt_lens, dtype=np.int32)
        size = np.maximum(src, tgt)
        over = np.flatnonzero(size > max_tokens)
        if over.size:
            i = int(over[0])
            raise ConfigError(
                f"example {i} has {int(size[i])} tokens (with <s>/</s>), more than train.max_tokens={max_tokens}; "
                "raise train.max_tokens or drop over-long examples"
            )
        self.order = np.lexsort((tgt, src)).astype(index_dtype(len(src)))  # stable
        src, tgt, size = src[self.order], tgt[self.order], size[self.order]  # in that order from here on
        changes = (src[1:] != src[:-1]) | (tgt[1:] != tgt[:-1])
        self.buckets = np.flatnonzero(changes) + 1  # starts of equal-(S, T) runs, the first excepted
        del src, tgt, changes
        self.bounds = _pack(size, max_tokens, max_sentences)  # batch ends in `order`

    def __len__(self) -> int:
        return len(self.bounds)

    def epoch(self, seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[np.ndarray]:
        """The batches of one epoch: arrays of example indices (views into one array)."""
        order = self.order
        if not len(order):
            return []
        if shuffle:
            rng = np.random.default_rng([seed, epoch])
            order = order.copy()
            start = 0
            for end in (*self.buckets.tolist(), len(order)):
                if end - start > 1:
                    rng.shuffle(order[start:end])
                start = end
        batches = np.split(order, self.bounds[:-1])
        if shuffle:
            batches = [batches[j] for j in rng.permutation(len(batches))]
        return batches


def index_dtype(n: int) -> type:
    """The smallest numpy integer type that indexes `n` examples (positions 0 .. n-1): int32 up to 2**31."""
    return np.int32 if n <= 2**31 else np.int64


def _pack(sizes: np.ndarray, max_tokens: int, max_sentences: int) -> np.ndarray:
    """Greedy packing of `sizes` in their order: a batch takes examples while its count times its longest
    stays within `max_tokens`. Vectorised per batch over a window that doubles until the batch closes."""
    n, ends, p, window = len(sizes), [], 0, 64
    while p < n:
        while True:
            seg = sizes[p : p + window]
            fits = np.maximum.accumulate(seg) * np.arange(1, len(seg) + 1) <= max_tokens  # a prefix of trues
            if max_sentences:
                fits[max_sentences:] = False
            k = len(seg) if fits.all() else int(fits.argmin())
            if k < len(seg) or p + window >= n:
                break
            window *= 2
        p += k
        ends.append(p)
        window = max(64, 2 * k)
    return np.asarray(ends, dtype=np.int64)


def token_budget_batches(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    max_tokens: int,
    max_sentences: int = 0,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Indices grouped into batches of similar length with sentences x max(S, T) <= max_tokens (see
    `BatchPlan`, which a trainer keeps across epochs), as lists."""
    return [b.tolist() for b in BatchPlan(src_lens, tgt_lens, max_tokens, max_sentences).epoch(seed, epoch, shuffle)]


@dataclass
class Batch:
    src: Tensor  # (B, S) ids + </s>, padded; or (B, S, F) float frames
    src_lengths: Tensor  # (B,)
    tgt_in: Tensor  # (B, T) <s> + ids, padded
    tgt_out: Tensor  # (B, T) ids + </s>, padded
    tgt_lengths: Tensor  # (B,)
    indices: list[int]  # positions of these examples in their split

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_lengths.sum())

    @property
    def n_tgt_tokens(self) -> int:
        return int(self.tgt_lengths.sum())

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.src.to(device), self.src_lengths.to(device), self.tgt_in.to(device),
                     self.tgt_out.to(device), self.tgt_lengths.to(device), self.indices)


def pad_sequences(seqs: Sequence[Sequence[int]], pad: int, first: int | None = None, last: int | None = None
                  ) -> tuple[Tensor, list[int]]:
    """(B, L) long tensor of `seqs` (lists or 1-D arrays), each with `first` before it and `last` after it
    when given, padded with `pad`; and the lengths."""
    start = int(first is not None)
    lengths = [len(s) + start + int(last is not None) for s in seqs]
    out = np.full((len(seqs), max(lengths)), pad, dtype=np.int64)  # (B, L)
    for row, s in enumerate(seqs):
        if first is not None:
            out[row, 0] = first
        out[row, start : start + len(s)] = s
        if last is not None:
            out[row, start + len(s)] = last
    return torch.from_numpy(out), lengths


def pad_frames(frames: list[Tensor]) -> Tensor:
    """(S_i, F) each -> (B, S, F), zeros past each utterance."""
    out = frames[0].new_zeros(len(frames), max(f.shape[0] for f in frames), frames[0].shape[1])
    for row, f in enumerate(frames):
        out[row, : f.shape[0]] = f
    return out


def collate(examples: Sequence[Example], indices: Sequence[int], pad: int, bos: int, eos: int) -> Batch:
    """Padded tensors; token sources get </s>, frame sources are padded with zeros (their lengths count
    input frames: the model's front end stacks them)."""
    if isinstance(examples[0][0], Tensor):
        src_t, src_lengths = pad_frames([s for s, _ in examples]), [s.shape[0] for s, _ in examples]
    else:
        src_t, src_lengths = pad_sequences([s for s, _ in examples], pad, last=eos)
    tgt_in, tgt_lengths = pad_sequences([t for _, t in examples], pad, first=bos)
    tgt_out, _ = pad_sequences([t for _, t in examples], pad, last=eos)
    return Batch(
        src=src_t,
        src_lengths=torch.tensor(src_lengths),
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        tgt_lengths=torch.tensor(tgt_lengths),
        indices=[int(i) for i in indices],
    )
