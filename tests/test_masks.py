"""Masks on small cases written out by hand. Polarity: True = may attend."""

import torch

from tformer.masks import causal_mask, decoder_mask, encoder_mask, padding_mask

T, F = True, False


def test_padding_mask():
    assert padding_mask(torch.tensor([3, 1, 0])).tolist() == [[T, T, T], [T, F, F], [F, F, F]]
    assert padding_mask(torch.tensor([2]), max_len=4).tolist() == [[T, T, F, F]]


def test_causal_mask():
    assert causal_mask(3).tolist() == [[T, F, F], [T, T, F], [T, T, T]]


def test_encoder_mask_broadcasts_over_heads_and_queries():
    m = encoder_mask(padding_mask(torch.tensor([2, 3])))
    assert m.shape == (2, 1, 1, 3)
    assert m[0, 0, 0].tolist() == [T, T, F]


def test_decoder_mask_is_causal_and_hides_padding():
    m = decoder_mask(padding_mask(torch.tensor([3, 2])))
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].tolist() == [[T, F, F], [T, T, F], [T, T, T]]
    assert m[1, 0].tolist() == [[T, F, F], [T, T, F], [T, T, F]]  # the padded key is never seen


# --------------------------------------------------------------------------- graphs, against masks written out

import pytest  # noqa: E402

from helpers.models import assert_follows_input_device  # noqa: E402
from tformer.masks import (Graph, PositionBias, Segments, bipartite_graph, graph_from_mask,  # noqa: E402
                           packed_positions, self_graph)
from tformer.structures import FULL  # noqa: E402


def rectangle(lq: int, lk: int) -> torch.Tensor:
    """Every (query, key) pair of an lq x lk block, made on the CPU whatever the default device."""
    q, k = torch.meshgrid(torch.arange(lq, device="cpu"), torch.arange(lk, device="cpu"), indexing="ij")
    return torch.stack([q.reshape(-1), k.reshape(-1)], 1)


def lower(lq: int, lk: int) -> torch.Tensor:
    pairs = rectangle(lq, lk)
    return pairs[pairs[:, 1] <= pairs[:, 0]]


def test_masks_follow_their_inputs_device():
    lengths, rows = torch.tensor([3, 1, 0]), torch.tensor([2, 3])  # made here: inside, they would be on meta
    assert_follows_input_device(padding_mask, lengths)
    assert_follows_input_device(decoder_mask, padding_mask(lengths))
    assert_follows_input_device(packed_positions, lengths)
    for pattern in (None, lower):
        segments = Segments(torch.tensor([0, 3, 4]), lengths, torch.tensor([0, 3, 4]), lengths, pattern)
        assert_follows_input_device(lambda: Graph(4, 4, segments=segments).edges)
        assert_follows_input_device(lambda: Graph(4, 4, segments=segments).dense())
        assert_follows_input_device(lambda: Graph(4, 4, segments=segments).restrict(rows).edges)
    empty = Segments(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), lower)
    assert_follows_input_device(lambda: Graph(0, 0, segments=empty).edges)


def test_graph_dense_is_a_bool_mask_of_its_edges():
    g = graph_from_mask(torch.tensor([[T, F], [T, T]]))  # a (T, S) mask, no batch dimension
    assert (g.n_queries, g.n_keys) == (2, 2)
    assert g.dense().dtype == torch.bool
    assert g.dense().tolist() == [[T, F], [T, T]]
    assert graph_from_mask(torch.tensor([[[F, T]], [[T, T]]])).dense().tolist() == [[F, T, F, F], [F, F, T, T]]


def test_segments_of_different_query_and_key_lengths_list_each_block_with_its_pattern():
    # two blocks of the same query length and different key lengths: 2 x 2 and 2 x 3, full rectangles
    segments = Segments(torch.tensor([0, 2]), torch.tensor([2, 2]), torch.tensor([0, 2]), torch.tensor([2, 3]),
                        rectangle)
    assert Graph(4, 5, segments=segments).dense().tolist() == [
        [T, T, F, F, F], [T, T, F, F, F], [F, F, T, T, T], [F, F, T, T, T]]
    assert Graph(4, 5, segments=segments._replace(pattern=None)).dense().tolist() == [
        [T, T, F, F, F], [T, T, F, F, F], [F, F, T, T, T], [F, F, T, T, T]]


