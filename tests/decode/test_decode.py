"""Greedy decoding: cached == uncached == argmax of the teacher-forced pass; batch-invariant; the rules
that forbid tokens (minimum length, repeated n-grams); batches by token budget; the top-p (nucleus) boundary."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.config import DecodeConfig, ModelConfig
from tformer.data import Vocab
from tformer.decode import TensorCache, filter_logits, max_lengths, rules_for
from tformer.decode.sampling import top_p_mask
from tformer.inference import batching, translate_ids
from tformer.model import build_model

from helpers.models import TEST_DEVICE, on_device
from helpers.search import run_greedy

pytestmark = pytest.mark.device


def _model(**kw):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, **kw)
    torch.manual_seed(1)
    return on_device(build_model(cfg, 15, 15).eval())


def _uncached_greedy(model, src_ids, max_len):
    """Re-run the whole decoder on the prefix at every step: no cache at all."""
    src = torch.tensor([src_ids + [Vocab.eos]], device=TEST_DEVICE)
    enc = model.encode(src, torch.tensor([src.shape[1]], device=TEST_DEVICE))
    prefix = [Vocab.bos]
    out = []
    for _ in range(max_len):
        tgt = torch.tensor([prefix], device=TEST_DEVICE)
        hidden = model.decode(tgt, torch.tensor([len(prefix)], device=TEST_DEVICE), enc).hidden
        logits = model.generator(hidden[0, -1])
        logits[[Vocab.pad, Vocab.bos]] = float("-inf")  # never generated
        tok = int(logits.argmax())
        if tok == Vocab.eos:
            break
        out.append(tok)
        prefix.append(tok)
    return out


@torch.no_grad()
def test_cached_greedy_equals_uncached_and_teacher_forced_argmax():
    for norm in ("post", "pre"):
        model = _model(norm=norm)
        cfg = DecodeConfig(max_len_a=1.0, max_len_b=5)
        sources = [[4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 4, 5, 6, 7]]
        hyps = [n[0] for n in translate_ids(model, sources, cfg).tokens]
        for src_ids, hyp in zip(sources, hyps):
            assert hyp == _uncached_greedy(model, src_ids, len(src_ids) + 5)
            # the teacher-forced pass over <s> + hyp predicts hyp (+ </s> unless cut at the limit)
            tgt_in = torch.tensor([[Vocab.bos] + hyp], device=TEST_DEVICE)
            src = torch.tensor([src_ids + [Vocab.eos]], device=TEST_DEVICE)
            lengths = torch.tensor([src.shape[1], tgt_in.shape[1]], device=TEST_DEVICE)
            hidden = model(src, lengths[:1], tgt_in, lengths[1:]).hidden
            logits = model.generator(hidden[0])
            logits[:, [Vocab.pad, Vocab.bos]] = float("-inf")
            pred = logits.argmax(-1).tolist()
            assert pred[: len(hyp)] == hyp
            if len(hyp) < len(src_ids) + 5:
                assert pred[len(hyp)] == Vocab.eos


@torch.no_grad()
def test_the_cache_holds_the_memory_keys_and_values_contiguous_for_every_step_to_read():
    """A decoder's cache holds each layer's cross-attention keys and values (B, H, S, Dh) in memory of their own:
    every decoding step reads them, and the strided views `project_kv` gives made each step's matmul copy them
    first (beam search's folded cross-attention, the dense kernel, 3.7-4x slower). They are the same values."""
    for kind in ("standard", "universal"):
        model = _model(kind=kind, max_steps=3) if kind == "universal" else _model()
        src = torch.tensor([[4, 5, 6, 7, Vocab.eos], [9, 10, Vocab.eos, 0, 0]], device=TEST_DEVICE)
        enc = model.encode(src, torch.tensor([5, 3], device=TEST_DEVICE))
        cache = model.init_cache(enc)
        layers = model.decoder.layers if kind == "standard" else [model.decoder.layer]
        assert len(cache.cross) == len(layers)
        for (k, v), layer in zip(cache.cross, layers):
            assert k.is_contiguous() and v.is_contiguous(), kind
            want_k, want_v = layer.cross_attn.project_kv(enc.memory)
            assert torch.equal(k, want_k) and torch.equal(v, want_v), kind


@torch.no_grad()
def test_sources_without_padding_skip_the_cross_mask_and_give_the_same_logits():
    """A batch whose sources are all their full width (one sentence, or one length) starts a cache that says so
    (`full_sources`): its steps attend to the memory with no mask. Oracle: the same steps with the all-True mask
    (full_sources off), equal within float32 rounding; a padded batch keeps the mask, and a reorder keeps the
    flag."""
    import dataclasses

    from tformer.model.layout import Step

    for kind in ("post", "pre", "universal"):
        model = _model(kind="universal", max_steps=3) if kind == "universal" else _model(norm=kind)
        full = torch.tensor([[4, 5, 6, 7, Vocab.eos], [9, 10, 11, 12, Vocab.eos]], device=TEST_DEVICE)
        padded = torch.tensor([[4, 5, 6, 7, Vocab.eos], [9, 10, Vocab.eos, 0, 0]], device=TEST_DEVICE)
        assert not model.init_cache(model.encode(padded, torch.tensor([5, 3], device=TEST_DEVICE))).full_sources
        cache = model.init_cache(model.encode(full, torch.tensor([5, 5], device=TEST_DEVICE)))
        assert cache.full_sources and cache.reorder(torch.tensor([1, 0], device=TEST_DEVICE)).full_sources
        assert Step(2, 0, cache.src_mask, model.decoder_structure, False, cache.full_sources).cross_mask() is None
        masked = dataclasses.replace(cache, full_sources=False)
        tokens = torch.tensor([Vocab.bos, Vocab.bos], device=TEST_DEVICE)
        for _ in range(3):
            got, cache = model.decode_step(tokens, cache)
            want, masked = model.decode_step(tokens, masked)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert cache.full_sources and not masked.full_sources, kind
            tokens = got.argmax(-1)


@torch.no_grad()
def test_batch_of_seven_equals_each_alone():
    model = _model(norm="pre")
    g = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 15, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (7,), generator=g)]
    cfg = DecodeConfig(max_len_a=1.5, max_len_b=3, batch_size=7)
    batched = translate_ids(model, sources, cfg)
    for i, s in enumerate(sources):
        alone = translate_ids(model, [s], cfg)
        assert alone.tokens[0] == batched.tokens[i]
        assert abs(alone.scores[0][0] - batched.scores[i][0]) < 1e-4


