"""What a side reads before its first layer: token embeddings or stacked continuous frames, and positions.

    Embeddings       token ids -> tokens x sqrt(D) (+ absolute positions), dropout
    FrameEmbeddings  float frames (B, S, F) -> normalised (CMVN), stacked or convolved, projected,
                     LayerNorm'd (+ positions), dropout

Both add absolute positions once (a stack of layers), or leave them to the encoder/decoder (`add_positions`
False: the universal transformer adds them at every step, with its time signal). TUPE has no absolute
positions here at all: its positions are an attention bias (tformer.positions).
Notation: B batch, L length, D model dim, F feature dim.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.data.vocab import Vocab
from tformer.dropout import Dropout


class Embedded(NamedTuple):
    x: Tensor  # (..., D) what the first layer reads
    positions: Tensor | None  # (..., D) position vectors left for the stack to add (None: added, or TUPE)


class Span(NamedTuple):
    """Positions start .. stop - 1, the same in every sentence of a padded batch. A slice would do, but
    torch.compile fixes a slice's bounds in the compiled graph (train.compile would recompile for every
    length); a tuple's stay symbolic."""

    start: int
    stop: int


def position_vectors(module: nn.Module | None, positions: Tensor | Span) -> Tensor | None:
    """The vectors of `positions`: a Span (L, D), broadcast over a padded batch, or an index tensor
    (...) -> (..., D) (packed tokens, each at its own position). None without a position module."""
    if module is None:
        return None
    if isinstance(positions, Span):
        return module(positions.stop - positions.start, positions.start)
    return module.at(positions)


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(D) (unless `scale` is False) plus absolute positions (none with TUPE),
    then `norm` (mBART's layernorm_embedding; None: none), then dropout. The decoder's start, <s>, reads row
    `start_row` (model.start_row: an imported M2M-100 starts from </s>, one row for both, as it was trained)."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Module | None, dropout: float,
                 add_positions: bool = True, scale: bool = True, norm: nn.Module | None = None,
                 start_row: int = Vocab.bos) -> None:
        super().__init__()
        self.tokens, self.positions, self.start_row = tokens, positions, start_row
        self.scale = math.sqrt(tokens.embedding_dim) if scale else 1.0
        self.dropout = Dropout(dropout)
        self.add_positions = add_positions
        self.norm = norm if norm is not None else nn.Identity()

    def forward(self, ids: Tensor, positions: Tensor | Span | None = None) -> Embedded:
        """ids (...) and their positions in their sentences (see `position_vectors`; None: 0 .. L-1 along the
        last dim of ids (B, L)) -> (..., D)."""
        if self.start_row != Vocab.bos:
            ids = ids.masked_fill(ids == Vocab.bos, self.start_row)
        x = self.tokens(ids) * self.scale
        positions = Span(0, ids.shape[-1]) if positions is None else positions
        pos = position_vectors(self.positions, positions)
        if pos is not None and self.add_positions:
            return Embedded(self.dropout(self.norm(x + pos)), None)
        return Embedded(self.dropout(self.norm(x)), pos)


