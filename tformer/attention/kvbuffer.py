"""A decoder's self-attention key/value cache in memory allocated ahead (what a decoding step appends to).

Notation: N hypotheses, H heads, Dh head dim, t positions decoded.
"""

from __future__ import annotations

import torch
from torch import Tensor

KV = tuple[Tensor, Tensor]


class KVBuffer:
    """One layer's self-attention keys and values of the positions decoded so far, per hypothesis, in memory
    allocated ahead: a step writes its position in place (no concatenation), and a reorder gathers rows into a
    second buffer (the two take turns), so decoding allocates nothing per step. Time-major, (capacity, 2, N, H,
    Dh): positions 0 .. t-1 are one contiguous block, which a reorder gathers in one call; `keys`/`values` are
    (N, H, t, Dh) views of it. The capacity doubles when a step needs more.

    It is mutable: after `append` or `reorder` only the returned views and this object are current."""

    def __init__(self, like: Tensor, capacity: int = 16) -> None:
        self._like = like  # dtype and device
        self.t, self.rows, self.heads, self.head_dim = 0, 0, 0, 0
        self._capacity = capacity
        self._stores: list[Tensor] = []  # two flat tensors, the current one first
        self._buffer: Tensor | None = None  # (capacity, 2, N, H, Dh): the current store's view, made when it changes

    def _view(self, store: Tensor, capacity: int, rows: int) -> Tensor:
        return store[: capacity * 2 * rows * self.heads * self.head_dim].view(capacity, 2, rows, self.heads,
                                                                              self.head_dim)

    def _store(self, i: int, numel: int) -> Tensor:
        while len(self._stores) <= i:
            self._stores.append(self._like.new_empty(0))
        if self._stores[i].numel() < numel:
            self._stores[i] = self._like.new_empty(numel)
        return self._stores[i]

    @property
    def data(self) -> Tensor:
        """(t, 2, N, H, Dh): the positions decoded."""
        return self._buffer[: self.t]

    @property
    def keys(self) -> Tensor:
        return self._buffer[: self.t, 0].permute(1, 2, 0, 3)  # (N, H, t, Dh)

    @property
    def values(self) -> Tensor:
        return self._buffer[: self.t, 1].permute(1, 2, 0, 3)

    def __iter__(self):  # k, v = buffer
        return iter((self.keys, self.values))

    def append(self, k: Tensor, v: Tensor) -> KV:
        """k, v (N, H, 1, Dh) of the new position -> the keys and values of every position, (N, H, t+1, Dh)."""
        if self._buffer is None:
            N, H, _, Dh = k.shape
            self.rows, self.heads, self.head_dim = N, H, Dh
            self._buffer = self._view(self._store(0, self._capacity * 2 * N * H * Dh), self._capacity, N)
        elif self.t == self._capacity:  # full: double it, keeping what is there
            old, N = self.data, self.rows
            self._capacity *= 2
            self._stores.reverse()
            self._buffer = self._view(self._store(0, self._capacity * 2 * N * self.heads * self.head_dim),
                                      self._capacity, N)
            self._buffer[: self.t] = old
        position = self._buffer[self.t]  # (2, N, H, Dh)
        position[0].copy_(k.squeeze(2))
        position[1].copy_(v.squeeze(2))
        self.t += 1
        return self.keys, self.values

    def reorder(self, rows: Tensor) -> "KVBuffer":
        """Keep, reorder or repeat hypotheses: row i becomes old row rows[i]."""
        if self._buffer is not None:
            n, width, old = rows.shape[0], self.heads * self.head_dim, self.rows
            target = self._store(1, self._capacity * 2 * n * width)
            # one gather along the first dimension (the fast one) of the (t * 2 * N, H * Dh) rows
            index = (torch.arange(self.t * 2, device=rows.device)[:, None] * old + rows).reshape(-1)
            source = self._stores[0][: self.t * 2 * old * width].view(-1, width)
            torch.index_select(source, 0, index, out=target[: self.t * 2 * n * width].view(-1, width))
            self._stores.reverse()
            self.rows = n
            self._buffer = self._view(self._stores[0], self._capacity, n)
        return self
