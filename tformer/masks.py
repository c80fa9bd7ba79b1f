"""Masks as pure functions.

Polarity, once for the whole package: **True = may attend** (a real token, an allowed query->key pair).
This is the polarity of `torch.nn.functional.scaled_dot_product_attention`'s boolean `attn_mask`, and the
opposite of `torch.nn.MultiheadAttention`'s `key_padding_mask` (there True = ignore).

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    from tformer.structures import Structure


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """lengths (B,) -> (B, L) bool, True at real tokens (positions < length)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)  # (L,)
    return positions[None, :] < lengths[:, None]  # (B, L)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where key j <= query i: each position sees itself and the past."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def encoder_mask(src_mask: Tensor) -> Tensor:
    """Source self-attention and target->source attention: (B, S) -> (B, 1, 1, S), any query, real keys."""
    return src_mask[:, None, None, :]


def decoder_mask(tgt_mask: Tensor) -> Tensor:
    """Target self-attention: (B, T) -> (B, 1, T, T), real keys at or before the query."""
    T = tgt_mask.shape[1]
    return causal_mask(T, tgt_mask.device)[None, None] & tgt_mask[:, None, None, :]  # (B, 1, T, T)


# --------------------------------------------------------------------------- graphs
#
# A graph is the sparse form of a mask: an edge key -> query for every True entry. Nodes are the rows of
# flattened (batch x length) tensors: query node b * T + t, key node b * S + s for padded (B, T) / (B, S)
# storage, or consecutive packed tokens (B = 1, sentences back to back). Nodes without incoming edges (the
# padding) get a zero output from the graph kernel. Notation: E edges, N nodes, L sentence length.


class Segments(NamedTuple):
    """Dense blocks that hold every edge of a graph: segment i connects queries q_start[i] .. + q_len[i] - 1 to
    keys k_start[i] .. + k_len[i] - 1, the (query, key) position pairs `pattern(q_len, k_len)` lists (None: all).
    The seed's graphs are one segment per sentence; the graph kernel computes them densely, segment by
    segment, with no padding and no waste when the pattern is full."""

    q_start: Tensor  # (B,)
    q_len: Tensor  # (B,)
    k_start: Tensor  # (B,)
    k_len: Tensor  # (B,)
    pattern: Callable[[int, int], Tensor] | None = None  # (Lq, Lk) -> (E_s, 2) int64 position pairs


RESTRICTED_SHAPES = 4  # segment shapes past which a restricted graph becomes an edge list (benchmarks/ut_ponder.py)


