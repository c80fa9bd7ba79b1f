"""Positions: added to the embeddings (sinusoidal, learned) or added to the attention scores (TUPE).

    sinusoidal  the paper's PE table, added to the scaled token embeddings; computed for any position
    learned     a trained table of `model.max_positions` rows, added likewise
    tupe        TUPE-A (Ke, He and Liu 2021): embeddings carry no position; every self-attention score gets
                the bias (p_i U^Q)(p_j U^K)^T / sqrt(2 Dh) of its own projections U^Q, U^K of learned,
                LayerNorm'd position vectors p, computed once per forward and shared by all layers (the
                content scores are scaled by 1/sqrt(2 Dh) too); optionally the first token is untied
    tupe-r      TUPE-A plus a learned bias per head and bucket of relative distance (T5's buckets)
    relative    T5's relative bias alone (Raffel et al. 2020): a learned value per head and distance bucket, no
                absolute term anywhere, so nothing depends on where a sentence starts
    alibi       ALiBi (Press, Smith and Lewis 2022): no parameters; head h adds -m_h |i - j| to every score, with
                the paper's geometric slopes m_h (causal in the decoder, where later keys are masked anyway)
    none        no positions at all: a causal decoder can still infer them (Haviv et al. 2022); refused in an
                encoder, which would read a bag of tokens
    rotary      RoPE (Su et al. 2021): each head's queries and keys in self-attention are rotated by their
                positions (pairs of dimensions turned by p theta_i), so their dot product depends on the distance
                alone; the pairs interleaved (2i, 2i+1: RoFormer, GPT-J) or in halves (i, i + Dh/2: GPT-NeoX,
                Hugging Face's Llama)

How each extends past its table (speech frames run into thousands of positions):
    sinusoidal  exactly: the formula holds at every position (the cached table grows on demand)
    learned     positions >= max_positions reuse the last row (a warning says so once per table)
    tupe        the same for the absolute vectors p: past the table the position-position term is constant
    tupe-r      distances >= relative_max_distance share the last bucket by construction, so the relative
                term is defined at every length; the absolute term extends as for tupe
    relative    at every length, like tupe-r's relative term
    alibi       exactly: the penalty is a formula of the distance
    rotary      exactly: the angles are a formula of the position

Notation: L length, D model dim, H heads, Dh = D / H.
"""

from __future__ import annotations

import logging
import math
import zlib
from typing import NamedTuple

import torch
from torch import Tensor, nn

log = logging.getLogger("tformer")


SINUSOIDS = ("interleaved", "halves", "marian", "fairseq")


