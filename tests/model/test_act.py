"""ACT halting (tformer.model.act) against oracles written out here.

Oracles: the halting rule of the module docstring, position by position in plain Python floats (halt at the
first step whose summed p would pass 1 - epsilon, or at max_steps; that step weighs the remainder); the ponder
cost N + R and its gradient -1 per halting probability that went into R; the time signal's sinusoid by its
formula; the universal transformer on RoPE, graph against dense and cached decoding against the full forward;
the key rows the graph UT projects per step against the rows its running queries read."""

import dataclasses
import math

import pytest
import torch

from tformer.config import ModelConfig, StructureConfig
from tformer.model import build_model
from tformer.model.act import ACT, Ponder

from helpers.models import assert_follows_input_device


def _halting_by_hand(ps: list[float], epsilon: float, max_steps: int) -> list[float]:
    """One position's step weights: p while the running sum stays <= 1 - epsilon, then the remainder."""
    total, weights = 0.0, []
    for s, p in enumerate(ps, 1):
        if s >= max_steps or total + p > 1.0 - epsilon:
            return weights + [1.0 - total]
        weights.append(p)
        total += p
    raise AssertionError("the position never halted")


def _run(active: torch.Tensor, ps: list[torch.Tensor], epsilon: float, max_steps: int):
    """ACT over the halting probabilities of each step -> (weights per step, running per step, ponder)."""
    act = ACT(active, epsilon, max_steps)
    weights, running = [], []
    while not act.done:
        w, r = act.weights(ps[act.step])
        weights.append(w)
        running.append(r)
    return weights, running, act.ponder()


# p values exact in float32: 0.5 + 0.25 lands exactly on 1 - 0.25 (no halt: the sum must pass it)
EXACT = [[0.5, 0.25, 0.125, 0.5, 0.5], [0.75, 0.5, 0.5, 0.5, 0.5], [0.8, 0.1, 0.3, 0.2, 0.2],
         [0.25, 0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 0.0, 0.0], [0.9, 0.9, 0.9, 0.9, 0.9]]


@pytest.mark.parametrize("max_steps", [1, 2, 3, 4, 5])
def test_act_halts_and_weighs_each_position_as_the_rule_written_out(max_steps):
    g = torch.Generator().manual_seed(1)
    rows = EXACT + torch.rand(6, 5, generator=g).tolist()
    active = torch.tensor([True] * 6 + [True, False, True, True, False, True]).view(2, 6)
    ps = [torch.tensor([row[s] for row in rows]).view(2, 6) for s in range(5)]
    weights, running, ponder = _run(active, ps, epsilon=0.25, max_steps=max_steps)
    for i, row in enumerate(rows):
        b, l = divmod(i, 6)
        want = _halting_by_hand(row, 0.25, max_steps) if active[b, l] else []
        got = [float(w[b, l]) for w in weights]
        assert got[:len(want)] == pytest.approx(want, abs=1e-6), (i, max_steps)
        assert all(x == 0 for x in got[len(want):]), (i, max_steps)  # nothing after halting
        assert [bool(r[b, l]) for r in running] == [s < len(want) for s in range(len(weights))]
        assert float(ponder.steps[b, l]) == len(want)
        assert float(ponder.remainders[b, l]) == pytest.approx(want[-1] if want else 0.0, abs=1e-6)
    assert len(weights) == max(len(_halting_by_hand(r, 0.25, max_steps)) for r in rows)  # stops when all halt
    assert ponder.steps.dtype == ponder.remainders.dtype == torch.float32


def test_act_threshold_is_one_minus_epsilon():
    # a summed p of 0.6 passes 1 - 0.5 but not 1 - 0.3: different epsilons, different halting steps
    ps = [torch.tensor([[0.3]]), torch.tensor([[0.3]]), torch.tensor([[0.3]]), torch.tensor([[0.3]])]
    for epsilon, steps in ((0.5, 2), (0.3, 3), (0.01, 4)):
        weights, _, ponder = _run(torch.ones(1, 1, dtype=torch.bool), ps, epsilon, max_steps=10)
        want = _halting_by_hand([0.3] * 4, epsilon, 10)
        assert len(want) == steps and float(ponder.steps) == steps
        assert [float(w) for w in weights] == pytest.approx(want)


