"""The encoder-decoder Transformer ("Attention Is All You Need").

Notation: B batch, S source length, T target length, N real target tokens, D model dim, H heads,
Dh head dim, V vocabulary.

    encode(src, src_lengths)            -> EncoderOutput(memory (B, S, D), mask (B, S))
    forward(src, ..., tgt_in, ...)      -> ModelOutput(hidden (B, T, D)); logits = generator(hidden)
    init_cache(encoder_output)          -> cache: dict of tensors, batch first (see decode_step)
    decode_step(tokens (B,), cache)     -> (logits (B, V), cache): one position, for tformer.decode
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.dropout import Dropout
from tformer.masks import decoder_mask, encoder_mask, padding_mask
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.positions import build_positions


@dataclass
class Attentions:
    """Attention weights per layer, (B, H, queries, keys) each, returned when asked for."""

    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


class EncoderOutput(NamedTuple):
    memory: Tensor  # (B, S, D)
    mask: Tensor  # (B, S) bool, True at real tokens
    attentions: list[Tensor] | None = None


class ModelOutput(NamedTuple):
    hidden: Tensor  # (B, T, D) decoder output, before the generator
    attentions: Attentions | None = None


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(D) plus absolute positions, then dropout."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Module, dropout: float) -> None:
        super().__init__()
        self.tokens, self.positions = tokens, positions
        self.scale = math.sqrt(tokens.embedding_dim)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale  # (B, L, D)
        return self.dropout(x + self.positions(ids.shape[1], offset))  # (B, L, D)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab != tgt_vocab:
            raise ValueError(
                f"model.share_embeddings needs one joint vocabulary, but the source has {src_vocab} "
                f"entries and the target {tgt_vocab}"
            )
        self.cfg = cfg
        D = cfg.d_model
        positions = build_positions(cfg.positions, D, cfg.max_positions)  # no weights when sinusoidal
        src_tokens = nn.Embedding(src_vocab, D)
        tgt_tokens = src_tokens if cfg.share_embeddings else nn.Embedding(tgt_vocab, D)
        tgt_positions = positions if cfg.positions == "sinusoidal" else build_positions(
            cfg.positions, D, cfg.max_positions)
        self.src_embed = Embeddings(src_tokens, positions, cfg.dropout)
        self.tgt_embed = Embeddings(tgt_tokens, tgt_positions, cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(D, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(D, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.generator = nn.Linear(D, tgt_vocab)
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

    def encode(self, src: Tensor, src_lengths: Tensor, need_weights: bool = False) -> EncoderOutput:
        """src (B, S) token ids, src_lengths (B,) -> memory (B, S, D)."""
        src_mask = padding_mask(src_lengths, src.shape[1])  # (B, S)
        mask = encoder_mask(src_mask)  # (B, 1, 1, S)
        x = self.src_embed(src)  # (B, S, D)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, mask, need_weights=need_weights)  # (B, S, D)
            weights.append(w)
        return EncoderOutput(self.encoder_norm(x), src_mask, weights if need_weights else None)

    # ------------------------------------------------------------------ decoder, teacher forced

    def decode(self, tgt_in: Tensor, tgt_lengths: Tensor, enc: EncoderOutput,
               need_weights: bool = False) -> ModelOutput:
        """tgt_in (B, T) = BOS + target, all positions at once -> hidden (B, T, D)."""
        self_mask = decoder_mask(padding_mask(tgt_lengths, tgt_in.shape[1]))  # (B, 1, T, T)
        cross_mask = encoder_mask(enc.mask)  # (B, 1, 1, S)
        x = self.tgt_embed(tgt_in)  # (B, T, D)
        att = Attentions(encoder=enc.attentions or []) if need_weights else None
        for layer in self.decoder_layers:
            kv = layer.cross_attn.project_kv(enc.memory)  # (B, H, S, Dh) each
            out = layer(x, self_mask, kv, cross_mask, need_weights=need_weights)
            x = out.x  # (B, T, D)
            if att is not None:
                att.decoder.append(out.self_weights)
                att.cross.append(out.cross_weights)
        return ModelOutput(self.decoder_norm(x), att)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
                need_weights: bool = False) -> ModelOutput:
        enc = self.encode(src, src_lengths, need_weights)
        return self.decode(tgt_in, tgt_lengths, enc, need_weights)

    # ------------------------------------------------------------------ decoder, one step at a time

    def init_cache(self, enc: EncoderOutput) -> dict[str, Tensor]:
        """Everything a decoding step needs, batch first, so a search can reorder it with index_select."""
        cache = {"src_mask": enc.mask}  # (B, S)
        for i, layer in enumerate(self.decoder_layers):
            cache[f"{i}.cross.k"], cache[f"{i}.cross.v"] = layer.cross_attn.project_kv(enc.memory)
        return cache

    def decode_step(self, tokens: Tensor, cache: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """tokens (N,) at the next position -> logits (N, V) and the cache with this position added.

        The cache's source mask and cross-attention keys/values have one row per sentence (B); the
        self-attention entries ("hyp.*") one row per hypothesis, N = B x K with a sentence's K hypotheses
        in consecutive rows: they all read their sentence's memory, which is never copied per beam."""
        t = cache["hyp.0.self.k"].shape[2] if "hyp.0.self.k" in cache else 0  # positions decoded so far
        x = self.tgt_embed(tokens[:, None], offset=t)  # (N, 1, D)
        cross_mask = encoder_mask(cache["src_mask"])  # (B, 1, 1, S)
        new = {"src_mask": cache["src_mask"]}
        for i, layer in enumerate(self.decoder_layers):
            past = (cache[f"hyp.{i}.self.k"], cache[f"hyp.{i}.self.v"]) if t else None
            kv = (cache[f"{i}.cross.k"], cache[f"{i}.cross.v"])
            out = layer(x, None, kv, cross_mask, past=past)  # the new position sees every earlier one
            x = out.x  # (N, 1, D)
            new[f"hyp.{i}.self.k"], new[f"hyp.{i}.self.v"] = out.self_kv  # (N, H, t+1, Dh)
            new[f"{i}.cross.k"], new[f"{i}.cross.v"] = kv
        return self.generator(self.decoder_norm(x[:, 0])), new  # (N, V)


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> Transformer:
    return Transformer(cfg, src_vocab, tgt_vocab)
