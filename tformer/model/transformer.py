"""The encoder-decoder Transformer ("Attention Is All You Need").

Notation: B batch, S source length, T target length, Ns / Nt real source / target tokens, D model dim,
H heads, Dh head dim, V vocabulary, E edges.

    encode(src, src_lengths)            -> EncoderOutput(memory (B, S, D) or packed (1, Ns, D), mask (B, S))
    forward(src, ..., tgt_in, ...)      -> ModelOutput; out.real() (Nt, D) real target positions,
                                           logits = generator(out.real())
    init_cache(encoder_output)          -> cache: dict of tensors, batch first (see decode_step)
    decode_step(tokens (B,), cache)     -> (logits (B, V), cache): one position, for tformer.decode

Positions are added to the embeddings (sinusoidal, learned) or, with TUPE, added to every self-attention's
scores as a bias computed once per forward (`src_bias`, `tgt_bias`; tformer.positions). The encoder reads
token ids, or float frames (B, S, F) with `model.source: features` (FrameEmbeddings).

Two layouts, one set of parameters. With `model.attention: dense | sdpa` sentences are padded to (B, L) and
structures are boolean masks. With `model.attention: graph` the batch is packed: all real tokens of the
batch in one row (1, N, D), no padding anywhere, and every attention is message passing over a graph
(tformer.masks.Graph): source tokens fully connected, target tokens causally connected, every source token
of a sentence to every target token of that sentence (the DGL seed's three graphs), or the sparse
structures of `model.encoder_structure` / `model.decoder_structure`. Callers pass padded tensors in both
layouts; packing is an index on token ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.dropout import Dropout
from tformer.errors import ConfigError
from tformer.masks import (Graph, PositionBias, Segments, bipartite_graph, decoder_mask, encoder_mask,
                           packed_positions, padding_mask, self_graph)
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.positions import TupeBias, build_attention_bias, build_positions
from tformer.structures import Structure, build_structure

if TYPE_CHECKING:
    from tformer.model.universal import Ponder


@dataclass
class Attentions:
    """Attention weights per layer, returned when asked for: (B, H, queries, keys) each in the padded layout;
    (E, H), one row per edge of `graphs[kind]`, in the packed layout (see `tformer.masks.Graph.dense`)."""

    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)
    graphs: dict[str, Graph] = field(default_factory=dict)  # "encoder", "decoder", "cross" (packed layout)


class EncoderOutput(NamedTuple):
    memory: Tensor  # (B, S, D), or (1, Ns, D) when packed
    mask: Tensor  # (B, S) bool, True at real tokens
    attentions: list[Tensor] | None = None
    graph: Graph | None = None  # the encoder's self-attention graph (packed layout)
    ponder: "Ponder | None" = None  # ACT statistics per source position (universal transformer)

    @property
    def packed(self) -> bool:
        return self.graph is not None


class ModelOutput(NamedTuple):
    hidden: Tensor  # (B, T, D) decoder output before the generator, or (1, Nt, D) when packed
    mask: Tensor  # (B, T) bool, True at real target positions
    attentions: Attentions | None = None
    packed: bool = False
    ponder: "tuple[Ponder, Ponder] | None" = None  # ACT statistics, (source, target) (universal transformer)

    def real(self) -> Tensor:
        """(Nt, D): the real target positions, sentence after sentence (what the loss reads)."""
        return self.hidden[0] if self.packed else self.hidden[self.mask]

    def padded(self) -> Tensor:
        """(B, T, D), zeros at padding."""
        if not self.packed:
            return self.hidden
        out = self.hidden.new_zeros(*self.mask.shape, self.hidden.shape[-1])
        out[self.mask] = self.hidden[0]
        return out


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(D) plus absolute positions (none with TUPE), then dropout."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Module | None, dropout: float) -> None:
        super().__init__()
        self.tokens, self.positions = tokens, positions
        self.scale = math.sqrt(tokens.embedding_dim)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale  # (B, L, D)
        if self.positions is not None:
            x = x + self.positions(ids.shape[1], offset)
        return self.dropout(x)  # (B, L, D)

    def packed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids (N,) and their positions in their sentences (N,) -> (1, N, D)."""
        x = self.tokens(ids) * self.scale  # (N, D)
        if self.positions is not None:
            x = x + self.positions.at(positions)
        return self.dropout(x)[None]


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