def test_greedy_search_on_a_scripted_step_function():
    """A step function that knows nothing of models: row r emits r+1 tokens of value 7, then </s>."""
    V = 10

    def step(prev, cache):
        t = cache["t"][0].item()
        rows = cache["row"]
        logits = torch.full((rows.shape[0], V), -5.0)
        logits[:, 7] = 0.0
        logits[rows <= t - 1, Vocab.eos] = 1.0
        return logits, TensorCache({"row": rows, "t": cache["t"] + 1})

    cache = TensorCache({"row": torch.arange(3), "t": torch.zeros(3, dtype=torch.long)})
    hyp = run_greedy(step, cache, torch.tensor([10, 10, 2]))
    assert hyp.tokens == [[7], [7, 7], [7, 7]]  # the last one is cut at its limit of 2


def test_max_lengths():
    assert max_lengths(torch.tensor([0, 4, 10]), 1.2, 10).tolist() == [10, 14, 22]
    assert max_lengths(torch.tensor([3]), 0.0, 0).tolist() == [1]


def forbid(scores, history, t, min_len, no_repeat_ngram):
    """The rules' masks for a batch of rows whose tokens so far are `history` (N, t), as every search applies
    them (Rules.scores; the scores taken as they are)."""
    rules, _ = rules_for(DecodeConfig(min_len=min_len, no_repeat_ngram=no_repeat_ngram), torch.full((len(scores),), 9))
    return rules.scores(scores, SimpleNamespace(t=t, history=history), lambda x: x)[0]


