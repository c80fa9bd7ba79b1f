"""Property-based and fuzz tests (hypothesis): invariants that must hold for every input, checked on
generated ones. Each property states its oracle: a round trip, a brute-force recomputation, a run on a
smaller batch, or "a result or a ValueError naming the file, never anything else".

Profiles (tests/helpers/profiles.py): `ci` (default; derandomized, so CI runs are reproducible), `random` (the same
counts drawn afresh; --hypothesis-seed=N repeats a run) and `long` (random, 20x the examples):
    HYPOTHESIS_PROFILE=long pytest tests/test_properties.py --hypothesis-show-statistics
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import string

import pytest
import torch
from helpers.profiles import SCALE
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tformer.config import Config, ConfigError, DecodeConfig, ModelConfig, load_config
from tformer.data.batching import token_budget_batches
from tformer.data.corpus import normalize, read_aligned, read_lines, read_tsv
from tformer.data.tokenizer import WordTokenizer, train_sentencepiece
from tformer.data.vocab import Vocab
from tformer.decode.common import max_lengths
from tformer.inference import translate_ids
from tformer.masks import bipartite_graph, decoder_mask, padding_mask, self_graph
from tformer.model import build_model
from tformer.structures import FULL


# ------------------------------------------------------------------------------------------ tokenizers

ALPHABET = string.ascii_letters + string.digits + ".,;:!?'-()" + "éèàüöäßçñ"
WORDS = st.text(alphabet=ALPHABET, min_size=1, max_size=12)


@pytest.fixture(scope="module")
def spm():
    import random

    rng = random.Random(0)  # every character of ALPHABET appears, so each can be encoded
    sentences = [" ".join("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8)))
                          for _ in range(rng.randint(1, 10))) for _ in range(2000)]
    return train_sentencepiece(sentences, vocab_size=300)


@given(words=st.lists(WORDS, min_size=0, max_size=30), spaces=st.lists(st.sampled_from([" ", "  ", "\t", "\u00a0"]),
                                                                       min_size=30, max_size=30))
def test_sentencepiece_round_trip(spm, words, spaces):
    """decode(encode(normalize(text))) == normalize(text) for text over the trained alphabet, whatever the
    spacing (normalisation collapses it first)."""
    text = "".join(w + s for w, s in zip(words, spaces))
    clean = normalize(text)
    ids = spm.encode(clean)
    assert all(4 <= i < len(spm.vocab) for i in ids)  # no specials, no out-of-range ids
    assert spm.decode(ids) == clean


@given(tokens=st.lists(st.text(st.characters(exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1,
                                max_size=6), min_size=0, max_size=40, unique=True),
       picks=st.lists(st.integers(0, 1000), max_size=20))
def test_word_tokenizer_and_vocabulary_file_round_trip(tmp_path_factory, tokens, picks):
    """Any whitespace-free tokens: the vocabulary file reads back equal, and a sentence of known tokens
    decodes to itself (unknown ones to <unk>)."""
    tokens = [t for t in tokens if not any(c.isspace() for c in t)]
    vocab = Vocab(tokens)
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.save(path)
    assert Vocab.load(path) == vocab
    known = [t for t in tokens if t not in ("<pad>", "<s>", "</s>", "<unk>")]
    assume(known)
    sentence = [known[p % len(known)] for p in picks]
    tok = WordTokenizer(vocab)
    assert tok.decode(tok.encode(" ".join(sentence))) == " ".join(sentence)
    assert tok.encode("never-seen-token-\u2603") == [Vocab.unk]


# ------------------------------------------------------------------------------------------ batching


@given(lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=0, max_size=300),
       budget_extra=st.integers(0, 500), max_sentences=st.integers(0, 12), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 50))
def test_token_budget_batches_cover_everything_once_within_the_budget(lengths, budget_extra, max_sentences,
                                                                       seed, epoch):
    src = [s for s, _ in lengths]
    tgt = [t for _, t in lengths]
    max_tokens = max([max(s, t) for s, t in lengths], default=1) + budget_extra
    batches = token_budget_batches(src, tgt, max_tokens, max_sentences, seed, epoch)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # coverage: each example exactly once
    for b in batches:
        assert b  # no empty batch
        assert len(b) * max(max(src[i], tgt[i]) for i in b) <= max_tokens  # the budget, padding included
        assert not max_sentences or len(b) <= max_sentences
    assert token_budget_batches(src, tgt, max_tokens, max_sentences, seed, epoch) == batches  # determinism


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=50), over=st.integers(1, 20))
def test_an_example_over_the_budget_is_named(lengths, over):
    lengths = lengths + [max(lengths) + over]
    with pytest.raises(ValueError, match=f"example {len(lengths) - 1} has {lengths[-1]} tokens"):
        token_budget_batches(lengths, lengths, max(lengths) - over)


# ------------------------------------------------------------------------------------------ masks


@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_masks_equal_their_definition(lengths):
    """Brute force over every (batch, query, key): padding True below the length; the decoder's mask True
    exactly where the key is real and not after the query; the packed graphs (encoder, decoder, cross) have
    exactly the pairs of the dense masks."""
    lens = torch.tensor(lengths)
    pad = padding_mask(lens)
    dec = decoder_mask(pad)
    L = pad.shape[1]
    for b, n in enumerate(lengths):
        for j in range(L):
            assert bool(pad[b, j]) == (j < n)
            for i in range(L):
                assert bool(dec[b, 0, i, j]) == (j < n and j <= i)
    if max(lengths) == 0:  # no token at all: no graph to build (a real batch has >= 1: </s> or <s>)
        return
    # the packed graphs of the graph kernel: exactly the same pairs, node ids shifted by each sentence's offset
    offsets = [sum(lengths[:b]) for b in range(len(lengths))]
    for causal in (False, True):
        want = sorted((o + i, o + j) for o, n in zip(offsets, lengths) for i in range(n) for j in range(n)
                      if j <= i or not causal)
        q, k = self_graph(lens, FULL, causal).edges
        assert sorted(zip(q.tolist(), k.tolist())) == want
    k_lens = torch.tensor(lengths[::-1])
    k_off = [sum(lengths[::-1][:b]) for b in range(len(lengths))]
    want = sorted((qo + i, ko + j) for qo, n, ko, m in zip(offsets, lengths, k_off, lengths[::-1])
                  for i in range(n) for j in range(m))
    q, k = bipartite_graph(lens, k_lens).edges
    assert sorted(zip(q.tolist(), k.tolist())) == want


# ------------------------------------------------------------------------------------------ beam search


@settings(max_examples=25 * SCALE)
@given(seed=st.integers(0, 2**31), n_src=st.integers(1, 6), beam=st.integers(1, 5), nbest_frac=st.floats(0, 1),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), a=st.sampled_from([0.0, 0.5, 1.5]), b=st.integers(1, 6),
       norm=st.sampled_from(["pre", "post"]), data=st.data())
def test_beam_search_on_random_models(seed, n_src, beam, nbest_frac, alpha, a, b, norm, data):
    """Random small models and sources: every hypothesis within its length limit and free of specials, each
    sentence's n-best sorted by score, and each sentence decoded in the batch exactly as alone."""
    torch.manual_seed(seed)
    vocab = data.draw(st.integers(6, 14))
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      attention_dropout=0.0, ffn_dropout=0.0, norm=norm)
    model = build_model(cfg, vocab, vocab).eval()
    sources = data.draw(st.lists(st.lists(st.integers(4, vocab - 1), min_size=1, max_size=9), min_size=n_src,
                                 max_size=n_src))
    nbest = max(1, round(nbest_frac * beam))
    dcfg = DecodeConfig(strategy="beam" if beam > 1 else "greedy", beam_size=beam, nbest=nbest, len_penalty=alpha,
                        max_len_a=a, max_len_b=b, batch_size=4)
    with torch.inference_mode():
        together = translate_ids(model, sources, dcfg)
        alone = [translate_ids(model, [s], dcfg) for s in sources]
    for i, s in enumerate(sources):
        limit = int(max_lengths(torch.tensor([len(s)]), a, b))  # source tokens, </s> not counted
        hyps, scores = together.tokens[i], together.scores[i]
        assert 1 <= len(hyps) <= nbest
        for h in hyps:
            assert len(h) <= limit and not {Vocab.pad, Vocab.bos, Vocab.eos} & set(h)  # <unk> may be said
        assert scores == sorted(scores, reverse=True)
        assert hyps == alone[i].tokens[0]
        assert scores == pytest.approx(alone[i].scores[0], abs=1e-4)