def test_ponder_cost_is_steps_plus_remainders_and_its_gradient_flows_through_the_remainders():
    ps = [torch.tensor([[0.5, 0.25, 0.125]], requires_grad=True) for _ in range(4)]
    weights, _, ponder = _run(torch.ones(1, 3, dtype=torch.bool), ps, epsilon=0.01, max_steps=4)
    values = [p.detach()[0].tolist() for p in ps]  # (steps, 3)
    steps = [len(_halting_by_hand([v[i] for v in values], 0.01, 4)) for i in range(3)]
    assert steps == [2, 4, 4]
    want = sum(n + 1.0 - sum(v[i] for v in values[:n - 1]) for i, n in enumerate(steps))
    cost = ponder.cost
    assert float(cost.detach()) == pytest.approx(want)
    cost.backward()
    for s, p in enumerate(ps):  # R = 1 - (the p of the steps before the last): d cost / d p = -1 there
        grad = torch.zeros_like(p) if p.grad is None else p.grad  # the last step's p reaches no output
        torch.testing.assert_close(grad, torch.tensor([[-1.0 if s < n - 1 else 0.0 for n in steps]]))
    assert Ponder(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.5, 0.0]])).cost == 2.5


def test_act_bookkeeping_follows_its_inputs_device():
    active = torch.tensor([[True, False, True]])
    ps = [torch.tensor([[0.5, 0.9, 0.25]]), torch.tensor([[0.75, 0.1, 0.25]]), torch.tensor([[0.1, 0.1, 0.1]])]
    assert_follows_input_device(lambda: _run(active, ps, 0.01, 3))


def _pair(**kw):
    """(dense, graph) universal transformers with the same weights, halting weights spread so that positions
    halt at different steps."""
    cfg = ModelConfig(**{**dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0,
                                norm="pre", kind="universal", max_steps=6, act_bias_init=-1.0, attention="dense"),
                         **kw})
    torch.manual_seed(0)
    dense = build_model(cfg, 20, 20).eval()
    with torch.no_grad():
        for stack in (dense.encoder, dense.decoder):
            stack.halt.weight.normal_(0, 0.5)
    graph = build_model(dataclasses.replace(cfg, attention="graph"), 20, 20).eval()
    graph.load_state_dict(dense.state_dict())
    return dense, graph


def _batch():
    g = torch.Generator().manual_seed(3)
    sl, tl = torch.tensor([9, 2, 5]), torch.tensor([7, 1, 4])
    src, tgt = torch.randint(4, 20, (3, 9), generator=g), torch.randint(4, 20, (3, 7), generator=g)
    src[torch.arange(9)[None] >= sl[:, None]] = 0
    tgt[torch.arange(7)[None] >= tl[:, None]] = 0
    return src, sl, tgt, tl


ROTARY = [dict(positions="rotary"), dict(positions="rotary", encoder_structure=StructureConfig(window=2),
                                          decoder_structure=StructureConfig(window=2), rotary_layout="halves")]


@pytest.mark.parametrize("kw", ROTARY, ids=["full", "window-halves"])
def test_rotary_graph_ut_equals_dense_ut_and_cached_decoding_equals_the_full_forward(kw):
    dense, graph = _pair(**kw)
    src, sl, tgt, tl = _batch()
    with torch.no_grad():
        od, og = dense(src, sl, tgt, tl), graph(src, sl, tgt, tl)
        torch.testing.assert_close(og.padded(), od.padded(), atol=2e-5, rtol=1e-5)
        for pd, pg in zip(od.ponder, og.ponder):
            assert torch.equal(pd.steps, pg.steps)
        steps = od.ponder[1].steps
        assert len(set(steps[steps > 0].tolist())) > 1, "the test wants positions halting at different steps"
        for model, full in ((dense, od), (graph, og)):  # causal: position t of the full forward = prefix 0 .. t
            want = model.generator(full.padded())  # (B, T, V)
            cache = model.init_cache(model.encode(src, sl))
            for t in range(7):
                logits, cache = model.decode_step(tgt[:, t], cache)
                real = t < tl
                torch.testing.assert_close(logits[real], want[real, t], atol=2e-5, rtol=1e-5)
            real = torch.arange(7)[None] < tl[:, None]
            assert torch.equal(cache.steps[real], full.ponder[1].steps[real])


FAST, SLOW = 4, 12  # token ids 4 .. 11 halt at step 1 (p = 1), ids 12 .. 19 never want to (p = 0)


