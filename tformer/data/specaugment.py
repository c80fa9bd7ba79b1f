"""SpecAugment (Park et al. 2019), without time warping: frequency and time masks on training frames.

Each utterance gets `freq_masks` bands of f ~ U{0 .. freq_mask_width} consecutive values starting at
f0 ~ U{0 .. F - f}, and `time_masks` spans of t ~ U{0 .. min(time_mask_width, time_mask_ratio x S)} frames
starting at t0 ~ U{0 .. S - t}, where S is the utterance's own length (padding is never masked and never
counted). Masked values are set to `fill`, the training mean per value, so that after the model's CMVN they
are zero, as in the paper's masks on normalised features. The draws come from a generator seeded by the key
(seed, update, rank, micro-batch): a resumed run masks exactly as an uninterrupted one. Evaluation and
decoding never call this.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import torch
from torch import Tensor


class SpecAugment(NamedTuple):
    freq_masks: int = 2
    freq_mask_width: int = 27
    time_masks: int = 2
    time_mask_width: int = 40
    time_mask_ratio: float = 0.2

    @classmethod
    def from_config(cls, t) -> "SpecAugment | None":
        """From a TrainConfig; None when it masks nothing."""
        if not (t.freq_masks or t.time_masks):
            return None
        return cls(t.freq_masks, t.freq_mask_width, t.time_masks, t.time_mask_width, t.time_mask_ratio)

    def masks(self, counts: Tensor, n_frames: int, n_values: int, *key: int) -> Tensor:
        """(B, S, F) bool, True where a value is masked, for utterances of `counts` (B,) real frames."""
        g = torch.Generator().manual_seed(zlib.crc32(repr(("specaugment", *key)).encode()))
        cpu = torch.device("cpu")  # drawn on the CPU, where the generator is, whatever the default device
        B = counts.shape[0]
        counts = counts.cpu()
        time = torch.arange(n_frames, device=cpu)
        freq = torch.arange(n_values, device=cpu)
        out = torch.zeros(B, n_frames, n_values, dtype=torch.bool, device=cpu)
        for _ in range(self.freq_masks):
            width = torch.randint(self.freq_mask_width + 1, (B,), generator=g, device=cpu)  # (B,)
            start = (torch.rand(B, generator=g, device=cpu) * (n_values - width + 1)).floor().long()
            band = (freq[None] >= start[:, None]) & (freq[None] < (start + width)[:, None])  # (B, F)
            out |= band[:, None, :]
        for _ in range(self.time_masks):
            widest = torch.full((B,), self.time_mask_width, device=cpu)
            most = torch.minimum(widest, (self.time_mask_ratio * counts).floor().long())
            width = (torch.rand(B, generator=g, device=cpu) * (most + 1)).floor().long()
            start = (torch.rand(B, generator=g, device=cpu) * (counts - width + 1)).floor().long()
            span = (time[None] >= start[:, None]) & (time[None] < (start + width)[:, None])  # (B, S)
            out |= span[:, :, None]
        real = time[None] < counts[:, None]  # (B, S)
        return out & real[:, :, None]

    def __call__(self, frames: Tensor, counts: Tensor, *key: int, fill: Tensor | None = None) -> Tensor:
        """frames (B, S, F) with the masked values replaced by `fill` (F,) (default 0)."""
        B, S, F = frames.shape
        mask = self.masks(counts, S, F, *key).to(frames.device)
        fill = frames.new_zeros(F) if fill is None else fill.to(frames)
        return torch.where(mask, fill.expand_as(frames), frames)