def stack_frames(frames: Tensor, counts: Tensor, stack: int, skip: int) -> tuple[Tensor, Tensor]:
    """Low frame rate input: model frame i concatenates input frames i*skip .. i*skip + stack - 1 of its
    utterance, repeating the utterance's last real frame past its end (never the padding), so S' =
    ceil(S / skip) frames per utterance. frames (B, S, F), counts (B,) -> ((B, S', stack * F), counts' (B,))."""
    B, S, F = frames.shape
    new_counts = torch.div(counts + skip - 1, skip, rounding_mode="floor")  # (B,) ceil(counts / skip)
    n = -(-S // skip)
    index = torch.arange(n, device=frames.device)[:, None] * skip + torch.arange(stack, device=frames.device)
    index = torch.minimum(index[None], (counts - 1).clamp(min=0)[:, None, None])  # (B, S', stack)
    out = frames.gather(1, index.reshape(B, -1, 1).expand(-1, -1, F))  # (B, S' * stack, F)
    return out.reshape(B, n, stack * F), new_counts


class ConvSubsampler(nn.Module):
    """Two 3x3 convolutions of stride 2 over (time, frequency), each followed by ReLU, then a projection to D:
    (B, S, F) -> (B, ceil(ceil(S / 2) / 2), D), the common x4 front end (ESPnet, WeNet). Frames past an
    utterance's end are zeroed before each convolution, so an utterance gives the same output in any batch."""

    def __init__(self, feature_dim: int, channels: int, d_model: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        freq = -(-(-(-feature_dim // 2)) // 2)  # ceil twice
        self.proj = nn.Linear(channels * freq, d_model)

    @staticmethod
    def _keep(x: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, C, S, F) with the frames at and past counts (B,) zeroed."""
        real = torch.arange(x.shape[2], device=x.device)[None] < counts[:, None]  # (B, S)
        return x * real[:, None, :, None].to(x.dtype), counts

    def forward(self, frames: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        x, counts = self._keep(frames[:, None], counts)  # (B, 1, S, F)
        x = torch.relu(self.conv1(x))
        x, counts = self._keep(x, torch.div(counts + 1, 2, rounding_mode="floor"))
        x = torch.relu(self.conv2(x))
        counts = torch.div(counts + 1, 2, rounding_mode="floor")
        B, C, S, F = x.shape
        return self.proj(x.transpose(1, 2).reshape(B, S, C * F)), counts  # (B, S', D)


class FrameEmbeddings(nn.Module):
    """The encoder's front end for continuous features: frames (B, S, F) are normalised by the training set's
    statistics (model.cmvn), reduced in rate by stacking (stack_frames) or by convolutions (ConvSubsampler),
    projected to D, LayerNorm'd, given absolute positions (none with TUPE) and dropped out."""

    def __init__(self, cfg: ModelConfig, positions: nn.Module | None, add_positions: bool = True) -> None:
        super().__init__()
        self.feature_dim, self.stack, self.skip = cfg.feature_dim, cfg.frame_stack, cfg.frame_skip
        if cfg.frontend == "conv":
            self.conv: ConvSubsampler | None = ConvSubsampler(cfg.feature_dim, cfg.conv_channels, cfg.d_model)
        else:
            self.conv = None
            self.proj = nn.Linear(cfg.frame_stack * cfg.feature_dim, cfg.d_model)
        if cfg.cmvn:  # set from the training corpus (set_cmvn) and saved with the weights
            self.register_buffer("cmvn_mean", torch.zeros(cfg.feature_dim))
            self.register_buffer("cmvn_scale", torch.ones(cfg.feature_dim))  # 1 / std
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.positions = positions
        self.dropout = Dropout(cfg.dropout)
        self.add_positions = add_positions

    @property
    def has_cmvn(self) -> bool:
        return hasattr(self, "cmvn_mean")

    @torch.no_grad()
    def set_cmvn(self, mean: Tensor, std: Tensor) -> None:
        """The training frames' mean and standard deviation per value (F,); std is floored at 1e-5."""
        if not self.has_cmvn:
            raise ValueError("this model was built without model.cmvn")
        self.cmvn_mean.copy_(mean)
        self.cmvn_scale.copy_(1.0 / std.clamp(min=1e-5))

    @property
    def weight_dtype(self) -> torch.dtype:
        """The format the model's weights are held in (float32; bf16/fp16 when loaded so for decoding)."""
        return next(self.parameters()).dtype

    def normalise(self, frames: Tensor) -> Tensor:
        """(..., F) -> (..., F): global CMVN when the model has it, else the frames as they are."""
        if not self.has_cmvn:
            return frames
        return (frames - self.cmvn_mean) * self.cmvn_scale

    def frames(self, frames: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """frames (B, S, F) float, counts (B,) real frames -> projected (B, S', D), counts' (B,) model frames."""
        if frames.dim() != 3 or frames.shape[-1] != self.feature_dim or not frames.is_floating_point():
            raise ValueError(f"the frame encoder reads float frames (batch, frames, {self.feature_dim}); got "
                             f"{tuple(frames.shape)} {frames.dtype} (model.feature_dim={self.feature_dim})")
        frames = self.normalise(frames.to(self.weight_dtype))  # the input's float frames in the model's format
        if self.conv is not None:
            x, counts = self.conv(frames, counts)
            return self.norm(x), counts
        x, counts = stack_frames(frames, counts, self.stack, self.skip)
        return self.norm(self.proj(x)), counts  # (B, S', D)

    def forward(self, x: Tensor, positions: Tensor | Span) -> Embedded:
        """Projected frames from `frames` (..., D) at their positions -> (..., D)."""
        pos = position_vectors(self.positions, positions)
        if pos is not None and self.add_positions:
            return Embedded(self.dropout(self.norm(x + pos)), None)
        return Embedded(self.dropout(self.norm(x)), pos)