def _steered(attention: str, max_steps: int = 3, d_model: int = 8):
    """A universal transformer whose halting is set by the tokens: embedding coordinate 0 is +-100 and the
    halting units read it alone, so p = sigmoid(+-100 sqrt(D) + ...) is exactly 1 or 0 at every step (the
    layer's residual updates are far smaller)."""
    cfg = ModelConfig(d_model=d_model, n_heads=2, d_ff=16, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0,
                      norm="pre", kind="universal", max_steps=max_steps, attention=attention)
    torch.manual_seed(0)
    model = build_model(cfg, 20, 20).eval()
    with torch.no_grad():
        for embed in (model.src_embed, model.tgt_embed):
            embed.tokens.weight[:, 0] = torch.where(torch.arange(20) < SLOW, 100.0, -100.0)
        for stack in (model.encoder, model.decoder):
            stack.halt.weight.zero_()
            stack.halt.weight[0, 0] = 1.0
            stack.halt.bias.zero_()
    return model


def _count_self_kv_rows(stack) -> list[int]:
    """Rows whose self-attention keys/values the stack projects, call by call."""
    rows, self_kv = [], stack.layer.self_kv

    def counted(x, rotary=None):
        rows.append(x.shape[0] * x.shape[1])
        return self_kv(x, rotary)

    stack.layer.self_kv = counted
    return rows


@pytest.mark.parametrize("attention", ["dense", "graph"])
def test_halting_steered_by_tokens_gives_the_steps_and_remainders_the_rule_says(attention):
    model = _steered(attention, max_steps=3)
    src = torch.tensor([[SLOW, FAST, FAST, FAST, FAST, FAST, FAST, FAST], [FAST, FAST, FAST, FAST, FAST, 0, 0, 0],
                        [FAST + 1, SLOW + 1, FAST, 0, 0, 0, 0, 0]])
    sl = torch.tensor([8, 5, 3])
    tgt = torch.tensor([[FAST, FAST, SLOW, FAST], [SLOW, FAST, 0, 0], [FAST, 0, 0, 0]])
    tl = torch.tensor([4, 2, 1])
    with torch.no_grad():
        out = model(src, sl, tgt, tl)
    for ids, lengths, ponder in ((src, sl, out.ponder[0]), (tgt, tl, out.ponder[1])):
        real = torch.arange(ids.shape[1])[None] < lengths[:, None]
        want_steps = torch.where(ids >= SLOW, 3.0, 1.0) * real  # fast: p = 1 passes 1 - epsilon at once
        assert torch.equal(ponder.steps, want_steps)
        # the remainder 1 - (sum of earlier p): 1 for both kinds (a slow position's p are 0)
        torch.testing.assert_close(ponder.remainders, real.float(), atol=1e-6, rtol=0)
        assert float(ponder.cost) == pytest.approx(float(want_steps.sum() + real.sum()), abs=1e-5)


def test_the_graph_ut_projects_keys_only_for_the_rows_its_running_queries_read():
    model = _steered("graph", max_steps=3, d_model=8)
    # source: sentence 0 (8 = D positions) keeps a slow token; sentences 1 and 2 halt at step 1 and cost nothing
    src = torch.tensor([[SLOW, FAST, FAST, FAST, FAST, FAST, FAST, FAST], [FAST, FAST, FAST, FAST, FAST, 0, 0, 0],
                        [FAST, FAST, FAST, 0, 0, 0, 0, 0]])
    sl = torch.tensor([8, 5, 3])
    # target (causal): a slow query at position p reads keys 0 .. p of its sentence
    tgt = torch.tensor([[FAST, FAST, SLOW, FAST, FAST], [FAST, SLOW, FAST, SLOW, 0], [FAST, FAST, 0, 0, 0]])
    tl = torch.tensor([5, 4, 2])
    enc_rows, dec_rows = _count_self_kv_rows(model.encoder), _count_self_kv_rows(model.decoder)
    with torch.no_grad():
        out = model(src, sl, tgt, tl)
    assert torch.equal(out.ponder[0].steps.amax(1), torch.tensor([3.0, 1.0, 1.0]))  # as steered
    assert enc_rows == [8 + 5 + 3, 8, 8]  # step 1: every row; then sentence 0's 8 rows (running or halted)
    assert dec_rows == [5 + 4 + 2, 3 + 4, 3 + 4]  # then sentence 0 up to position 2, sentence 1 up to 3


