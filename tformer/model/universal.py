"""The Adaptive Universal Transformer (Dehghani et al. 2019) with per-position ACT halting (Graves 2016).

Encoder and decoder each apply ONE shared layer repeatedly (the decoder's layer has its own cross-attention
weights). Before every step s the coordinates are added: position p and time step s, both sinusoidal:

    x_in(s) = state(s-1) + PE[p] + TE[s]          state(0) = token embedding * sqrt(D)
    p(s)    = sigmoid(w . x_in(s) + b)            the halting unit (b starts at model.act_bias_init)

A position halts at the first step where its summed halting probability would pass 1 - epsilon, or at
model.max_steps; its last step's weight is the remainder R = 1 - (sum of earlier p), so the weights of its
steps sum to 1, and its output is the weighted sum of its states. A halted position stops changing: its
frozen state (with the later steps' coordinates) still serves as keys and values to positions that run on,
which is what makes step-by-step decoding with a per-step key/value cache equal to the full forward. The
ponder cost N + R per position (N = steps taken) comes back in `Ponder`; the training loop adds
train.ponder_weight x its sum to the loss.

Notation: B batch, S source length, T target length, D model dim, s step, N hypotheses.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.dropout import dropout
from tformer.masks import decoder_mask, encoder_mask, padding_mask
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.model.transformer import Attentions, EncoderOutput, ModelOutput, Transformer
from tformer.positions import sinusoidal_table


class Ponder(NamedTuple):
    steps: Tensor  # (B, L) steps each position took (0 at padding)
    remainders: Tensor  # (B, L) R of each position (0 at padding)

    @property
    def cost(self) -> Tensor:
        """Sum of N + R over the real positions (differentiable through R)."""
        return (self.steps + self.remainders).sum()


class ACT:
    """Halting bookkeeping for one sequence of steps over positions (B, L)."""

    def __init__(self, active: Tensor, epsilon: float, max_steps: int) -> None:
        self.running = active.clone()  # (B, L) bool: real positions start running
        self.halting = torch.zeros(active.shape, device=active.device)  # summed p of finished steps
        self.remainders = torch.zeros(active.shape, device=active.device)
        self.steps = torch.zeros(active.shape, device=active.device)
        self.threshold, self.max_steps, self.step = 1.0 - epsilon, max_steps, 0

    def weights(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """p (B, L) halting probabilities of this step -> (weight of this step's state (B, L), running before)."""
        self.step += 1
        running = self.running
        last = self.step >= self.max_steps
        halts = running & ((self.halting + p > self.threshold) | last)  # (B, L) halt at this step
        goes_on = running & ~halts
        remainder = 1.0 - self.halting
        w = torch.where(goes_on, p, torch.where(halts, remainder, torch.zeros_like(p)))  # (B, L)
        self.remainders = torch.where(halts, remainder, self.remainders)
        self.halting = self.halting + torch.where(goes_on, p, torch.zeros_like(p))
        self.steps = self.steps + running.float()
        self.running = goes_on
        return w, running

    @property
    def done(self) -> bool:
        return not bool(self.running.any())

    def ponder(self) -> Ponder:
        return Ponder(self.steps, self.remainders)


class UniversalTransformer(Transformer):
    """Same embeddings, generator and interfaces as `Transformer`; one shared layer per side, ACT halting."""

    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__(dataclasses.replace(cfg, encoder_layers=1, decoder_layers=1), src_vocab, tgt_vocab)
        self.cfg = cfg
        D = cfg.d_model
        self.encoder_halt, self.decoder_halt = nn.Linear(D, 1), nn.Linear(D, 1)
        for unit in (self.encoder_halt, self.decoder_halt):
            nn.init.xavier_uniform_(unit.weight)
            nn.init.constant_(unit.bias, cfg.act_bias_init)
        self.register_buffer("time", sinusoidal_table(cfg.max_steps + 1, D)[1:], persistent=False)  # (steps, D)

    @property
    def encoder_layer(self) -> EncoderLayer:
        return self.encoder_layers[0]

    @property
    def decoder_layer(self) -> DecoderLayer:
        return self.decoder_layers[0]

    def _tokens(self, embed, ids: Tensor) -> Tensor:
        return dropout(embed.tokens(ids) * embed.scale, self.cfg.dropout, self.training)  # (B, L, D)

    def _halt(self, unit: nn.Linear, x: Tensor) -> Tensor:
        return torch.sigmoid(unit(x))[..., 0]  # (B, L)

    # ------------------------------------------------------------------ encoder

    def encode(self, src: Tensor, src_lengths: Tensor, need_weights: bool = False) -> EncoderOutput:
        src_mask = padding_mask(src_lengths, src.shape[1])  # (B, S)
        mask = encoder_mask(src_mask)  # (B, 1, 1, S)
        state = self._tokens(self.src_embed, src)  # (B, S, D)
        pos = self.src_embed.positions(src.shape[1])  # (S, D)
        act = ACT(src_mask, self.cfg.act_epsilon, self.cfg.max_steps)
        out = torch.zeros_like(state)
        weights = []
        while not act.done:
            x_in = state + pos + self.time[act.step]  # (B, S, D)
            w, running = act.weights(self._halt(self.encoder_halt, x_in))
            new, a = self.encoder_layer(x_in, mask, need_weights=need_weights)  # (B, S, D)
            state = torch.where(running[..., None], new, state)
            out = out + w[..., None] * new
            weights.append(a)
        return EncoderOutput(self.encoder_norm(out), src_mask, weights if need_weights else None,
                             ponder=act.ponder())

    # ------------------------------------------------------------------ decoder, teacher forced

    def decode(self, tgt_in: Tensor, tgt_lengths: Tensor, enc: EncoderOutput,
               need_weights: bool = False) -> ModelOutput:
        tgt_mask = padding_mask(tgt_lengths, tgt_in.shape[1])  # (B, T)
        self_mask, cross_mask = decoder_mask(tgt_mask), encoder_mask(enc.mask)
        kv = self.decoder_layer.cross_attn.project_kv(enc.memory)  # (B, H, S, Dh) each
        state = self._tokens(self.tgt_embed, tgt_in)  # (B, T, D)
        pos = self.tgt_embed.positions(tgt_in.shape[1])  # (T, D)
        act = ACT(tgt_mask, self.cfg.act_epsilon, self.cfg.max_steps)
        out = torch.zeros_like(state)
        att = Attentions(encoder=enc.attentions or []) if need_weights else None
        while not act.done:
            x_in = state + pos + self.time[act.step]  # (B, T, D)
            w, running = act.weights(self._halt(self.decoder_halt, x_in))
            o = self.decoder_layer(x_in, self_mask, kv, cross_mask, need_weights=need_weights)
            state = torch.where(running[..., None], o.x, state)
            out = out + w[..., None] * o.x
            if att is not None:
                att.decoder.append(o.self_weights)
                att.cross.append(o.cross_weights)
        return ModelOutput(self.decoder_norm(out), tgt_mask, att, ponder=(enc.ponder, act.ponder()))

    # ------------------------------------------------------------------ decoder, one step at a time

    def init_cache(self, enc: EncoderOutput) -> dict[str, Tensor]:
        k, v = self.decoder_layer.cross_attn.project_kv(enc.memory)  # (B, H, S, Dh) each
        return {"src_mask": enc.mask, "0.cross.k": k, "0.cross.v": v}

    def decode_step(self, tokens: Tensor, cache: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """tokens (N,) at position t -> logits (N, V). The cache keeps every step's self-attention keys and
        values ("hyp.{s}.self.k/v", (N, H, t+1, Dh)): a later position may run more steps than this one, and
        then reads this one's frozen state at those steps, exactly as the full forward does. Once every
        hypothesis has halted, the remaining steps compute only those keys and values. "hyp.steps" (N, t+1)
        records the steps each position took."""
        t = cache["hyp.0.self.k"].shape[2] if "hyp.0.self.k" in cache else 0
        N = tokens.shape[0]
        state = self._tokens(self.tgt_embed, tokens[:, None])  # (N, 1, D)
        pos = self.tgt_embed.positions(1, offset=t)  # (1, D)
        cross = (cache["0.cross.k"], cache["0.cross.v"])
        cross_mask = encoder_mask(cache["src_mask"])  # (B, 1, 1, S)
        act = ACT(torch.ones(N, 1, dtype=torch.bool, device=tokens.device), self.cfg.act_epsilon, self.cfg.max_steps)
        out = torch.zeros_like(state)
        new = {"src_mask": cache["src_mask"], "0.cross.k": cross[0], "0.cross.v": cross[1]}
        layer = self.decoder_layer
        for s in range(self.cfg.max_steps):
            x_in = state + pos + self.time[s]  # (N, 1, D)
            past = (cache[f"hyp.{s}.self.k"], cache[f"hyp.{s}.self.v"]) if t else None
            if act.done:  # keys and values only: what later positions will read at this step
                k, v = layer.self_attn.project_kv(layer.res_self.inp(x_in))  # (N, H, 1, Dh)
                if past is not None:
                    k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
                new[f"hyp.{s}.self.k"], new[f"hyp.{s}.self.v"] = k, v
                continue
            w, running = act.weights(self._halt(self.decoder_halt, x_in))  # (N, 1)
            o = layer(x_in, None, cross, cross_mask, past=past)
            new[f"hyp.{s}.self.k"], new[f"hyp.{s}.self.v"] = o.self_kv  # (N, H, t+1, Dh)
            state = torch.where(running[..., None], o.x, state)
            out = out + w[..., None] * o.x
        steps = act.ponder().steps  # (N, 1)
        new["hyp.steps"] = steps if "hyp.steps" not in cache else torch.cat([cache["hyp.steps"], steps], 1)
        return self.generator(self.decoder_norm(out[:, 0])), new  # (N, V)