def test_forbid_min_len_and_repeated_ngrams():
    V = 8
    history = torch.tensor([[4, 5, 6, 4, 5], [4, 4, 4, 4, 4]])  # t = 5
    logp = forbid(torch.zeros(2, V), history, 5, min_len=6, no_repeat_ngram=3)
    banned = [set(torch.nonzero(torch.isinf(row))[:, 0].tolist()) for row in logp]
    # row 0 ends in (4, 5): 4 5 6 occurred, so 6 is banned; row 1 ends in (4, 4): 4 4 4 occurred
    specials = {Vocab.pad, Vocab.bos}  # never generated
    assert banned == [specials | {Vocab.eos, 6}, specials | {Vocab.eos, 4}]
    logp = forbid(torch.zeros(2, V), history, 5, min_len=5, no_repeat_ngram=2)
    # bigrams: row 0 after 5 -> 6 seen; row 1 after 4 -> 4 seen; </s> allowed at t = min_len
    assert [set(torch.nonzero(torch.isinf(r))[:, 0].tolist()) for r in logp] == [specials | {6}, specials | {4}]
    untouched = forbid(torch.zeros(2, V), history[:, :1], 1, min_len=0, no_repeat_ngram=3)
    assert torch.isinf(untouched).sum() == 4  # only <pad> and <s>, in both rows


def test_greedy_min_len_holds_back_eos():
    V = 10

    def step(prev, cache):  # </s> is always the favourite, 7 the runner-up
        logits = torch.full((prev.shape[0], V), -5.0)
        logits[:, 7] = 0.0
        logits[:, Vocab.eos] = 1.0
        return logits, cache

    hyp = run_greedy(step, TensorCache({"x": torch.zeros(2)}), torch.tensor([10, 10]), min_len=3)
    assert hyp.tokens == [[7, 7, 7], [7, 7, 7]]


# ----------------------------------------------------------------------------- batches by token budget


@torch.no_grad()
def test_batch_tokens_packs_padded_source_tokens_and_changes_no_output():
    """decode.batch_tokens > 0: every batch the encoder sees holds at most that many padded source tokens
    (sentences x longest, </s> included) unless one sentence alone is longer, sentences go longest first, and
    the outputs are those of one sentence at a time."""
    model = _model(norm="pre")
    g = torch.Generator().manual_seed(5)
    sources = [torch.randint(4, 15, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (15,), generator=g)]
    seen = []
    encode = model.encode

    def spy(src, src_lengths, *args, **kwargs):
        seen.append((src.shape[0], src.shape[1], src_lengths.tolist()))
        return encode(src, src_lengths, *args, **kwargs)

    model.encode = spy
    for strategy in ("greedy", "beam"):
        one = DecodeConfig(strategy=strategy, beam_size=3, max_len_a=1.5, max_len_b=3, batch_size=1)
        want = translate_ids(model, sources, one)
        seen.clear()
        got = translate_ids(model, sources, DecodeConfig(strategy=strategy, beam_size=3, max_len_a=1.5, max_len_b=3,
                                                         batch_tokens=24))
        assert got.tokens == want.tokens
        assert sum(b for b, _, _ in seen) == len(sources)
        assert all(b * s <= 24 or b == 1 for b, s, _ in seen)
        assert 1 < len(seen) < len(sources)  # packed, several sentences a batch
        firsts = [max(lengths) for _, _, lengths in seen]
        assert firsts == sorted(firsts, reverse=True)  # longest first


def test_batching_reads_batch_tokens_unless_the_caller_counts_tokens_itself():
    assert batching(DecodeConfig(batch_size=30)) == (30, "examples")
    assert batching(DecodeConfig(batch_size=30, batch_tokens=500)) == (500, "tokens")
    assert batching(DecodeConfig(batch_size=30, batch_tokens=500), "tokens") == (30, "tokens")
    assert batching(DecodeConfig(batch_size=30), "tokens") == (30, "tokens")