@pytest.mark.parametrize("attention", ["dense", "graph"])
def test_the_ut_forward_and_decoding_steps_follow_their_inputs_device(attention):
    model = _steered(attention, max_steps=3)
    with torch.no_grad():
        model.decoder.halt.weight.normal_(0, 0.05)  # hypotheses halt at different steps
    src, sl = torch.tensor([[SLOW, FAST, FAST], [FAST, SLOW, 0]]), torch.tensor([3, 2])
    tgt, tl = torch.tensor([[FAST, SLOW, FAST], [SLOW, FAST, FAST]]), torch.tensor([3, 3])
    with torch.no_grad():
        cache = model.init_cache(model.encode(src, sl))

        def decode():
            c, logits = cache, []
            for t in range(3):
                out, c = model.decode_step(tgt[:, t], c)
                logits.append(out)
            return logits, c.steps, c.anchors, c.self_kv

        assert_follows_input_device(lambda: (model(src, sl, tgt, tl).hidden, model(src, sl, tgt, tl).ponder))
        assert_follows_input_device(decode)


def _never_halting_ut_and_its_vanilla_twin(steps: int, **kw):
    """A UT whose halting units say p = 0 (every position runs max_steps and weighs its last state alone) and
    whose time signal is zero, and a vanilla transformer of `steps` layers each holding the UT's shared layer:
    the same function, written as a stack. Positions must be a bias or a rotation (added ones the UT adds at
    every step)."""
    cfg = ModelConfig(**{**dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention_dropout=0.0,
                                ffn_dropout=0.0, norm="pre", kind="universal", max_steps=steps), **kw})
    torch.manual_seed(0)
    ut = build_model(cfg, 20, 20).eval()
    with torch.no_grad():
        for stack in (ut.encoder, ut.decoder):
            stack.halt.weight.zero_()
            stack.halt.bias.fill_(-200.0)  # p = sigmoid(-200) = 0 in float32
            stack.time.zero_()
    vanilla = build_model(dataclasses.replace(cfg, kind="vanilla", encoder_layers=steps, decoder_layers=steps),
                          20, 20).eval()
    state = {}
    for k, v in ut.state_dict().items():
        if "halt" in k:
            continue
        for i in range(steps if ".layer." in k else 1):
            state[k.replace(".layer.", f".layers.{i}.")] = v
    vanilla.load_state_dict(state)
    return ut, vanilla


BIASES = [dict(positions="rotary"), dict(positions="relative"), dict(positions="tupe"),
          dict(positions="rotary", rotary_layout="halves", decoder_positions="alibi")]


@pytest.mark.parametrize("attention", ["dense", "graph"])
@pytest.mark.parametrize("kw", BIASES, ids=["rotary", "relative", "tupe", "rotary-halves+alibi"])
def test_a_never_halting_ut_is_a_stack_of_its_shared_layer(attention, kw):
    ut, vanilla = _never_halting_ut_and_its_vanilla_twin(3, attention=attention, **kw)
    src, sl, tgt, tl = _batch()
    with torch.no_grad():
        got, want = ut(src, sl, tgt, tl, need_weights=True), vanilla(src, sl, tgt, tl, need_weights=True)
        torch.testing.assert_close(got.padded(), want.padded(), atol=2e-5, rtol=1e-5)
        for ponder, lengths in zip(got.ponder, (sl, tl)):  # every real position ran max_steps
            real = torch.arange(ponder.steps.shape[1])[None] < lengths[:, None]
            assert torch.equal(ponder.steps, 3.0 * real)
        for name, lengths in (("encoder", sl), ("decoder", tl), ("cross", tl)):  # step i's attention = layer i's
            g, w = getattr(got.attentions, name), getattr(want.attentions, name)
            assert len(g) == len(w) == 3
            for a, b in zip(g, w):
                if a.dim() == 4:  # (B, H, queries, keys): the real queries (the UT leaves padding rows alone)
                    real = torch.arange(a.shape[2])[None] < lengths[:, None]  # (B, queries)
                    a, b = a.transpose(1, 2)[real], b.transpose(1, 2)[real]
                torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
        # decoding step by step too (rotary: keys of earlier positions turned by their positions)
        cache, vcache = ut.init_cache(ut.encode(src, sl)), vanilla.init_cache(vanilla.encode(src, sl))
        for t in range(3):
            logits, cache = ut.decode_step(tgt[:, t], cache)
            vlogits, vcache = vanilla.decode_step(tgt[:, t], vcache)
            torch.testing.assert_close(logits, vlogits, atol=2e-5, rtol=1e-5)