class FrameEmbeddings(nn.Module):
    """The encoder's front end for continuous features: frames (B, S, F) are stacked (stack_frames), projected
    to D, LayerNorm'd, given absolute positions (none with TUPE) and dropped out."""

    def __init__(self, cfg: ModelConfig, positions: nn.Module | None) -> None:
        super().__init__()
        self.feature_dim, self.stack, self.skip = cfg.feature_dim, cfg.frame_stack, cfg.frame_skip
        self.proj = nn.Linear(cfg.frame_stack * cfg.feature_dim, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.positions = positions
        self.dropout = Dropout(cfg.dropout)

    def forward(self, frames: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """frames (B, S, F) float, counts (B,) real frames -> (B, S', D), counts' (B,) model frames."""
        if frames.dim() != 3 or frames.shape[-1] != self.feature_dim or not frames.is_floating_point():
            raise ValueError(f"the frame encoder reads float frames (batch, frames, {self.feature_dim}); got "
                             f"{tuple(frames.shape)} {frames.dtype} (model.feature_dim={self.feature_dim})")
        x, counts = stack_frames(frames, counts, self.stack, self.skip)
        x = self.norm(self.proj(x))  # (B, S', D)
        if self.positions is not None:
            x = x + self.positions(x.shape[1])
        return self.dropout(x), counts


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab != tgt_vocab:
            raise ConfigError(
                f"model.share_embeddings needs one joint vocabulary, but the source has {src_vocab} "
                f"entries and the target {tgt_vocab}"
            )
        self.cfg = cfg
        D = cfg.d_model
        enc_kind, dec_kind = cfg.side_positions("encoder"), cfg.side_positions("decoder")
        positions = build_positions(enc_kind, D, cfg.max_positions)  # no weights when sinusoidal
        shared = enc_kind == dec_kind == "sinusoidal"
        tgt_positions = positions if shared else build_positions(dec_kind, D, cfg.max_positions)
        tgt_tokens = nn.Embedding(tgt_vocab, D)
        if cfg.source == "features":  # src_vocab is unused: frames are projected, not looked up
            self.src_embed: Embeddings | FrameEmbeddings = FrameEmbeddings(cfg, positions)
        else:
            src_tokens = tgt_tokens if cfg.share_embeddings else nn.Embedding(src_vocab, D)
            self.src_embed = Embeddings(src_tokens, positions, cfg.dropout)
        self.tgt_embed = Embeddings(tgt_tokens, tgt_positions, cfg.dropout)
        bias = dict(d_model=D, n_heads=cfg.n_heads, max_positions=cfg.max_positions, untie_first=cfg.untie_first,
                    buckets=cfg.relative_buckets, max_distance=cfg.relative_max_distance)
        self.src_bias = build_attention_bias(enc_kind, causal=False, **bias)  # TUPE, else None
        self.tgt_bias = build_attention_bias(dec_kind, causal=True, **bias)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(D, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(D, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.generator = nn.Linear(D, tgt_vocab)
        self.encoder_structure = build_structure(cfg.encoder_structure)
        self.decoder_structure = build_structure(cfg.decoder_structure)
        self.reset_parameters()
        if cfg.tie_generator:
            self.generator.weight = tgt_tokens.weight

    def reset_parameters(self) -> None:
        """Xavier/Glorot uniform for every matrix (the paper's code); LayerNorm 1/0, biases 0."""
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    # ------------------------------------------------------------------ encoder

    @property
    def packed(self) -> bool:
        """True when attention runs on graphs over packed tokens (model.attention: graph)."""
        return self.cfg.attention == "graph"

    def position_bias(self, module: TupeBias | None, n_queries: int, n_keys: int, q_offset: int = 0
                      ) -> Tensor | PositionBias | None:
        """TUPE's self-attention bias for this layout, computed once per forward: (1, H, Lq, Lk) padded, a
        PositionBias over sentence positions packed; None without TUPE."""
        if module is None:
            return None
        table = module(n_queries, n_keys, q_offset)  # (H, Lq, Lk)
        return PositionBias(table) if self.packed else table[None]

    def encode(self, src: Tensor, src_lengths: Tensor, need_weights: bool = False) -> EncoderOutput:
        """src (B, S) token ids, or (B, S, F) float frames; src_lengths (B,) -> memory (B, S, D) (S' model
        frames for features), or (1, Ns, D) packed."""
        frames = None
        if isinstance(self.src_embed, FrameEmbeddings):
            frames, src_lengths = self.src_embed(src, src_lengths)  # (B, S', D), model frames per utterance
        S = src.shape[1] if frames is None else frames.shape[1]
        src_mask = padding_mask(src_lengths, S)  # (B, S)
        if self.packed:
            mask = self_graph(src_lengths, self.encoder_structure, causal=False)  # Ns nodes
            if frames is None:
                x = self.src_embed.packed(src[src_mask], packed_positions(src_lengths))  # (1, Ns, D)
            else:
                x = frames[src_mask][None]  # (1, Ns, D)
            bias = self.position_bias(self.src_bias, int(src_lengths.max()), int(src_lengths.max()))
        else:
            mask = encoder_mask(src_mask)  # (B, 1, 1, S)
            if not self.encoder_structure.is_full:
                mask = structured(mask, self.encoder_structure.mask(S).to(src.device), src_mask)
            x = self.src_embed(src) if frames is None else frames  # (B, S, D)
            bias = self.position_bias(self.src_bias, S, S)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, mask, bias=bias, need_weights=need_weights)  # (B, S, D) or (1, Ns, D)
            weights.append(w)
        return EncoderOutput(self.encoder_norm(x), src_mask, weights if need_weights else None,
                             mask if self.packed else None)

    # ------------------------------------------------------------------ decoder, teacher forced

    def decode(self, tgt_in: Tensor, tgt_lengths: Tensor, enc: EncoderOutput,
               need_weights: bool = False) -> ModelOutput:
        """tgt_in (B, T) = BOS + target, all positions at once -> hidden (B, T, D), or (1, Nt, D) packed."""
        tgt_mask = padding_mask(tgt_lengths, tgt_in.shape[1])  # (B, T)
        if self.packed:
            if not enc.packed:
                raise ValueError("the packed (graph) decoder needs a packed encoder output; encode with "
                                 "model.attention=graph too")
            self_mask = self_graph(tgt_lengths, self.decoder_structure, causal=True)  # Nt nodes
            cross_mask = bipartite_graph(tgt_lengths, enc.mask.sum(1))  # Nt queries, Ns keys
            x = self.tgt_embed.packed(tgt_in[tgt_mask], packed_positions(tgt_lengths))  # (1, Nt, D)
            T = int(tgt_lengths.max())
        else:
            self_mask = decoder_mask(tgt_mask)  # (B, 1, T, T)
            if not self.decoder_structure.is_full:
                pattern = self.decoder_structure.mask(tgt_in.shape[1], causal=True).to(tgt_in.device)
                self_mask = structured(self_mask, pattern, tgt_mask)  # (B, 1, T, T)
            cross_mask = encoder_mask(enc.mask)  # (B, 1, 1, S)
            x = self.tgt_embed(tgt_in)  # (B, T, D)
            T = tgt_in.shape[1]
        self_bias = self.position_bias(self.tgt_bias, T, T)
        att = Attentions(encoder=enc.attentions or []) if need_weights else None
        if att is not None and self.packed:
            att.graphs.update(encoder=enc.graph, decoder=self_mask, cross=cross_mask)
        for layer in self.decoder_layers:
            kv = layer.cross_attn.project_kv(enc.memory)  # (B, H, S, Dh) each, or (1, H, Ns, Dh)
            out = layer(x, self_mask, kv, cross_mask, self_bias=self_bias, need_weights=need_weights)
            x = out.x  # (B, T, D) or (1, Nt, D)
            if att is not None:
                att.decoder.append(out.self_weights)
                att.cross.append(out.cross_weights)
        return ModelOutput(self.decoder_norm(x), tgt_mask, att, self.packed)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
                need_weights: bool = False) -> ModelOutput:
        enc = self.encode(src, src_lengths, need_weights)
        return self.decode(tgt_in, tgt_lengths, enc, need_weights)

    # ------------------------------------------------------------------ decoder, one step at a time

    def init_cache(self, enc: EncoderOutput) -> dict[str, Tensor]:
        """Everything a decoding step needs, batch first, so a search can reorder it with index_select.
        A packed memory is laid out per sentence (B, S, D) here: the graph of each step skips the padding."""
        cache = {"src_mask": enc.mask}  # (B, S)
        memory = enc.memory
        if enc.packed:
            memory = memory.new_zeros(*enc.mask.shape, memory.shape[-1])  # (B, S, D)
            memory[enc.mask] = enc.memory[0]
        for i, layer in enumerate(self.decoder_layers):
            cache[f"{i}.cross.k"], cache[f"{i}.cross.v"] = layer.cross_attn.project_kv(memory)
        return cache

    def decode_step(self, tokens: Tensor, cache: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """tokens (N,) at the next position -> logits (N, V) and the cache with this position added.

        The cache's source mask and cross-attention keys/values have one row per sentence (B); the
        self-attention entries ("hyp.*") one row per hypothesis, N = B x K with a sentence's K hypotheses
        in consecutive rows: they all read their sentence's memory, which is never copied per beam."""
        t = cache["hyp.0.self.k"].shape[2] if "hyp.0.self.k" in cache else 0  # positions decoded so far
        x = self.tgt_embed(tokens[:, None], offset=t)  # (N, 1, D)
        if self.packed:
            self_mask, cross_mask = step_graphs(tokens.shape[0], t, cache["src_mask"], self.decoder_structure)
        else:
            cross_mask = encoder_mask(cache["src_mask"])  # (B, 1, 1, S)
            self_mask = None  # the new position sees every earlier one, unless the structure says otherwise
            if not self.decoder_structure.is_full:
                self_mask = torch.zeros(t + 1, dtype=torch.bool, device=tokens.device)
                self_mask[self.decoder_structure.row(t).to(tokens.device)] = True  # (t+1,) broadcast
        self_bias = self.position_bias(self.tgt_bias, 1, t + 1, q_offset=t)  # the row of position t
        new = {"src_mask": cache["src_mask"]}
        for i, layer in enumerate(self.decoder_layers):
            past = (cache[f"hyp.{i}.self.k"], cache[f"hyp.{i}.self.v"]) if t else None
            kv = (cache[f"{i}.cross.k"], cache[f"{i}.cross.v"])
            out = layer(x, self_mask, kv, cross_mask, past=past, self_bias=self_bias)
            x = out.x  # (N, 1, D)
            new[f"hyp.{i}.self.k"], new[f"hyp.{i}.self.v"] = out.self_kv  # (N, H, t+1, Dh)
            new[f"{i}.cross.k"], new[f"{i}.cross.v"] = kv
        return self.generator(self.decoder_norm(x[:, 0])), new  # (N, V)


def structured(mask: Tensor, pattern: Tensor, real: Tensor) -> Tensor:
    """A padding mask (B, 1, 1 or L, L) narrowed by a structure's (L, L) pattern. Padding positions also see
    themselves, so no row is empty (an empty row would put NaN into the padding, and from there into every
    value the next layer multiplies, even by a weight of 0)."""
    eye = torch.eye(pattern.shape[0], dtype=torch.bool, device=mask.device)
    return (mask & pattern) | (~real[:, None, :, None] & eye)  # (B, 1, L, L)


def step_graphs(n_hyps: int, t: int, src_mask: Tensor, structure: Structure) -> tuple[Graph, Graph]:
    """One decoding step's graphs. Self: hypothesis n (query node n) to its cached positions 0..t (key nodes
    n * (t+1) + j) that the structure lets position t see. Cross: hypothesis n, of sentence b = n // K, to
    the real tokens of sentence b in the per-sentence memory (key nodes b * S + j, j < length)."""
    device = src_mask.device
    B, S = src_mask.shape
    K = n_hyps // B
    n = torch.arange(n_hyps, device=device)
    ones = torch.ones(n_hyps, dtype=torch.long, device=device)
    pattern = None
    if not structure.is_full:
        row = structure.row(t).to(device)

        def pattern(lq: int, lk: int) -> Tensor:
            return torch.stack([torch.zeros_like(row), row], 1)  # (k, 2)
    own = Graph(n_hyps, n_hyps * (t + 1), segments=Segments(n, ones, n * (t + 1), ones * (t + 1), pattern))
    b = torch.arange(B, device=device)
    cross = bipartite_graph(torch.full((B,), K, device=device), src_mask.sum(1), q_offsets=b * K,
                            k_offsets=b * S, n_queries=n_hyps, n_keys=B * S)
    return own, cross


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> Transformer:
    if cfg.kind == "universal":
        from tformer.model.universal import UniversalTransformer

        return UniversalTransformer(cfg, src_vocab, tgt_vocab)
    return Transformer(cfg, src_vocab, tgt_vocab)
