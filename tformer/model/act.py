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

Halting is per position, so on the packed layout (model.attention: graph) a step computes only the positions
still running, as DGL's graph version removes halted nodes: their queries, the halting unit, the output
projection, the FFN and cross-attention run on those rows alone, over the step's graphs restricted to edges
whose query still runs (Graph.restrict); keys and values are projected for the positions those edges read
(halted ones serve their frozen state; a sentence whose positions have all halted costs nothing), and
results are written back by index. Compute then follows the sum over steps of the
running positions, not max_steps x positions. The padded kernels compute every row and freeze the halted
ones. Decoding saves the same way on either layout: at each position only the hypotheses still pondering run
the layer, and the step loop ends when all have halted; a later position that runs longer reads the earlier
positions' keys and values at its extra steps from their final states (DecoderCache.anchors).

Notation: B batch, L length, N rows (packed tokens, or hypotheses), R running rows, D model dim, s step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from tformer.masks import Graph
from tformer.model.cache import KV, DecoderCache
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.model.layout import Selection
from tformer.model.stack import Decoded, Encoded, Side
from tformer.positions import Rotary, sinusoidal_table


class Ponder(NamedTuple):
    steps: Tensor  # (B, L) steps each position took (0 at padding)
    remainders: Tensor  # (B, L) R of each position (0 at padding)

    @property
    def cost(self) -> Tensor:
        """Sum of N + R over the real positions (differentiable through R)."""
        return (self.steps + self.remainders).sum()


def _summed(state: Tensor) -> torch.dtype:
    """The format ACT sums its weighted states in: float32 for a bf16/fp16 model (the halting weights are float32)."""
    return torch.promote_types(state.dtype, torch.float32)