def test_the_time_signal_is_the_sinusoid_of_steps_one_to_max_steps():
    model = _steered("dense", max_steps=5, d_model=8)
    t = torch.arange(1, 6, dtype=torch.float64)[:, None]  # steps 1 .. 5
    freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)  # (4,)
    want = torch.stack([torch.sin(t * freq), torch.cos(t * freq)], -1).reshape(5, 8).float()  # sin, cos interleaved
    for stack in (model.encoder, model.decoder):
        torch.testing.assert_close(stack.time, want, rtol=0, atol=1e-6)
        assert "time" not in stack.state_dict()  # recomputed, never saved


def test_the_halting_unit_is_one_sigmoid_unit_starting_at_act_bias_init():
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, kind="universal", max_steps=3, act_bias_init=-1.75)
    model = build_model(cfg, 20, 20)
    x = torch.randn(2, 5, 16)
    for stack in (model.encoder, model.decoder):
        assert stack.halt.weight.shape == (1, 16) and stack.halt.bias.shape == (1,)
        assert torch.all(stack.halt.bias == -1.75)
        bound = math.sqrt(6 / (16 + 1))  # Xavier uniform, fan in 16, fan out 1
        assert stack.halt.weight.abs().max() <= bound and stack.halt.weight.abs().max() > bound / 4
        p = torch.sigmoid(x @ stack.halt.weight[0] - 1.75)  # (2, 5)
        torch.testing.assert_close(stack.halting(x), p)


@pytest.mark.parametrize("attention", ["dense", "graph"])
def test_the_act_stack_returns_no_attention_weights_unless_asked(attention):
    model = _steered(attention, max_steps=2)
    src, sl = torch.tensor([[SLOW, FAST, FAST], [FAST, SLOW, 0]]), torch.tensor([3, 2])
    tgt, tl = torch.tensor([[FAST, SLOW], [SLOW, FAST]]), torch.tensor([2, 2])
    with torch.no_grad():
        enc = model.encode(src, sl)
        side = model.target(tgt, tl)
        memory_layout = enc.layout
        cross = side.layout.cross_mask(memory_layout)
        e = model.encoder.encode(model.source(src, sl))
        d = model.decoder.decode(side, enc.memory, cross)
    assert e.weights == [None, None]  # one entry per step, like a LayerStack's per layer
    assert d.self_weights == [None, None] and d.cross_weights == [None, None]


def test_graph_ut_attention_weights_cover_every_edge_and_equal_the_dense_ut_ones():
    dense, graph = _pair()
    src, sl, tgt, tl = _batch()
    with torch.no_grad():
        od, og = dense(src, sl, tgt, tl, need_weights=True), graph(src, sl, tgt, tl, need_weights=True)
    steps = og.ponder[1].steps
    assert len(set(steps[steps > 0].tolist())) > 1, "the test wants positions halting at different steps"
    for name, q_len, k_len in (("encoder", sl, sl), ("decoder", tl, tl), ("cross", tl, sl)):
        edges = og.attentions.graphs[name]
        q_sent = torch.repeat_interleave(torch.arange(3), q_len)
        q_pos = torch.arange(int(q_len.sum())) - (torch.cumsum(q_len, 0) - q_len)[q_sent]
        k_sent = torch.repeat_interleave(torch.arange(3), k_len)
        k_pos = torch.arange(int(k_len.sum())) - (torch.cumsum(k_len, 0) - k_len)[k_sent]
        got, want = getattr(og.attentions, name), getattr(od.attentions, name)
        assert len(got) == len(want)
        for w, d in zip(got, want):  # per step: (E, H) against (B, H, queries, keys)
            assert w.shape[0] == edges.query.shape[0]  # halted queries too: weights over the whole graph
            q, k = edges.query, edges.key
            torch.testing.assert_close(w, d[q_sent[q], :, q_pos[q], k_pos[k]], atol=2e-6, rtol=1e-5)