def sinusoidal_table(length: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The sinusoidal position table, (L, D) float32, computed in float64. With frequencies w_i (i < D/2):

        interleaved  the paper: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i), w_i = 10000^(-2i/D)
        halves       Hugging Face's MarianMT: the same w_i, sines in columns 0 .. D/2-1, cosines after them
        marian       Marian's C++ (and CTranslate2's Marian converter): sines then cosines like halves, but
                     w_i = 10000^(-i/(D/2-1)), the timescales of tensor2tensor (the last one is exactly 1/10000)
        fairseq      fairseq's (M2M-100, NLLB): marian's table, but position p reads its row p + 2 (fairseq
                     numbers positions from padding_idx + 1, and its padding index is 1)

    An imported model keeps the table it was trained with: the two Marian tables differ (an OPUS-MT model read
    from Marian's .npz uses `marian`, one converted to Hugging Face uses `halves`)."""
    if layout not in SINUSOIDS:
        raise ValueError(f"unknown sinusoid layout {layout!r}; choose one of {', '.join(SINUSOIDS)}")
    half = d_model // 2
    position = torch.arange(length, dtype=torch.float64)[:, None] + (2 if layout == "fairseq" else 0)  # (L, 1)
    i = torch.arange(half + d_model % 2, dtype=torch.float64)
    if layout in ("marian", "fairseq"):
        w = torch.exp(i * (-math.log(10000.0) / max(half - 1, 1)))
    else:
        w = torch.exp(2 * i * (-math.log(10000.0) / d_model))  # (ceil(D/2),)
    angle = position * w  # (L, ceil(D/2))
    if layout == "interleaved":
        table = torch.zeros(length, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle[:, :half])
    else:
        table = torch.cat([torch.sin(angle), torch.cos(angle[:, :half])], dim=1)
    return table.float()  # (L, D)


class SinusoidalPositions(nn.Module):
    def __init__(self, d_model: int, initial_length: int = 1024, layout: str = "interleaved") -> None:
        super().__init__()
        self.d_model, self.layout = d_model, layout
        self.register_buffer("table", sinusoidal_table(initial_length, d_model, layout), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        end = offset + length
        if end > self.table.shape[0]:  # grow (doubling) rather than fail: sinusoids have no limit
            grown = sinusoidal_table(max(end, 2 * self.table.shape[0]), self.d_model, self.layout)
            self.table = grown.to(self.table.device, self.table.dtype)  # a model in bf16 keeps its table's format
        return self.table[offset:end]  # (L, D)

    def at(self, positions: Tensor) -> Tensor:
        """positions (N,) -> (N, D): packed tokens, each at its own position."""
        self.forward(int(positions.max()) + 1 if positions.numel() else 0)  # grows the table if needed
        return self.table[positions]


class LearnedPositions(nn.Module):
    """A trained table; positions past it reuse its last row (warned once)."""

    def __init__(self, d_model: int, max_positions: int, skip: int = 0) -> None:
        super().__init__()
        self.max_positions, self.skip = max_positions, skip
        self.table = nn.Embedding(skip + max_positions, d_model)  # `skip` rows before position 0's, never read
        self.warned = False

    def forward(self, length: int, offset: int = 0) -> Tensor:
        return self.at(torch.arange(offset, offset + length, device=self.table.weight.device))  # (L, D)

    def at(self, positions: Tensor) -> Tensor:
        """positions (N,) -> (N, D)."""
        return self.table(clamp_positions(positions, self.max_positions, self) + self.skip)


def clamp_positions(positions: Tensor, size: int, owner: nn.Module) -> Tensor:
    """Positions past a table of `size` rows map to its last row; the first time, a warning says so."""
    if positions.numel() and int(positions.max()) >= size:
        if not owner.warned:
            owner.warned = True
            log.warning("a sequence of %d positions is longer than the learned position table "
                        "(model.max_positions=%d): later positions share its last row", int(positions.max()) + 1,
                        size)
        return positions.clamp(max=size - 1)
    return positions


def relative_bucket(relative: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """Relative position (key - query) -> bucket id, T5's scheme (Raffel et al. 2020), as TUPE-R uses it.

    Bidirectional: half the buckets for keys after the query (ids offset by buckets // 2), half for keys at
    or before it. Causal: all buckets for keys at or before the query (later keys are masked anyway; they
    share bucket 0). Within a direction of n buckets, distances below n // 2 get a bucket each; the rest are
    spread logarithmically up to `max_distance`, and every longer distance shares the last bucket."""
    n = buckets
    out = torch.zeros_like(relative)
    if bidirectional:
        n //= 2
        out = out + (relative > 0).long() * n
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n // 2
    far = exact + (torch.log(distance.double().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (n - exact)).long()
    return out + torch.where(distance < exact, distance, far.clamp(max=n - 1))


class RelativeBias(nn.Module):
    """One learned value per head and relative-distance bucket: (H, Lq, Lk) for given positions."""

    def __init__(self, n_heads: int, buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.buckets, self.max_distance, self.bidirectional = buckets, max_distance, bidirectional
        self.values = nn.Embedding(buckets, n_heads)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        bucket = relative_bucket(k_pos[None, :] - q_pos[:, None], self.bidirectional, self.buckets,
                                 self.max_distance)  # (Lq, Lk)
        return self.values(bucket).permute(2, 0, 1)  # (H, Lq, Lk)


class AttentionBias(nn.Module):
    """A positional bias on the self-attention scores, shared by all layers of one side (encoder or decoder).

        at(q_pos (Lq,), k_pos (Lk,)) -> (H, Lq, Lk)   the bias between queries and keys at these positions
        forward(Lq, Lk, q_offset)   -> (H, Lq, Lk)   queries at q_offset .. q_offset + Lq - 1, keys at 0 .. Lk - 1
                                                     (self-attention; a decoding step is one query at position t
                                                     against keys 0 .. t)
    """

    def at(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, n_queries: int, n_keys: int, q_offset: int = 0) -> Tensor:
        device = next(iter([*self.parameters(), *self.buffers()])).device
        return self.at(torch.arange(q_offset, q_offset + n_queries, device=device), torch.arange(n_keys, device=device))


class TupeBias(AttentionBias):
    """TUPE's positional attention bias.

        bias[h, i, j] = (LN(p_i) U^Q_h) . (LN(p_j) U^K_h) / sqrt(2 Dh)   (+ relative[h, bucket(j - i)])

    With `untie_first`, row 0 (the first token as a query) is replaced by a learned value per head and
    column 0 (every other token looking at the first one) by another: the paper's [CLS] reset, which frees
    the first token from positional correlations (the relative term is replaced too)."""

    def __init__(self, d_model: int, n_heads: int, max_positions: int, untie_first: bool = False,
                 relative: RelativeBias | None = None) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.first = nn.Parameter(torch.zeros(2, n_heads)) if untie_first else None  # row 0, column 0
        self.relative = relative
        self.scale = 1.0 / math.sqrt(2 * self.head_dim)
        self.warned = False

    def _heads(self, proj: nn.Linear, positions: Tensor) -> Tensor:
        p = self.norm(self.table(clamp_positions(positions, self.max_positions, self)))  # (L, D)
        return proj(p).view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, L, Dh)

    def at(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        bias = torch.matmul(self._heads(self.q_proj, q_pos), self._heads(self.k_proj, k_pos).transpose(1, 2))
        bias = bias * self.scale  # (H, Lq, Lk)
        if self.relative is not None:
            bias = bias + self.relative(q_pos, k_pos)
        if self.first is not None:
            row, col = self.first[0][:, None, None], self.first[1][:, None, None]  # (H, 1, 1)
            bias = torch.where(k_pos[None, None, :] == 0, col, bias)
            bias = torch.where(q_pos[None, :, None] == 0, row, bias)  # (H, Lq, Lk); [0, 0] is the row's
        return bias


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's slopes (Press et al. 2022, their code): for H a power of two, m_h = 2^(-8 (h + 1) / H), a geometric
    sequence from 2^(-8/H) down to 2^-8; otherwise the slopes of the power of two below H, then every other slope
    of twice that power until there are H. (H,) float32."""
    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    below = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(below) + power_of_two(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiBias(AttentionBias):
    """ALiBi: bias[h, i, j] = -m_h |p_i - p_j| for a query at p_i and a key at p_j. No weights: the slopes are a
    buffer, not saved (a checkpoint of an ALiBi model holds nothing for its positions)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def at(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (Lq, Lk)
        return -self.slopes[:, None, None] * distance  # (H, Lq, Lk)


class RelativeOnlyBias(AttentionBias):
    """T5's relative attention bias with no absolute term."""

    def __init__(self, relative: RelativeBias) -> None:
        super().__init__()
        self.relative = relative

    def at(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.relative(q_pos, k_pos)  # (H, Lq, Lk)


ROTARY_LAYOUTS = ("interleaved", "halves")


def rotary_angles(positions: Tensor, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of p theta_i for every position p (L,) and pair i < Dh/2, theta_i = base^(-2i/Dh): (L, Dh/2)
    each, computed in float64, returned in float32."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angle = positions.double()[:, None] * theta[None, :]  # (L, Dh/2)
    return torch.cos(angle).float(), torch.sin(angle).float()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """Turn each pair (a, b) of x's last dimension by its angle: (a cos - b sin, a sin + b cos). x (..., L, Dh),
    cos/sin (L, Dh/2). Pairs: (2i, 2i+1) interleaved, (i, i + Dh/2) in halves. Computed in cos's format (float32),
    returned in x's (a bf16 model's queries stay bf16)."""
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]  # (..., L, Dh/2)
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)  # (..., L, Dh)
    else:
        a, b = x.chunk(2, dim=-1)  # (..., L, Dh/2)
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (..., L, Dh)
    return out.to(x.dtype)


class Rotary(NamedTuple):
    """RoPE's angles for the rows of one attention call (their positions in their sentences), applied to its
    queries and to the keys of the same rows."""

    cos: Tensor  # (L, Dh/2)
    sin: Tensor  # (L, Dh/2)
    layout: str
    base: float = 10000.0

    @classmethod
    def build(cls, positions: Tensor, head_dim: int, base: float, layout: str) -> "Rotary":
        """The angles of positions (L,) for heads of head_dim dimensions."""
        return cls(*rotary_angles(positions, head_dim, base), layout, base)

    def __call__(self, x: Tensor) -> Tensor:
        return rotate(x, self.cos, self.sin, self.layout)  # (..., L, Dh)

    def select(self, rows: Tensor) -> "Rotary":
        """The angles of some of the rows (R,) (the positions an ACT step still runs)."""
        return self._replace(cos=self.cos[rows], sin=self.sin[rows])

    def at(self, positions: Tensor) -> "Rotary":
        """The same rotation at other positions (L',)."""
        return Rotary.build(positions.to(self.cos.device), 2 * self.cos.shape[-1], self.base, self.layout)


RANDOM_DRAWS = ("sorted", "shift")


class RandomPositions:
    """Randomised positions, a training-time option over any scheme: a batch's L slots get positions drawn from
    0 .. high-1, the same for every sentence of the batch and for both sides (source and target slot i share a
    position, as at inference, where both read 0 .. L-1). Two draws:

        sorted  L distinct positions drawn uniformly, sorted (Ruoss et al. 2023): short training sequences meet
                the positions and the distances of long ones. Their code draws at test time too; tformer decodes
                at 0 .. L-1 (deterministic, the same in any batch), which such a model has rarely seen
        shift   L consecutive positions from a uniform random start in 0 .. high-L (SHAPE, Kiyono et al. 2021):
                every absolute position up to high-1 is trained, with the distances of inference; the relative
                schemes (relative, alibi, rotary) cannot tell a shift apart, so it changes nothing for them

    Draws come from a generator seeded by `key` (the seed, the update, the process and the batch): the same on
    every run, and after a resume. A batch longer than `high` draws from 0 .. L-1."""

    def __init__(self, high: int, *key: int, draw: str = "sorted") -> None:
        if draw not in RANDOM_DRAWS:
            raise ValueError(f"unknown draw {draw!r}; choose one of {', '.join(RANDOM_DRAWS)}")
        self.high, self.draw = high, draw
        self.generator = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))

    def __call__(self, length: int, device: torch.device | str = "cpu") -> Tensor:
        """The positions (L,) of slots 0 .. L-1: increasing, each < max(high, L)."""
        high = max(self.high, length)
        if self.draw == "shift":
            start = int(torch.randint(high - length + 1, (1,), generator=self.generator))
            return torch.arange(start, start + length, device=device)
        return torch.randperm(high, generator=self.generator)[:length].sort().values.to(device)


TUPE = ("tupe", "tupe-r")
ADDED = ("sinusoidal", "learned")  # positions added to the embeddings
BIASES = (*TUPE, "relative", "alibi")  # positions added to the self-attention scores
SCHEMES = (*ADDED, *BIASES, "rotary", "none")


def build_positions(kind: str, d_model: int, max_positions: int, sinusoid: str = "interleaved",
                    skip: int = 0) -> nn.Module | None:
    """The module that adds positions to embeddings; None when positions enter as an attention bias, or not at
    all. `skip`: a learned table's unused first rows (model.position_offset)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model, layout=sinusoid)
    if kind == "learned":
        return LearnedPositions(d_model, max_positions, skip)
    if kind in (*BIASES, "rotary", "none"):
        return None
    raise ValueError(f"unknown positions '{kind}'; choose one of {', '.join(SCHEMES)}")


def build_attention_bias(kind: str, d_model: int, n_heads: int, max_positions: int, untie_first: bool,
                         buckets: int, max_distance: int, causal: bool) -> nn.Module | None:
    """The positional bias module of one side: forward(Lq, Lk, q_offset) -> (H, Lq, Lk); None for the schemes
    added to the embeddings, and for none."""
    if kind in TUPE:
        relative = RelativeBias(n_heads, buckets, max_distance, not causal) if kind == "tupe-r" else None
        return TupeBias(d_model, n_heads, max_positions, untie_first, relative)
    if kind == "relative":
        return RelativeOnlyBias(RelativeBias(n_heads, buckets, max_distance, not causal))
    if kind == "alibi":
        return ALiBiBias(n_heads)
    return None