class ACT:
    """Halting bookkeeping for one sequence of steps over positions (any shape, e.g. (B, L) or (1, N))."""

    def __init__(self, active: Tensor, epsilon: float, max_steps: int) -> None:
        self.running = active.clone()  # bool: real positions start running
        self.halting = torch.zeros(active.shape, device=active.device)  # summed p of finished steps
        self.remainders = torch.zeros(active.shape, device=active.device)
        self.steps = torch.zeros(active.shape, device=active.device)
        self.threshold, self.max_steps, self.step = 1.0 - epsilon, max_steps, 0

    def weights(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """p halting probabilities of this step (anything where not running) -> (weight of this step's state,
        running before this step)."""
        self.step += 1
        running = self.running
        last = self.step >= self.max_steps
        halts = running & ((self.halting + p > self.threshold) | last)  # halt at this step
        goes_on = running & ~halts
        remainder = 1.0 - self.halting
        w = torch.where(goes_on, p, torch.where(halts, remainder, torch.zeros_like(p)))
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


def rows_rotary(rotary: Rotary | None, sel: Selection) -> Rotary | None:
    """RoPE's angles for the query rows a step computes (all of them, or the running ones)."""
    return rotary if rotary is None or sel.rows is None else rotary.select(sel.rows)


LayerCall = Callable[[Tensor, Selection, "KV | None"], "tuple[Tensor, object]"]


class ACTStack(nn.Module):
    """One shared layer applied step after step with per-position halting; an encoder or a decoder (the
    interface of tformer.model.stack)."""

    def __init__(self, layer: EncoderLayer | DecoderLayer, norm: nn.Module, d_model: int, max_steps: int,
                 epsilon: float, bias_init: float) -> None:
        super().__init__()
        self.layer, self.norm = layer, norm
        self.halt = nn.Linear(d_model, 1)
        self.max_steps, self.epsilon, self.bias_init = max_steps, epsilon, bias_init
        self.register_buffer("time", sinusoidal_table(max_steps + 1, d_model)[1:], persistent=False)  # (steps, D)

    def reset_parameters(self) -> None:
        """The halting unit starts at bias model.act_bias_init (higher: halt sooner)."""
        nn.init.xavier_uniform_(self.halt.weight)
        nn.init.constant_(self.halt.bias, self.bias_init)

    def halting(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.halt(x))[..., 0]  # (...,)

    def coordinates(self, state: Tensor, positions: Tensor | None, step: int) -> Tensor:
        """x_in(s) = state + PE[p] + TE[s] (no PE with TUPE: positions are its attention bias)."""
        return (state if positions is None else state + positions) + self.time[step]

    def _ponder(self, side: Side, call: LayerCall, cross_mask: Tensor | Graph | None,
                need_weights: bool) -> tuple[Tensor, list, Ponder]:
        """The ACT loop over a whole side. The layout decides which rows a step computes (Layout.select)."""
        layout, state = side.layout, side.x
        act = ACT(layout.flat(layout.mask), self.epsilon, self.max_steps)
        out, extras = torch.zeros_like(state, dtype=_summed(state)), []  # the weighted sum, in float32 at least
        while not act.done:
            x_in = self.coordinates(state, side.positions, act.step)
            sel = (Selection(None, side.mask, cross_mask) if need_weights  # weights: over the whole graph
                   else layout.select(act.running, side.mask, cross_mask))
            if sel.rows is None:  # every row computed, the halted ones then frozen
                w, running = act.weights(self.halting(x_in))
                new, extra = call(x_in, sel, None)
                state = torch.where(running[..., None], new, state)
                out = out + w[..., None] * new
            else:  # the running rows alone (packed: rows of (1, N, D))
                rows = sel.rows
                x_run = x_in[:, rows]  # (1, R, D)
                p = x_in.new_zeros(act.running.shape).index_copy(1, rows, self.halting(x_run))  # (1, N)
                w, _ = act.weights(p)
                new, extra = call(x_run, sel, self._keys(x_in, sel.self_mask, side.rotary))
                state = state.index_copy(1, rows, new)
                out = out.index_add(1, rows, w[:, rows, None] * new)
            extras.append(extra)
        ponder = act.ponder()
        steps, remainders = layout.padded(ponder.steps), layout.padded(ponder.remainders)
        return self.norm(out.to(state.dtype)), extras, Ponder(steps, remainders)

    def _keys(self, x_in: Tensor, graph: Graph, rotary: Rotary | None) -> KV:
        """Self-attention keys and values (1, H, N, Dh) of the rows that running queries read (running or
        halted, their current coordinates; keys turned by RoPE at their positions); rows no edge reads
        (sentences that have all halted, positions after a causal query) are left zero, never computed."""
        rows = graph.key_rows()  # (K,)
        if rows.numel() == x_in.shape[1]:
            return self.layer.self_kv(x_in, rotary)
        k, v = self.layer.self_kv(x_in[:, rows], None if rotary is None else rotary.select(rows))  # (1, H, K, Dh)
        full = k.new_zeros(*k.shape[:2], x_in.shape[1], k.shape[-1])
        return full.index_copy(2, rows, k), full.index_copy(2, rows, v)

    def encode(self, side: Side, need_weights: bool = False) -> Encoded:
        def call(x: Tensor, sel: Selection, keys: KV | None) -> tuple[Tensor, Tensor | None]:
            return self.layer(x, sel.self_mask, bias=side.bias, need_weights=need_weights, keys=keys,
                              rotary=rows_rotary(side.rotary, sel))

        x, weights, ponder = self._ponder(side, call, None, need_weights)
        return Encoded(x, weights, ponder)

    def decode(self, side: Side, memory: Tensor, cross_mask: Tensor | Graph, need_weights: bool = False) -> Decoded:
        kv = self.layer.cross_attn.project_kv(memory)  # (B, H, S, Dh) each, or (1, H, Ns, Dh)

        def call(x: Tensor, sel: Selection, keys: KV | None) -> tuple[Tensor, tuple]:
            o = self.layer(x, sel.self_mask, kv, sel.cross_mask, self_bias=side.bias, need_weights=need_weights,
                           keys=keys, layout=side.layout, rotary=rows_rotary(side.rotary, sel))
            return o.x, (o.self_weights, o.cross_weights)

        x, weights, ponder = self._ponder(side, call, cross_mask, need_weights)
        return Decoded(x, [w[0] for w in weights], [w[1] for w in weights], ponder)

    def init_cache(self, memory: Tensor, src_mask: Tensor) -> DecoderCache:
        return DecoderCache.start(src_mask, [self.layer.cross_attn.memory_kv(memory)])

    def _past(self, cache: DecoderCache, kvs: list[KV], step: int, rotary: Rotary | None) -> KV:
        """Step `step`'s keys and values of positions 0 .. t-1 (N, H, t, Dh): cached where the position ran
        that step, else computed from its final state with this step's coordinates (it had halted; RoPE turns
        the keys by their positions m .. t-1 then)."""
        t = cache.t
        k = v = None
        if step < len(kvs):
            k, v = kvs[step]
        m = 0 if k is None else k.shape[2]
        if m < t:
            turn = None if rotary is None else rotary.at(torch.arange(m, t))
            fk, fv = self.layer.self_kv(cache.anchors[:, m:] + self.time[step], turn)  # (N, H, t-m, Dh)
            k, v = (fk, fv) if k is None else (torch.cat([k, fk], 2), torch.cat([v, fv], 2))
        return k, v

    def step(self, side: Side, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """side.x (N, 1, D) token embeddings at position t = cache.t -> (N, 1, D) and the cache with position t.
        Only the hypotheses still running go through the layer; the loop ends when all have halted."""
        layout, state, t = side.layout, side.x, cache.t
        N = state.shape[0]
        self_mask, cross_mask = layout.self_mask(), layout.cross_mask()
        cross = cache.cross[0]
        act = ACT(torch.ones(N, 1, dtype=torch.bool, device=state.device), self.epsilon, self.max_steps)
        out, kvs = torch.zeros_like(state, dtype=_summed(state)), list(cache.self_kv)
        while not act.done:
            s = act.step
            x_in = self.coordinates(state, side.positions, s)  # (N, 1, D)
            k, v = self.layer.self_kv(x_in, side.rotary)  # (N, H, 1, Dh): every hypothesis's, halted ones frozen
            if t:
                pk, pv = self._past(cache, kvs, s, side.rotary)
                k, v = torch.cat([pk, k], 2), torch.cat([pv, v], 2)  # (N, H, t+1, Dh)
            kvs[s:s + 1] = [(k, v)]
            sel = layout.select(act.running, self_mask, cross_mask)
            rows = sel.rows
            x_run = x_in.index_select(0, rows)  # (R, 1, D)
            p = x_in.new_zeros(N, 1).index_copy(0, rows, self.halting(x_run))
            w, _ = act.weights(p)
            keys = (k, v) if sel.hyp_rows is None else tuple(x.index_select(0, sel.hyp_rows) for x in (k, v))
            memory = cross if sel.sentence_rows is None else tuple(c.index_select(0, sel.sentence_rows) for c in cross)
            o = self.layer(x_run, sel.self_mask, memory, sel.cross_mask, self_bias=side.bias, keys=keys,
                           layout=layout, rotary=side.rotary)  # every row is at position t
            state = state.index_copy(0, rows, o.x)
            out = out.index_add(0, rows, w[rows][..., None] * o.x)
        anchor = state if side.positions is None else state + side.positions  # (N, 1, D)
        anchors = anchor if cache.anchors is None else torch.cat([cache.anchors, anchor], 1)
        steps = act.ponder().steps  # (N, 1)
        steps = steps if cache.steps is None else torch.cat([cache.steps, steps], 1)
        return self.norm(out.to(state.dtype)), replace(cache, self_kv=kvs, anchors=anchors, steps=steps)
