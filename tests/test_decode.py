"""Greedy decoding: cached == uncached == argmax of the teacher-forced pass; batch-invariant; the rules
that forbid tokens (minimum length, repeated n-grams)."""

import torch

from tformer.config import DecodeConfig, ModelConfig
from tformer.data import Vocab
from tformer.decode import TensorCache, forbid, greedy_search, max_lengths
from tformer.inference import translate_ids
from tformer.model import build_model


def _model(**kw):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, **kw)
    torch.manual_seed(1)
    return build_model(cfg, 15, 15).eval()


def _uncached_greedy(model, src_ids, max_len):
    """Re-run the whole decoder on the prefix at every step: no cache at all."""
    src = torch.tensor([src_ids + [Vocab.eos]])
    enc = model.encode(src, torch.tensor([src.shape[1]]))
    prefix = [Vocab.bos]
    out = []
    for _ in range(max_len):
        hidden = model.decode(torch.tensor([prefix]), torch.tensor([len(prefix)]), enc).hidden
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
            tgt_in = torch.tensor([[Vocab.bos] + hyp])
            src = torch.tensor([src_ids + [Vocab.eos]])
            hidden = model(src, torch.tensor([src.shape[1]]), tgt_in, torch.tensor([tgt_in.shape[1]])).hidden
            logits = model.generator(hidden[0])
            logits[:, [Vocab.pad, Vocab.bos]] = float("-inf")
            pred = logits.argmax(-1).tolist()
            assert pred[: len(hyp)] == hyp
            if len(hyp) < len(src_ids) + 5:
                assert pred[len(hyp)] == Vocab.eos


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
    hyp = greedy_search(step, cache, Vocab.bos, Vocab.eos, torch.tensor([10, 10, 2]))
    assert hyp.tokens == [[7], [7, 7], [7, 7]]  # the last one is cut at its limit of 2


def test_max_lengths():
    assert max_lengths(torch.tensor([0, 4, 10]), 1.2, 10).tolist() == [10, 14, 22]
    assert max_lengths(torch.tensor([3]), 0.0, 0).tolist() == [1]


def test_forbid_min_len_and_repeated_ngrams():
    V = 8
    history = torch.tensor([[4, 5, 6, 4, 5], [4, 4, 4, 4, 4]])  # t = 5
    logp = forbid(torch.zeros(2, V), history, 5, Vocab.eos, min_len=6, no_repeat_ngram=3)
    banned = [set(torch.nonzero(torch.isinf(row))[:, 0].tolist()) for row in logp]
    # row 0 ends in (4, 5): 4 5 6 occurred, so 6 is banned; row 1 ends in (4, 4): 4 4 4 occurred
    specials = {Vocab.pad, Vocab.bos}  # never generated
    assert banned == [specials | {Vocab.eos, 6}, specials | {Vocab.eos, 4}]
    logp = forbid(torch.zeros(2, V), history, 5, Vocab.eos, min_len=5, no_repeat_ngram=2)
    # bigrams: row 0 after 5 -> 6 seen; row 1 after 4 -> 4 seen; </s> allowed at t = min_len
    assert [set(torch.nonzero(torch.isinf(r))[:, 0].tolist()) for r in logp] == [specials | {6}, specials | {4}]
    untouched = forbid(torch.zeros(2, V), history[:, :1], 1, Vocab.eos, min_len=0, no_repeat_ngram=3)
    assert torch.isinf(untouched).sum() == 4  # only <pad> and <s>, in both rows


def test_greedy_min_len_holds_back_eos():
    V = 10

    def step(prev, cache):  # </s> is always the favourite, 7 the runner-up
        logits = torch.full((prev.shape[0], V), -5.0)
        logits[:, 7] = 0.0
        logits[:, Vocab.eos] = 1.0
        return logits, cache

    hyp = greedy_search(step, TensorCache({"x": torch.zeros(2)}), Vocab.bos, Vocab.eos, torch.tensor([10, 10]), min_len=3)
    assert hyp.tokens == [[7, 7, 7], [7, 7, 7]]
