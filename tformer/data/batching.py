"""Token-budget batching with length bucketing, and collation into padded tensors.

A batch's size is what the model computes on: sentences x longest side, padded, with the source's </s>
and the target's <s> counted. No batch exceeds `max_tokens`; every example appears in exactly one batch per
epoch; the order is a pure function of (seed, epoch).

Notation: B batch, S source length, T target length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.errors import ConfigError

Example = tuple["list[int] | Tensor", list[int]]  # (source ids, or frames (S, F); target ids), no specials


def model_lengths(examples: list[Example], frame_skip: int = 1) -> tuple[list[int], list[int]]:
    """Source + </s> (frames: ceil(S / frame_skip), what the frame encoder keeps), <s> + target: the lengths
    the model sees."""
    src = [-(-len(s) // frame_skip) if isinstance(s, Tensor) else len(s) + 1 for s, _ in examples]
    return src, [len(t) + 1 for _, t in examples]


def token_budget_batches(
    src_lens: list[int],
    tgt_lens: list[int],
    max_tokens: int,
    max_sentences: int = 0,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Indices grouped into batches of similar length with sentences x max(S, T) <= max_tokens.

    Examples are ordered by (source, target) length, ties broken by a seeded permutation, packed greedily,
    and the batches themselves shuffled by the same (seed, epoch) generator.
    """
    n = len(src_lens)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    order.sort(key=lambda i: (src_lens[i], tgt_lens[i]))  # stable: equal lengths keep the random order
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i])
        if size > max_tokens:
            raise ConfigError(
                f"example {i} has {size} tokens (with <s>/</s>), more than train.max_tokens={max_tokens}; "
                "raise train.max_tokens or drop over-long examples"
            )
        full = max(longest, size) * (len(current) + 1) > max_tokens
        if current and (full or (max_sentences and len(current) >= max_sentences)):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=g).tolist()]
    return batches


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


def pad_sequences(seqs: list[list[int]], pad: int) -> Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)  # (B, L)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def pad_frames(frames: list[Tensor]) -> Tensor:
    """(S_i, F) each -> (B, S, F), zeros past each utterance."""
    out = frames[0].new_zeros(len(frames), max(f.shape[0] for f in frames), frames[0].shape[1])
    for row, f in enumerate(frames):
        out[row, : f.shape[0]] = f
    return out


def collate(examples: list[Example], indices: list[int], pad: int, bos: int, eos: int) -> Batch:
    """Padded tensors; token sources get </s>, frame sources are padded with zeros (their lengths count
    input frames: the model's front end stacks them)."""
    if isinstance(examples[0][0], Tensor):
        src_t, src_lengths = pad_frames([s for s, _ in examples]), [s.shape[0] for s, _ in examples]
    else:
        src = [s + [eos] for s, _ in examples]
        src_t, src_lengths = pad_sequences(src, pad), [len(s) for s in src]
    tgt_in = [[bos] + t for _, t in examples]
    tgt_out = [t + [eos] for _, t in examples]
    return Batch(
        src=src_t,
        src_lengths=torch.tensor(src_lengths),
        tgt_in=pad_sequences(tgt_in, pad),
        tgt_out=pad_sequences(tgt_out, pad),
        tgt_lengths=torch.tensor([len(t) for t in tgt_in]),
        indices=list(indices),
    )