def test_empty_sentences_give_no_edges_and_never_reach_the_pattern():
    calls = []

    def causal(lq, lk):
        calls.append((lq, lk))
        return lower(lq, lk)

    g = self_graph(torch.tensor([0, 2, 0, 1]), FULL, causal=True)
    assert g.dense().tolist() == [[T, F, F], [T, T, F], [F, F, T]]
    segments = Segments(torch.tensor([0, 0, 2]), torch.tensor([0, 2, 1]), torch.tensor([0, 0, 2]),
                        torch.tensor([3, 2, 1]), causal)
    assert Graph(3, 3, segments=segments).dense().tolist() == [[T, F, F], [T, T, F], [F, F, T]]
    assert all(lq > 0 and lk > 0 for lq, lk in calls), calls
    for pattern in (causal, None):
        none = Graph(0, 0, segments=Segments(*(torch.tensor([0, 0]),) * 4, pattern))
        query, key = none.edges
        assert query.shape == key.shape == (0,) and query.dtype == key.dtype == torch.long
        assert none.n_edges == 0 and none.local_positions()[0].shape == (0,)


def test_restricted_graphs_keep_positions_inside_sentences():
    # sentences of 3 and 2 tokens packed as nodes 0-2 and 3-4; keep queries 2 and 4 (the last of each)
    for pattern_graph in (self_graph(torch.tensor([3, 2]), FULL, causal=False),
                          self_graph(torch.tensor([3, 2]), FULL, causal=True),
                          bipartite_graph(torch.tensor([3, 2]), torch.tensor([3, 2]))):
        child = pattern_graph.restrict(torch.tensor([2, 4]))
        assert not child.aligned  # query i of a block is not position i of its sentence
        query, key = child.edges
        pq, pk = child.local_positions()
        parent_q = torch.tensor([2, 4])[query]
        assert (pq == parent_q - torch.tensor([0, 0, 0, 3, 3])[parent_q]).all()  # position of the kept query
        assert (pk == key - torch.tensor([0, 0, 0, 3, 3])[key]).all()
        assert (pq[query == 0] == 2).all() and (pq[query == 1] == 1).all() and len(pq) > 0