# ------------------------------------------------------------------------------------------ readers


@settings(max_examples=150 * SCALE)
@given(raw=st.one_of(st.binary(max_size=400), st.text(max_size=200).map(lambda t: t.encode("utf-8")),
                     st.text(max_size=200).map(lambda t: t.encode("utf-16"))),
       wrap=st.sampled_from(["plain", "gzip", "truncated-gzip"]))
def test_corpus_reader_on_random_bytes(tmp_path_factory, raw, wrap):
    """Random bytes, text and UTF-16, plain, gzipped or cut short: a list of lines equal to the decoded
    text's, or a ValueError naming the file; nothing else."""
    path = tmp_path_factory.mktemp("fuzz") / "corpus.txt"
    data = raw if wrap == "plain" else gzip.compress(raw)
    if wrap == "truncated-gzip":
        data = data[: len(data) // 2]
    path.write_bytes(data)
    try:
        lines = read_lines(path)
    except ValueError as e:
        assert str(path) in str(e)
        return
    assert wrap != "truncated-gzip" or raw == b""  # a cut gzip stream is never read as text
    text = raw.decode("utf-8").removeprefix("\ufeff")
    want = text.split("\n")
    if want[-1] == "":
        want.pop()
    assert lines == [w.removesuffix("\r") for w in want]
    assert "\0" not in "".join(lines)


@given(a=st.binary(max_size=200), b=st.binary(max_size=200))
def test_aligned_and_tsv_readers_on_random_bytes(tmp_path_factory, a, b):
    folder = tmp_path_factory.mktemp("pair")
    (folder / "x.en").write_bytes(a)
    (folder / "x.de").write_bytes(b)
    try:
        corpus = read_aligned(folder / "x.en", folder / "x.de")
        assert len(corpus.src) == len(corpus.tgt) == len(corpus.lines)
        assert all(s == normalize(s) for s in corpus.src + corpus.tgt)
    except ValueError as e:
        assert "x.en" in str(e) or "x.de" in str(e)
    try:
        corpus = read_tsv(folder / "x.en")
        assert len(corpus.src) == len(corpus.tgt)
    except ValueError as e:
        assert "x.en" in str(e)


# ------------------------------------------------------------------------------------------ config and requests


KEYS = [f"{s}.{f.name}" for s, cls in (("model", ModelConfig), ("decode", DecodeConfig))
        for f in dataclasses.fields(cls)] + ["train.lr", "train.epochs", "data.task", "nope.x", "model.nope"]
VALUES = st.one_of(st.integers(-5, 5000), st.floats(allow_nan=True), st.booleans(), st.text(max_size=8),
                   st.lists(st.integers(), max_size=3), st.none())


@settings(max_examples=200 * SCALE)
@given(pairs=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=4))
def test_config_overrides_give_a_config_or_a_config_error(tmp_path_factory, pairs):
    """Random keys and values (of every type, NaN included): a valid Config or ConfigError naming a key."""
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text("model:\n  d_model: 32\n  n_heads: 4\n")
    overrides = [f"{k}={json.dumps(v)}" for k, v in pairs]
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        assert "config key" in str(e) or "override" in str(e), e
        return
    assert isinstance(cfg, Config)
    assert cfg.model.d_model % cfg.model.n_heads == 0 and cfg.model.d_model >= 1


@settings(max_examples=200 * SCALE)
@given(request=st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30)),
                            lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                   st.dictionaries(st.sampled_from(["text", "beam", "nbest",
                                                                                    "target", "x"]), kids,
                                                                   max_size=4)), max_leaves=8))
def test_explorer_requests_are_parsed_or_refused(request):
    """Any JSON value as a request: either well-formed fields within the limits, or a RequestError."""
    from tformer.explore import Explorer, Limits, RequestError

    explorer = Explorer.__new__(Explorer)  # _parse needs only the limits and the defaults
    explorer.limits = Limits(max_chars=50, max_beam=4, max_nbest=3)
    explorer.defaults = {"beam": 4, "nbest": 3}
    try:
        text, beam, nbest, target = explorer._parse(request)
    except RequestError as e:
        assert str(e) and 400 <= e.status < 500
        return
    assert isinstance(text, str) and 0 < len(text) <= 50 and text == text.strip()
    assert 1 <= nbest <= beam <= 4 and nbest <= 3
    assert target is None or (isinstance(target, str) and target.strip())