class Graph:
    """Edges key -> query over flattened nodes; no edge appears twice. What the graph kernel computes on.

    Built from an edge list (`query`, `key`) or from `segments`, whose edges are listed on first use.
    `plans` keeps what the kernel derives from the graph once, so every layer of a forward shares it."""

    def __init__(self, n_queries: int, n_keys: int, query: Tensor | None = None, key: Tensor | None = None,
                 segments: Segments | None = None, local: "Callable[[], tuple[Tensor, Tensor]] | None" = None) -> None:
        assert (query is None) == (key is None) and (query is not None or segments is not None)
        assert query is None or (query.shape == key.shape and query.dim() == 1), "one query and one key per edge"
        self.n_queries, self.n_keys, self.segments = n_queries, n_keys, segments
        self._edges = None if query is None else (query, key)
        self._segment_of_edge: Tensor | None = None
        self._local = local  # positions inside sentences, when the segments do not tell them (a restriction)
        self.plans: dict = {}

    @property
    def aligned(self) -> bool:
        """True when the i-th query of every segment is position i of its sentence: a positional bias can then
        be added segment by segment (PositionBias.block); else it is gathered per edge."""
        return self.segments is not None and self._local is None

    def restrict(self, rows: Tensor) -> "Graph":
        """The edges whose query is one of `rows` (R,) (increasing query nodes), queries renumbered 0 .. R-1 in
        that order, keys unchanged. A graph of full segments stays segments (query block b holds the kept rows
        of segment b) while they come in at most RESTRICTED_SHAPES shapes (a decoding step's one query per
        hypothesis); otherwise, and for any other graph, an edge list, which the kernel tiles in few calls
        where per-sentence blocks of mixed running counts would make a call per shape. Positions inside
        sentences are kept for a positional bias (a restriction restricted again is an edge list, whose positions
        are its parent's)."""
        rank = torch.full((self.n_queries,), -1, dtype=torch.long, device=rows.device)
        rank[rows] = torch.arange(rows.numel(), device=rows.device)
        seg = self.segments
        if seg is not None and seg.pattern is None and self._local is None:
            owner = torch.searchsorted(seg.q_start + seg.q_len, rows, right=True)  # (R,) segments in order
            counts = torch.bincount(owner, minlength=seg.q_len.numel())  # (B,) kept rows per segment
            live = counts > 0
            span = int(seg.k_len.max()) + 1
            if torch.unique(counts[live] * span + seg.k_len[live]).numel() <= RESTRICTED_SHAPES:
                own_pos = rows - seg.q_start[owner]  # (R,) each kept query's position in its sentence

                def segment_local() -> tuple[Tensor, Tensor]:
                    query, key = child.edges
                    return own_pos[query], key - seg.k_start[child._segment_of_edge]

                child = Graph(rows.numel(), self.n_keys, local=segment_local,
                              segments=Segments(offsets_of(counts), counts, seg.k_start, seg.k_len))
                return child
        keep = rank[self.query] >= 0  # (E,)
        parent = self

        def local() -> tuple[Tensor, Tensor]:
            pq, pk = parent.local_positions()
            return pq[keep], pk[keep]

        return Graph(rows.numel(), self.n_keys, rank[self.query[keep]], self.key[keep],
                     local=local if self.segments is not None or self._local is not None else None)

    def key_rows(self) -> Tensor:
        """(K,) the key nodes at least one edge reads, increasing."""
        seg = self.segments
        if seg is not None and seg.pattern is None:
            live = seg.q_len > 0
            lengths = seg.k_len[live]
            return torch.unique(torch.repeat_interleave(seg.k_start[live], lengths) + packed_positions(lengths))
        return torch.unique(self.key)

    def __repr__(self) -> str:
        return f"Graph({self.n_queries} queries, {self.n_keys} keys, {self.n_edges} edges)"

    @property
    def edges(self) -> tuple[Tensor, Tensor]:
        """(query (E,), key (E,)) int64."""
        if self._edges is None:
            query, key, self._segment_of_edge = _segment_edges(self.segments)
            self._edges = (query, key)
        return self._edges

    def local_positions(self) -> tuple[Tensor, Tensor]:
        """(E,) each: the query's and the key's index inside the segment of each edge (a graph built from
        segments); what a positional bias (PositionBias) is indexed by."""
        if self._local is not None:
            return self._local()
        if self.segments is None:
            raise ValueError("positions inside sentences are known only for graphs built from segments")
        query, key = self.edges
        seg = self._segment_of_edge
        return query - self.segments.q_start[seg], key - self.segments.k_start[seg]

    @property
    def query(self) -> Tensor:
        return self.edges[0]

    @property
    def key(self) -> Tensor:
        return self.edges[1]

    @property
    def n_edges(self) -> int:
        if self._edges is None and self.segments.pattern is None:
            return int((self.segments.q_len * self.segments.k_len).sum())
        return self.query.numel()

    def dense(self) -> Tensor:
        """(n_queries, n_keys) bool: the equivalent mask, True = may attend (for tests and pictures)."""
        mask = torch.zeros(self.n_queries, self.n_keys, dtype=torch.bool, device=self.query.device)
        mask[self.query, self.key] = True
        return mask


def _segment_edges(seg: Segments) -> tuple[Tensor, Tensor, Tensor]:
    """(query, key, segment of each edge), (E,) each."""
    if seg.pattern is None:  # every pair: vectorised ranges
        q_nodes = torch.repeat_interleave(seg.q_start, seg.q_len) + packed_positions(seg.q_len)  # (Nq,)
        sentence = torch.repeat_interleave(torch.arange(seg.q_len.numel(), device=seg.q_len.device), seg.q_len)
        query, key = _ranges(q_nodes, seg.k_start[sentence], seg.k_len[sentence])
        return query, key, torch.repeat_interleave(sentence, seg.k_len[sentence])
    queries, keys, segments = [], [], []
    span = int(seg.k_len.max()) + 1
    for shape in torch.unique(seg.q_len * span + seg.k_len).tolist():  # one template per distinct shape
        lq, lk = divmod(shape, span)
        if lq == 0 or lk == 0:  # an empty sentence: no pairs
            continue
        rows = ((seg.q_len == lq) & (seg.k_len == lk)).nonzero()[:, 0]  # (n,)
        i, j = seg.pattern(lq, lk).to(seg.q_len.device).unbind(1)  # (E_s,) each
        queries.append((seg.q_start[rows, None] + i[None]).reshape(-1))
        keys.append((seg.k_start[rows, None] + j[None]).reshape(-1))
        segments.append(rows.repeat_interleave(i.numel()))
    if not queries:
        none = torch.zeros(0, dtype=torch.long, device=seg.q_len.device)
        return none, none, none
    return torch.cat(queries), torch.cat(keys), torch.cat(segments)


