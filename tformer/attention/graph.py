"""Attention as message passing over a graph (the DGL seed), exact.

Every edge key -> query carries a score q . k * scale (+ a per-edge bias); each query node takes a softmax
over its incoming edges, the maximum subtracted (no clamping), drops out weights like the dense kernel, and
sums the values its edges bring. A node without incoming edges gets zeros. Nodes are the rows of the
flattened (B x length) inputs, so a packed batch (B = 1, sentences back to back) has no padding at all.

Three executions of the same mathematics, chosen per graph (`choose_method`; figures in
benchmarks/RESULTS.md):

    segments  the graph is a set of dense blocks (one per sentence: the seed's graphs, or a sentence under
              a structure): dense attention inside each, blocks of one shape in one batched call, views and
              not copies when they lie back to back as in a packed batch. No per-edge bias or weights.
    blocks    cut queries and keys into b x b tiles; each query block multiplies densely with the few key
              blocks its edges touch, as one batched matmul, and pairs that are not edges are masked. Exact
              and linear in length for windows; handles per-edge bias and returns per-edge weights.
    edges     gather q and k per edge, scatter the softmax and the weighted sum (index_add). No waste on
              any graph, but gathering is memory traffic: 15-17x dense per call on Multi30k batches.

`plan_blocks` is built once per graph and kept on it (`Graph.plans`), so the layers of a forward share it.
Notation: Nq query nodes, Nk key nodes, E edges, H heads, Dh head dim, b block size, G query blocks in a
group, m key blocks per query block, M = m x b keys per query block.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from tformer.attention.kernels import sdpa_attention
from tformer.dropout import dropout
from tformer.masks import Graph, PositionBias

BLOCK_SIZES = (8, 16, 32, 64)
_MASKED = -1e30  # finite: a row without edges stays NaN-free in the backward pass; exp() of it is exactly 0


# --------------------------------------------------------------------------- edges


def edge_attention(q: Tensor, k: Tensor, v: Tensor, graph: Graph, bias: Tensor | None = None,
                   dropout_p: float = 0.0, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """q (Nq, H, Dh), k and v (Nk, H, Dh), bias (E, H) -> out (Nq, H, Dh), weights (E, H)."""
    query, key = graph.query, graph.key
    Nq, H, _ = q.shape
    scores = (q[query] * k[key]).sum(-1) * scale  # (E, H)
    if bias is not None:
        scores = scores + bias
    index = query[:, None].expand(-1, H)  # (E, H)
    top = torch.full((Nq, H), -math.inf, dtype=scores.dtype, device=q.device)
    top = top.scatter_reduce(0, index, scores.detach(), "amax")  # (Nq, H) max over incoming edges
    e = torch.exp(scores - top[query])  # (E, H), each <= 1
    total = torch.zeros(Nq, H, dtype=e.dtype, device=q.device).index_add(0, query, e)  # (Nq, H)
    weights = e / total[query]  # (E, H)
    dropped = dropout(weights, dropout_p)
    out = torch.zeros_like(q).index_add(0, query, dropped[..., None] * v[key])  # (Nq, H, Dh)
    return out, weights


# --------------------------------------------------------------------------- blocks


class BlockGroup(NamedTuple):
    q_blocks: Tensor | None  # (G,) query blocks of this group; None = all, in order
    k_blocks: Tensor  # (G, m) key block of each slot; the extra block n_kb (all zeros) pads
    additive: Tensor  # (G, 1, b, M) 0 at edges, -1e30 elsewhere
    empty: Tensor | None  # (G, 1, b, 1) rows without edges (outputs forced to 0); None if there are none
    edge_ids: Tensor | None  # (E_g,) edges of this group; None = all
    edge_pos: Tensor  # (E_g,) flat position of each edge in (G, b, M)


class BlockPlan(NamedTuple):
    b: int
    n_qb: int
    n_kb: int
    groups: list[BlockGroup]
    cost: int  # score entries computed per head: sum over groups of G x b x M


def plan_blocks(graph: Graph, b: int) -> BlockPlan:
    """Tiles of `b` x `b` (query block, key block) that hold at least one edge, grouped by how many key
    blocks a query block needs (so a few dense rows, e.g. global tokens, do not pad every other block)."""
    query, key, device = graph.query, graph.key, graph.query.device
    n_qb, n_kb = -(-graph.n_queries // b), -(-graph.n_keys // b)
    qb, kb = query // b, key // b
    tiles, tile_of_edge = torch.unique(qb * n_kb + kb, return_inverse=True)  # sorted by query block, key block
    t_qb, t_kb = tiles // n_kb, tiles % n_kb
    per_qb = torch.bincount(t_qb, minlength=n_qb)  # (n_qb,) key blocks each query block needs
    slot = torch.arange(tiles.numel(), device=device) - (torch.cumsum(per_qb, 0) - per_qb)[t_qb]  # (tiles,)
    # group query blocks by their need: needs within a factor of two of the group's largest share one group
    # (padded to it), so a window makes one group while a few dense rows (global tokens) make their own
    need = per_qb.clone()
    remaining = sorted(set(torch.unique(per_qb).tolist()) - {0}, reverse=True)
    while remaining:
        top = remaining[0]
        merged = [m for m in remaining if 2 * m > top]
        for m in merged:
            need[per_qb == m] = top
        remaining = [m for m in remaining if 2 * m <= top]
    values = [m for m in torch.unique(need).tolist() if m > 0]
    single = len(values) == 1  # every edge is in the one group
    groups, cost = [], 0
    for m in values:
        members = (need == m).nonzero()[:, 0]  # (G,)
        G, M = members.numel(), m * b
        rank = torch.full((n_qb,), -1, dtype=torch.long, device=device)
        rank[members] = torch.arange(G, device=device)
        in_group = rank[t_qb] >= 0  # (tiles,)
        k_blocks = torch.full((G, m), n_kb, dtype=torch.long, device=device)
        k_blocks[rank[t_qb[in_group]], slot[in_group]] = t_kb[in_group]
        e_in = rank[qb] >= 0 if not single else None
        edge_ids = e_in.nonzero()[:, 0] if e_in is not None else None
        eq = query if edge_ids is None else query[edge_ids]
        ek = key if edge_ids is None else key[edge_ids]
        e_slot = slot[tile_of_edge if edge_ids is None else tile_of_edge[edge_ids]]
        edge_pos = (rank[eq // b] * b + eq % b) * M + e_slot * b + ek % b  # (E_g,)
        additive = torch.full((G * b * M,), _MASKED, device=device)
        additive[edge_pos] = 0.0
        rows_with_edges = torch.zeros(G * b, dtype=torch.bool, device=device)
        rows_with_edges[edge_pos // M] = True
        empty = None if bool(rows_with_edges.all()) else ~rows_with_edges.view(G, 1, b, 1)
        q_blocks = None if G == n_qb else members
        groups.append(BlockGroup(q_blocks, k_blocks, additive.view(G, 1, b, M), empty, edge_ids, edge_pos))
        cost += G * b * M
    return BlockPlan(b, n_qb, n_kb, groups, cost)


def block_size(graph: Graph) -> int:
    """About half the mean number of keys per query, a power of two in BLOCK_SIZES: a query block then meets
    about three key blocks, little waste, and matrix multiplies big enough to run fast (measured:
    benchmarks/graph_attention.py; a window of +-32 runs fastest with b = 32)."""
    per_query = graph.n_edges / max(1, graph.n_queries)
    return min(BLOCK_SIZES, key=lambda b: abs(math.log2(b) - math.log2(max(per_query / 2, 1))))


def best_plan(graph: Graph) -> BlockPlan:
    if "blocks" not in graph.plans:
        graph.plans["blocks"] = plan_blocks(graph, block_size(graph))
    return graph.plans["blocks"]


def block_attention(q: Tensor, k: Tensor, v: Tensor, graph: Graph, plan: BlockPlan, bias: Tensor | None = None,
                    dropout_p: float = 0.0, scale: float = 1.0,
                    need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """q (Nq, H, Dh), k and v (Nk, H, Dh), bias (E, H) -> out (Nq, H, Dh), weights (E, H) when asked for."""
    Nq, H, Dh = q.shape
    b = plan.b
    qp = torch.nn.functional.pad(q * scale, (0, 0, 0, 0, 0, plan.n_qb * b - Nq)).view(plan.n_qb, b, H, Dh)
    pad_k = (plan.n_kb + 1) * b - k.shape[0]  # up to the last block, plus one all-zero block for empty slots
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad_k)).view(plan.n_kb + 1, b, H, Dh)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad_k)).view(plan.n_kb + 1, b, H, Dh)
    outs, weights = [], None
    if need_weights:
        weights = q.new_zeros(graph.n_edges, H)
    for g in plan.groups:
        G, m = g.k_blocks.shape
        Qg = (qp if g.q_blocks is None else qp[g.q_blocks]).permute(0, 2, 1, 3)  # (G, H, b, Dh)
        Kg = kp[g.k_blocks].reshape(G, m * b, H, Dh).permute(0, 2, 3, 1)  # (G, H, Dh, M)
        Vg = vp[g.k_blocks].reshape(G, m * b, H, Dh).permute(0, 2, 1, 3)  # (G, H, M, Dh)
        scores = torch.matmul(Qg, Kg) + g.additive  # (G, H, b, M)
        if bias is not None:
            edge_bias = bias if g.edge_ids is None else bias[g.edge_ids]  # (E_g, H)
            tiles = bias.new_zeros(G * b * m * b, H).index_put((g.edge_pos,), edge_bias)
            scores = scores + tiles.view(G, b, m * b, H).permute(0, 3, 1, 2)
        w = torch.softmax(scores, dim=-1)  # (G, H, b, M)
        if weights is not None:
            flat = w.permute(0, 2, 3, 1).reshape(-1, H)[g.edge_pos]  # (E_g, H)
            weights = weights.index_copy(0, g.edge_ids, flat) if g.edge_ids is not None else flat
        out = torch.matmul(dropout(w, dropout_p), Vg)  # (G, H, b, Dh)
        if g.empty is not None:
            out = out.masked_fill(g.empty, 0.0)
        outs.append((g.q_blocks, out))
    if len(outs) == 1 and outs[0][0] is None:
        out = outs[0][1]
    else:
        out = q.new_zeros(plan.n_qb, H, b, Dh)
        for q_blocks, o in outs:
            out = out.index_copy(0, q_blocks, o) if q_blocks is not None else o
    return out.permute(0, 2, 1, 3).reshape(plan.n_qb * b, H, Dh)[:Nq], weights


# --------------------------------------------------------------------------- segments


class SegmentGroup(NamedTuple):
    lq: int
    lk: int
    q_rows: tuple[int, int] | Tensor  # (first node, n) of consecutive blocks, or (n, lq) node indices
    k_rows: tuple[int, int] | Tensor
    mask: Tensor | None  # (lq, lk) bool, None = all pairs
    empty: Tensor | None  # (lq,) rows of the pattern without a key (their outputs are set to 0)


class SegmentPlan(NamedTuple):
    groups: list[SegmentGroup]
    order: Tensor | None  # (Nq_covered,) query nodes in the order the groups produce them; None = 0 .. Nq-1
    entries: int  # score entries computed: sum over segments of lq x lk
    edges: int


def _rows(start: Tensor, length: int) -> tuple[int, int] | Tensor:
    n, first = start.numel(), int(start[0])
    if torch.equal(start, first + length * torch.arange(n, device=start.device)):
        return (first, n)  # consecutive blocks: a view
    return start[:, None] + torch.arange(length, device=start.device)  # (n, length)


def plan_segments(graph: Graph) -> SegmentPlan:
    seg = graph.segments
    span = int(seg.k_len.max()) + 1 if seg.k_len.numel() else 1
    groups, order, entries, edges = [], [], 0, 0
    for shape in torch.unique(seg.q_len * span + seg.k_len).tolist():
        lq, lk = divmod(shape, span)
        if lq == 0 or lk == 0:
            continue
        rows = ((seg.q_len == lq) & (seg.k_len == lk)).nonzero()[:, 0]  # (n,) segments of this shape
        mask = empty = None
        if seg.pattern is not None:
            pairs = seg.pattern(lq, lk)  # (E_s, 2)
            mask = torch.zeros(lq, lk, dtype=torch.bool, device=seg.q_len.device)
            mask[pairs[:, 0], pairs[:, 1]] = True
            edges += rows.numel() * pairs.shape[0]
            if not bool(mask.any(1).all()):
                empty = ~mask.any(1)
                mask = mask.clone()
                mask[empty, 0] = True  # a placeholder key keeps the softmax finite; the output row becomes 0
        else:
            edges += rows.numel() * lq * lk
        q_rows, k_rows = _rows(seg.q_start[rows], lq), _rows(seg.k_start[rows], lk)
        groups.append(SegmentGroup(lq, lk, q_rows, k_rows, mask, empty))
        entries += rows.numel() * lq * lk
        if isinstance(q_rows, tuple):
            order.append(torch.arange(q_rows[0], q_rows[0] + q_rows[1] * lq, device=seg.q_len.device))
        else:
            order.append(q_rows.reshape(-1))
    flat = torch.cat(order) if order else torch.zeros(0, dtype=torch.long)
    in_order = flat.numel() == graph.n_queries and torch.equal(flat, torch.arange(graph.n_queries, device=flat.device))
    return SegmentPlan(groups, None if in_order else flat, entries, edges)


def _take(x: Tensor, rows: tuple[int, int] | Tensor, length: int) -> Tensor:
    """(N, H, Dh) -> (n, H, length, Dh), the rows of n segments."""
    if isinstance(rows, tuple):
        first, n = rows
        block = x[first : first + n * length].view(n, length, *x.shape[1:])
    else:
        block = x[rows]  # (n, length, H, Dh)
    return block.transpose(1, 2)


def segment_attention(q: Tensor, k: Tensor, v: Tensor, plan: SegmentPlan, dropout_p: float = 0.0,
                      scale: float = 1.0, bias: PositionBias | None = None) -> Tensor:
    """q (Nq, H, Dh), k and v (Nk, H, Dh) -> out (Nq, H, Dh): dense attention inside each segment, segments of
    one shape in one batched call (a view, no copy, when they are consecutive, as in a packed batch). A
    positional bias is the same for every segment of a shape: one (1, H, lq, lk) slice, broadcast."""
    Nq, H, Dh = q.shape
    if not plan.groups:  # no segment has both queries and keys: every query node is without edges
        return q.new_zeros(Nq, H, Dh)
    outs = []
    for g in plan.groups:
        Q, K, V = _take(q, g.q_rows, g.lq), _take(k, g.k_rows, g.lk), _take(v, g.k_rows, g.lk)  # (n, H, l, Dh)
        mask = None if g.mask is None else g.mask[None, None]
        b = None if bias is None else bias.block(g.lq, g.lk)
        o, _ = sdpa_attention(Q, K, V, mask=mask, bias=b, dropout_p=dropout_p, scale=scale)  # (n, H, lq, Dh)
        if g.empty is not None:
            o = o.masked_fill(g.empty[None, None, :, None], 0.0)
        outs.append(o.transpose(1, 2).reshape(-1, H, Dh))  # (n * lq, H, Dh)
    out = torch.cat(outs) if len(outs) != 1 else outs[0]
    if plan.order is not None:
        out = q.new_zeros(Nq, H, Dh).index_copy(0, plan.order, out)
    return out


# --------------------------------------------------------------------------- the kernel


def graph_attention(q: Tensor, k: Tensor, v: Tensor, mask: Graph | None = None,
                    bias: Tensor | PositionBias | None = None,
                    dropout_p: float = 0.0, scale: float | None = None, need_weights: bool = False,
                    method: str = "auto") -> tuple[Tensor, Tensor | None]:
    """The kernel contract of tformer.attention.kernels with a Graph as the structure.

    q (B, H, T, Dh), k and v (Bk, H, S, Dh): query node b * T + t, key node b * S + s (Bk may differ from B,
    e.g. hypotheses against their sentences' memory). bias (E, H), one value per edge and head, or a
    PositionBias (a function of positions inside a segment: the segments method can take it).
    -> out (B, H, T, Dh); weights (E, H) per edge, after the softmax, when asked for."""
    if not isinstance(mask, Graph):
        raise ValueError("the graph kernel needs a Graph as its structure (tformer.masks), "
                         f"got {type(mask).__name__}")
    B, H, T, Dh = q.shape
    Bk, _, S, _ = k.shape
    if (mask.n_queries, mask.n_keys) != (B * T, Bk * S):
        raise ValueError(f"graph has {mask.n_queries} query and {mask.n_keys} key nodes, but the inputs have "
                         f"{B} x {T} queries and {Bk} x {S} keys")
    positional = bias if isinstance(bias, PositionBias) else None
    if positional is not None and positional.table.shape[0] != H:
        raise ValueError(f"positional bias has {positional.table.shape[0]} heads, the inputs {H}")
    if bias is not None and positional is None and bias.shape != (mask.n_edges, H):
        raise ValueError(f"graph bias must be (edges, heads) = ({mask.n_edges}, {H}), got {tuple(bias.shape)}")
    if positional is not None and not mask.aligned:  # queries are not positions 0.. of their segments
        bias, positional = positional.per_edge(mask), None
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    qn = q.transpose(1, 2).reshape(B * T, H, Dh)  # (Nq, H, Dh)
    kn = k.transpose(1, 2).reshape(Bk * S, H, Dh)  # (Nk, H, Dh)
    vn = v.transpose(1, 2).reshape(Bk * S, H, Dh)
    if method == "auto":
        method = choose_method(mask, (bias is not None and positional is None) or need_weights)
    if method == "segments":
        if mask.segments is None or (bias is not None and positional is None) or need_weights:
            raise ValueError("the segments method needs a graph built from segments, and no per-edge bias or "
                             "weights")
        out, weights = segment_attention(qn, kn, vn, segment_plan(mask), dropout_p, scale, positional), None
        return out.view(B, T, H, Dh).transpose(1, 2), None
    if positional is not None:
        bias = positional.per_edge(mask)  # (E, H)
    if method == "edges":
        out, weights = edge_attention(qn, kn, vn, mask, bias, dropout_p, scale)
    elif method == "blocks":
        out, weights = block_attention(qn, kn, vn, mask, best_plan(mask), bias, dropout_p, scale, need_weights)
    else:
        raise ValueError(f"unknown graph method '{method}'; choose auto, segments, blocks or edges")
    out = out.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
    return out, (weights if need_weights else None)


def segment_plan(graph: Graph) -> SegmentPlan:
    if "segments" not in graph.plans:
        graph.plans["segments"] = plan_segments(graph)
    return graph.plans["segments"]


def choose_method(graph: Graph, per_edge: bool = False) -> str:
    """Segments (dense per sentence) when the graph has them and they are at least 1/SEGMENT_DENSITY full and
    no per-edge bias or weights are involved; else blocks, unless they would compute far more score entries
    than there are edges (a scattered graph), where edges win. Thresholds: benchmarks/graph_attention.py."""
    key = ("method", per_edge)
    if key not in graph.plans:
        method = None
        if graph.segments is not None and not per_edge:
            plan = segment_plan(graph)
            if plan.entries <= SEGMENT_DENSITY * plan.edges:
                method = "segments"
        if method is None:
            if graph.n_edges == 0:
                method = "edges"
            else:
                method = "blocks" if best_plan(graph).cost <= EDGE_RATIO * graph.n_edges else "edges"
        graph.plans[key] = method
    return graph.plans[key]


SEGMENT_DENSITY = 4  # segments compute every pair of a sentence; past 4 pairs per edge (long sentences under a
# window) blocks compute less
EDGE_RATIO = 16  # rule of thumb from benchmarks/graph_attention.py: per call, edges cost 15-17x dense and blocks
# 1.6-2.8x dense while computing 2-3 entries per edge, so one gathered edge costs roughly 16 block entries