# ----------------------------------------------------------------------------- top-p (nucleus) boundary


def _kept(mask):
    return mask[0].nonzero()[:, 0].tolist()


def test_top_p_keeps_the_minimal_set_when_the_sum_reaches_p_exactly():
    """0.5, 0.25, 0.125, 0.125 and their sums are exact in float32: p = 0.75 is reached by the first two."""
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]])  # sorted: 1, 3, then 0 and 2 (ties in index order)
    assert _kept(top_p_mask(probs, 0.75)) == [1, 3]
    assert _kept(top_p_mask(probs, 0.5)) == [1]
    assert _kept(top_p_mask(probs, 0.1)) == [1]  # the most probable token always stays
    assert _kept(top_p_mask(probs, float(np.nextafter(np.float32(0.75), np.float32(1))))) == [0, 1, 3]
    assert _kept(top_p_mask(probs, 0.875)) == [0, 1, 3]  # of the tied 0.125s, the first
    assert _kept(top_p_mask(probs, 1.0)) == [0, 1, 2, 3]
    # through the logits: uniform logits give exact 1/8s, so the sums 0.25, 0.375 ... are exact too
    kept = lambda lp: torch.isfinite(lp[0]).nonzero()[:, 0].tolist()  # noqa: E731
    flat = torch.zeros(1, 8)
    assert kept(filter_logits(flat, 1.0, 0, 0.25)) == [0, 1]
    assert kept(filter_logits(flat, 1.0, 0, 0.375)) == [0, 1, 2]
    assert kept(filter_logits(flat, 1.0, 0, 0.3750001)) == [0, 1, 2, 3]
    assert kept(filter_logits(flat, 1.0, 0, 1.0)) == list(range(8))
    assert filter_logits(flat, 1.0, 0, 0.25).exp()[0, :2].tolist() == [0.5, 0.5]  # renormalised


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=40), st.data())
def test_top_p_keeps_the_minimal_prefix_whose_float32_sum_reaches_p(weights, data):
    """Oracle: the tokens sorted by probability (ties by index), each prefix summed exactly (math.fsum) and
    rounded once to float32; the kept set is the shortest prefix whose sum is >= p (p in float32), or all.
    Probabilities >= 2**-26 keep every such sum exact in the float64 accumulator of torch's CPU cumsum, so the
    oracle's float32 sums are the ones the code compares. p is drawn at, just under and just over a sum."""
    w = np.asarray(weights)
    probs = (w / w.sum()).astype(np.float32)  # (V,)
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    sums = [np.float32(math.fsum(float(probs[j]) for j in order[: k + 1])) for k in range(len(order))]
    how = data.draw(st.sampled_from(["at", "under", "over", "any"]))
    if how == "any":
        p = data.draw(st.floats(1e-6, 1.0))
    else:
        s = sums[data.draw(st.integers(0, len(sums) - 1))]
        p = float(s if how == "at" else np.nextafter(s, np.float32(0 if how == "under" else 2)))
    if not 0 < p <= 1:
        return
    n = next((k + 1 for k, s in enumerate(sums) if s >= np.float32(p)), len(order))
    assert sorted(_kept(top_p_mask(torch.from_numpy(probs)[None], p))) == sorted(order[:n])


def test_top_p_of_one_filters_nothing_even_where_the_float32_sum_reaches_one_early():
    # the sorted probabilities' float32 cumulative sum is 1.0 before the least probable token, yet top_p = 1.0
    # (off) keeps every token: filter_logits is then the plain log-softmax
    logits = torch.tensor([[10.0, 0.0, -30.0]])
    assert logits.softmax(-1).sort(descending=True).values.cumsum(-1)[0, -2] >= 1.0
    assert torch.equal(filter_logits(logits, 1.0, 0, 1.0), torch.log_softmax(logits, dim=-1))