def test_local_positions_need_segments():
    g = Graph(2, 2, torch.tensor([0, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^positions inside sentences are known only for graphs built from segments$"):
        g.local_positions()


def test_a_graph_needs_one_query_and_one_key_per_edge():
    with pytest.raises(AssertionError):
        Graph(2, 2)  # neither edges nor segments
    with pytest.raises(AssertionError):
        Graph(2, 2, query=torch.tensor([0, 1]))  # a query list without keys
    with pytest.raises(AssertionError, match="^one query and one key per edge$"):
        Graph(2, 2, torch.tensor([0, 1]), torch.tensor([0]))


def test_each_position_bias_is_gathered_for_its_own_table():
    g = self_graph(torch.tensor([2]), FULL, causal=False)
    a, b = PositionBias(torch.arange(4.0).reshape(1, 2, 2)), PositionBias(-torch.arange(4.0).reshape(1, 2, 2))
    assert a.per_edge(g)[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert b.per_edge(g)[:, 0].tolist() == [0.0, -1.0, -2.0, -3.0]  # not a's, cached on the same graph
    assert a.per_edge(g) is a.per_edge(g)


def kept_edges_oracle(parent: Graph, q_start: list[int], k_start: list[int], rows: list[int]):
    """The parent's edges whose query is in `rows`, queries renumbered by their rank in `rows`, with each edge's
    query and key position inside its sentence: (query, key, query position, key position) tuples, sorted."""
    query, key = parent.edges
    sentence = lambda node, starts: max(i for i, s in enumerate(starts) if s <= node)  # noqa: E731
    out = []
    for q, k in zip(query.tolist(), key.tolist()):
        if q in rows:
            b = sentence(q, q_start)
            out.append((rows.index(q), k, q - q_start[b], k - k_start[sentence(k, k_start)]))
    return sorted(out)


@pytest.mark.parametrize("q_len, k_len, kept, stays_segments", [
    # (kept rows per sentence, key length) shapes: (4, 1) (1, 2) (1, 3) (2, 2) -- exactly RESTRICTED_SHAPES
    ([4, 1, 2, 3], [1, 2, 3, 2], [4, 1, 1, 2], True),
    # the same, and a sentence none of whose rows is kept: its key length is no shape of the restriction
    ([4, 1, 2, 3, 1], [1, 2, 3, 2, 5], [4, 1, 1, 2, 0], True),
    # five shapes: (5, 1) (1, 2) (1, 3) (2, 2) (3, 3) -- an edge list
    ([5, 1, 2, 3, 3], [1, 2, 3, 2, 3], [5, 1, 1, 2, 3], False),
    # five shapes again, two of them (1, 3) and (2, 1): a key length at the largest and one row more at 1
    ([1, 2, 1, 3, 2], [3, 1, 2, 2, 2], [1, 2, 1, 3, 2], False),
])
def test_restrict_stays_segments_up_to_restricted_shapes_and_keeps_the_edges_of_the_kept_queries(
        q_len, k_len, kept, stays_segments):
    """What restrict documents: a graph of full segments stays segments while the kept rows come in at most
    RESTRICTED_SHAPES (rows kept, key length) shapes over the sentences that keep any, else an edge list; either
    way, exactly the parent's edges of the kept queries, with their positions inside the sentences."""
    from tformer.masks import RESTRICTED_SHAPES, bipartite_graph
    assert RESTRICTED_SHAPES == 4  # the cases above are written around it
    q_start = [sum(q_len[:i]) for i in range(len(q_len))]
    k_start = [sum(k_len[:i]) for i in range(len(k_len))]
    rows = [q_start[b] + i for b in range(len(q_len)) for i in range(q_len[b] - kept[b], q_len[b])]  # the last ones
    parent = bipartite_graph(torch.tensor(q_len), torch.tensor(k_len))
    child = parent.restrict(torch.tensor(rows))
    assert (child.segments is not None) == stays_segments
    if stays_segments:
        assert child.segments.q_len.tolist() == kept and child.segments.k_len.tolist() == k_len
    query, key = child.edges
    pq, pk = child.local_positions()
    got = sorted(zip(query.tolist(), key.tolist(), pq.tolist(), pk.tolist()))
    assert got == kept_edges_oracle(parent, q_start, k_start, rows)
    assert child.dense().tolist() == parent.dense()[torch.tensor(rows)].tolist()
    # a restriction restricted again (a later step of the same search): the parent's edges of the rows left
    again = list(range(0, len(rows), 2))
    grandchild = child.restrict(torch.tensor(again))
    query, key = grandchild.edges
    pq, pk = grandchild.local_positions()
    got = sorted(zip(query.tolist(), key.tolist(), pq.tolist(), pk.tolist()))
    assert got == kept_edges_oracle(parent, q_start, k_start, [rows[i] for i in again])


def test_key_rows_are_the_keys_some_edge_reads():
    """Keys no edge reads are left out: a sentence without queries, and keys a pattern never pairs."""
    lengths = torch.tensor([2, 0, 3])
    full = Segments(torch.tensor([0, 2, 2]), lengths, torch.tensor([0, 2, 2]), torch.tensor([2, 4, 3]))
    assert Graph(5, 9, segments=full).key_rows().tolist() == [0, 1, 2, 3, 4]  # keys 5-8: nobody asks
    diagonal = lambda lq, lk: torch.stack([torch.arange(lq)] * 2, 1)  # noqa: E731  query i reads key i only
    wide = Segments(torch.tensor([0, 2]), torch.tensor([2, 3]), torch.tensor([0, 4]), torch.tensor([4, 5]), diagonal)
    assert Graph(5, 9, segments=wide).key_rows().tolist() == [0, 1, 4, 5, 6]
