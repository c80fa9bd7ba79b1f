"""Absolute positions: sinusoidal (the paper) and learned (a table).

Both map positions (L,) to vectors (L, D) that the model adds to the scaled token embeddings.
Sinusoidal positions extend to any length (the table grows on demand); a learned table stops at
`max_positions`, and a longer sequence is an error that says so. Notation: L length, D model dim.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(length: int, d_model: int) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D)); (L, D) float32."""
    position = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div[: d_model // 2])
    return table.float()  # (L, D)


class SinusoidalPositions(nn.Module):
    def __init__(self, d_model: int, initial_length: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(initial_length, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        end = offset + length
        if end > self.table.shape[0]:  # grow (doubling) rather than fail: sinusoids have no limit
            self.table = sinusoidal_table(max(end, 2 * self.table.shape[0]), self.d_model).to(self.table.device)
        return self.table[offset:end]  # (L, D)

    def at(self, positions: Tensor) -> Tensor:
        """positions (N,) -> (N, D): packed tokens, each at its own position."""
        self.forward(int(positions.max()) + 1 if positions.numel() else 0)  # grows the table if needed
        return self.table[positions]


class LearnedPositions(nn.Module):
    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.max_positions:
            raise ValueError(
                f"sequence of {offset + length} positions is longer than the learned position table "
                f"(model.max_positions={self.max_positions}); shorten the input or use sinusoidal positions"
            )
        return self.table.weight[offset : offset + length]  # (L, D)

    def at(self, positions: Tensor) -> Tensor:
        """positions (N,) -> (N, D): packed tokens, each at its own position."""
        if positions.numel():
            self.forward(int(positions.max()) + 1)  # the length check
        return self.table(positions)


def build_positions(kind: str, d_model: int, max_positions: int) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model)
    if kind == "learned":
        return LearnedPositions(d_model, max_positions)
    raise ValueError(f"unknown positions '{kind}'; choose sinusoidal or learned")