class PositionBias:
    """An attention bias that depends on positions alone (TUPE), for the graph kernel: `table` (H, Lq, Lk)
    holds the value for the i-th query and j-th key of a segment (a sentence), for every segment alike.
    The kernel adds table[:, :lq, :lk] to a whole segment, or gathers one value per edge (`per_edge`)."""

    def __init__(self, table: Tensor) -> None:
        self.table = table  # (H, Lq, Lk)

    def block(self, lq: int, lk: int) -> Tensor:
        """(1, H, lq, lk): the bias of a segment of lq queries and lk keys."""
        return self.table[None, :, :lq, :lk]

    def per_edge(self, graph: Graph) -> Tensor:
        """(E, H), gathered once per graph and bias (the layers of a forward share it; kept on the graph)."""
        key = ("bias", self)
        if key not in graph.plans:
            pq, pk = graph.local_positions()
            graph.plans[key] = self.table[:, pq, pk].t()
        return graph.plans[key]


def graph_from_mask(mask: Tensor) -> Graph:
    """(B, T, S) or (T, S) bool mask -> the graph of its True entries over nodes b * T + t, b * S + s."""
    mask = mask if mask.dim() == 3 else mask[None]
    B, T, S = mask.shape
    b, t, s = mask.nonzero(as_tuple=True)
    return Graph(B * T, B * S, b * T + t, b * S + s)


def offsets_of(lengths: Tensor) -> Tensor:
    """(B,) lengths -> (B,) first node of each sentence when packed back to back."""
    return torch.cumsum(lengths, 0) - lengths


def packed_positions(lengths: Tensor) -> Tensor:
    """(B,) lengths -> (N,) position of every packed token inside its sentence."""
    n = int(lengths.sum())
    return torch.arange(n, device=lengths.device) - torch.repeat_interleave(offsets_of(lengths), lengths, 0)


def _ranges(q_nodes: Tensor, k_start: Tensor, k_count: Tensor) -> tuple[Tensor, Tensor]:
    """Query node q_nodes[i] attends keys k_start[i] .. k_start[i] + k_count[i] - 1 (vectorised)."""
    query = torch.repeat_interleave(q_nodes, k_count)  # (E,)
    first = torch.cumsum(k_count, 0) - k_count  # (Nq,) first edge of each query
    within = torch.arange(query.numel(), device=q_nodes.device) - torch.repeat_interleave(first, k_count)
    return query, torch.repeat_interleave(k_start, k_count) + within  # (E,) each


def bipartite_graph(q_lengths: Tensor, k_lengths: Tensor, q_offsets: Tensor | None = None,
                    k_offsets: Tensor | None = None, n_queries: int | None = None,
                    n_keys: int | None = None) -> Graph:
    """Every query token of sentence b attends every key token of sentence b (target -> source).

    Offsets default to packed sentences (`offsets_of`); pass b * T / b * S for padded storage."""
    q_offsets = offsets_of(q_lengths) if q_offsets is None else q_offsets
    k_offsets = offsets_of(k_lengths) if k_offsets is None else k_offsets
    return Graph(int(q_lengths.sum()) if n_queries is None else n_queries,
                 int(k_lengths.sum()) if n_keys is None else n_keys,
                 segments=Segments(q_offsets, q_lengths, k_offsets, k_lengths))


def self_graph(lengths: Tensor, structure: "Structure", causal: bool, offsets: Tensor | None = None,
               n_nodes: int | None = None) -> Graph:
    """Self-attention inside each sentence: the structure's pairs, shifted to each sentence's nodes.

    The seed's graphs are `structure=FULL`: complete (encoder) and causal (decoder, `causal=True`)."""
    offsets = offsets_of(lengths) if offsets is None else offsets
    n_nodes = int(lengths.sum()) if n_nodes is None else n_nodes
    if structure.is_full and not causal:
        pattern = None
    else:
        def pattern(lq: int, lk: int) -> Tensor:
            return structure.edges(lq, causal)
    return Graph(n_nodes, n_nodes, segments=Segments(offsets, lengths, offsets, lengths, pattern))
