"""Forced target prefixes against oracles: greedy vs a forced-then-free decoding by the full (uncached)
forward pass, beam vs exhaustive search over the paths that begin with the prefix, teacher-forced rescoring
of the scores, batch invariance with mixed prefixes, and the rules never forbidding a prefix token; prefix
files and streams (the API and `tformer translate --prefix-file`) against the list form."""

import gzip
import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tformer
from helpers.oracles import REL
from helpers.search import run_beam, run_greedy, run_sample
from tformer.api import format_translation
from tformer.config import DecodeConfig, ModelConfig
from tformer.data import Vocab
from tformer.decode import TensorCache, length_penalty, max_lengths, prefix_table, search
from tformer.errors import DataError
from tformer.model import build_model

PAD, BOS, EOS = Vocab.pad, Vocab.bos, Vocab.eos
V = 7  # 4 specials + tokens 4, 5, 6


# ----------------------------------------------------------------------------- table-driven step functions


def tables_step(tables):
    """Next-token probabilities from {history tuple: {token: p}}, one table per sentence: the sentence-level
    cache entry "sentence" names each sentence's table, the history of every hypothesis rides in the cache as
    a hypothesis-level entry, so a search must reorder the one and leave the other one row per sentence."""

    def step(prev, cache):
        hist = prev[:, None] if "hyp.hist" not in cache else torch.cat([cache["hyp.hist"], prev[:, None]], 1)
        which = cache["sentence"].tolist()
        per = prev.shape[0] // len(which)  # rows per sentence (hypotheses, or samples)
        assert per * len(which) == prev.shape[0]
        logits = torch.full((prev.shape[0], V), -1e9)
        for r, row in enumerate(hist.tolist()):
            for tok, p in tables[which[r // per]].get(tuple(row[1:]), {EOS: 1.0}).items():
                logits[r, tok] = math.log(p)
        return logits, TensorCache({"hyp.hist": hist, "sentence": cache["sentence"]})

    return step


def random_table(seed, depth=4):
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(depth):
        for hist in itertools.product([4, 5, 6], repeat=n):
            p = torch.rand(4, generator=g) + 0.05
            table[hist] = dict(zip([EOS, 4, 5, 6], (p / p.sum()).tolist()))
    return table


def exhaustive(table, max_len, alpha, prefix=()):
    """Every complete path through `table` that begins with `prefix` (ending in </s>, or cut at the limit,
    raised to the prefix's length), as (normalised score, tokens), best first."""
    limit = max(max_len, len(prefix))
    paths = []

    def walk(path, logp):
        for tok, p in table.get(tuple(path), {EOS: 1.0}).items():
            if len(path) < len(prefix) and tok != prefix[len(path)]:
                continue
            lp, n = logp + math.log(p), len(path) + 1
            if tok == EOS or n == limit:
                paths.append((lp / length_penalty(n, alpha), path if tok == EOS else path + [tok]))
            else:
                walk(path + [tok], lp)

    walk([], 0.0)
    return sorted(paths, key=lambda h: -h[0])


PREFIXES = [[], [4], [5, 6], None, [6, 6, 6], [4, 5, 6, 4]]  # the last one fills the limit of 4


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_with_prefixes_equals_exhaustive_search_over_the_prefixed_paths(alpha):
    tables = [random_table(seed) for seed in range(len(PREFIXES))]
    B, limit = len(PREFIXES), torch.full((len(PREFIXES),), 4)
    batched = run_beam(tables_step(tables), TensorCache({"sentence": torch.arange(B)}), limit, 200, alpha,
                       nbest=3, prefix=PREFIXES)
    for i, prefix in enumerate(PREFIXES):
        oracle = exhaustive(tables[i], 4, alpha, prefix or ())[:3]
        assert batched.tokens[i] == [toks for _, toks in oracle]
        assert batched.scores[i] == pytest.approx([s for s, _ in oracle], abs=1e-5)
        alone = run_beam(tables_step(tables), TensorCache({"sentence": torch.tensor([i])}), limit[:1], 200, alpha,
                         nbest=3, prefix=[prefix])
        assert alone == (batched.tokens[i : i + 1], batched.scores[i : i + 1])
    # the prefix of 4 tokens fills its limit: one finished hypothesis, the prefix itself, no </s>
    assert batched.tokens[5] == [[4, 5, 6, 4]]


@pytest.mark.parametrize("K", [1, 2, 3])
def test_narrow_beam_with_prefix_is_a_beam_from_the_prefix(K):
    """After the prefix, a beam of K continues from the one forced hypothesis exactly as a beam over the
    table whose root is the prefix (the same probabilities, shifted by the prefix's log-probability)."""
    table, prefix, alpha = random_table(7, depth=5), [5, 4], 0.0
    shifted = {k[2:]: v for k, v in table.items() if k[:2] == (5, 4)}
    lp_prefix = math.log(table[()][5]) + math.log(table[(5,)][4])
    got = run_beam(tables_step([table]), TensorCache({"sentence": torch.tensor([0])}), torch.tensor([5]), K, alpha,
                   nbest=K, prefix=[prefix])
    free = run_beam(tables_step([shifted]), TensorCache({"sentence": torch.tensor([0])}), torch.tensor([3]), K,
                    alpha, nbest=K)
    assert got.tokens[0] == [prefix + toks for toks in free.tokens[0]]
    assert got.scores[0] == pytest.approx([s + lp_prefix for s in free.scores[0]], abs=1e-5)


def test_a_limit_shorter_than_the_prefix_gives_exactly_the_prefix():
    table, prefix = random_table(3), [4, 5, 6]
    lp = math.log(table[()][4]) + math.log(table[(4,)][5]) + math.log(table[(4, 5)][6])  # no </s>: cut
    step, cache, limit = tables_step([table]), TensorCache({"sentence": torch.tensor([0])}), torch.tensor([2])
    beam = run_beam(step, cache, limit, 4, 1.0, nbest=4, prefix=[prefix])
    assert beam.tokens == [[prefix]] and beam.scores[0][0] == pytest.approx(lp / length_penalty(3, 1.0))
    greedy = run_greedy(step, cache, limit, prefix=[prefix])
    assert greedy.tokens == [prefix] and greedy.scores[0] == pytest.approx(lp)
    drawn = run_sample(step, cache, limit, [0], n=3, top_k=1, prefix=[prefix])
    assert drawn.tokens == [[prefix] * 3] and drawn.scores[0] == pytest.approx([lp] * 3)
    assert prefix_table([prefix, []], torch.tensor([2, 2]), BOS, EOS)[1].tolist() == [3, 2]


def test_sampling_scores_forced_tokens_under_the_temperature_without_the_filter():
    """Top-k 1 keeps only 4 at the root, yet the prefix 6 is taken; it scores log softmax(log p / T)[6], the
    drawn continuation (the one token top-k 1 leaves, then </s>) scores 0 under the filtered distribution."""
    table = {(): {4: 0.6, 5: 0.3, 6: 0.1}, (6,): {4: 0.7, 5: 0.3}}
    T = 2.0
    root = torch.log(torch.tensor([0.6, 0.3, 0.1])) / T
    forced = float(torch.log_softmax(root, 0)[2])
    cache = TensorCache({"sentence": torch.tensor([0])})
    out = run_sample(tables_step([table]), cache, torch.tensor([5]), [0], n=4, temperature=T, top_k=1,
                     prefix=[[6]])
    assert out.tokens == [[[6, 4]] * 4]
    assert out.scores[0] == pytest.approx([forced] * 4, abs=1e-5)


def test_rules_never_forbid_a_prefix_token_and_count_it():
    """</s> is the favourite, 7 the runner-up. A prefix repeating a bigram is forced all the same; afterwards
    the history (prefix included) feeds the n-gram rule and the prefix counts towards min_len."""
    row = torch.full((10,), -5.0)
    row[7], row[EOS] = 0.0, 1.0
    logp = torch.log_softmax(row, 0)

    def step(prev, cache):
        return row.expand(prev.shape[0], -1).clone(), cache

    cache, limit = TensorCache({"x": torch.zeros(4)}), torch.full((4,), 10)
    prefixes = [[4, 5, 4, 5], [4, 4, 4], [4, 5], [4, 5, 6]]
    hyp = run_greedy(step, cache, limit, min_len=3, no_repeat_ngram=2, prefix=prefixes)
    # min_len 3 is reached inside the first, second and fourth prefixes: </s> follows at once; the third
    # needs one more token (7), then </s>
    assert hyp.tokens == [[4, 5, 4, 5], [4, 4, 4], [4, 5, 7], [4, 5, 6]]
    for toks, score in zip(hyp.tokens, hyp.scores):
        assert score == pytest.approx(sum(float(logp[t]) for t in toks + [EOS]))
    hyp = run_greedy(step, TensorCache({"x": torch.zeros(1)}), limit[:1], min_len=7, no_repeat_ngram=2,
                     prefix=[[4, 5, 4, 5]])
    # 7, 7 (a new bigram), then (7, 7) is banned and </s> held back: the first of the tied others, 3
    assert hyp.tokens == [[4, 5, 4, 5, 7, 7, 3]]
    for strategy in ("beam", "sample"):
        cfg = DecodeConfig(strategy=strategy, beam_size=3, nbest=3, min_len=3, no_repeat_ngram=2)
        out = search(step, TensorCache({"x": torch.zeros(4)}), limit, cfg, prefix=prefixes)
        for p, hyps in zip(prefixes, out.tokens):
            assert hyps and all(h[: len(p)] == p and len(h) >= 3 for h in hyps)


def test_prefix_table_rejects_specials_and_a_wrong_count():
    with pytest.raises(ValueError, match="special"):
        prefix_table([[4, EOS]], torch.tensor([5]), BOS, EOS)
    with pytest.raises(ValueError, match="2 prefixes"):
        prefix_table([[4], [5]], torch.tensor([5]), BOS, EOS)


# ----------------------------------------------------------------------------- on a real (random) model


def _model(norm="post"):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, norm=norm)
    torch.manual_seed(2)
    model = build_model(cfg, 13, 13).eval()
    with torch.no_grad():  # a peaky output layer, so that ties are rare
        for p in model.generator.parameters():
            p.mul_(4.0)
    return model


SOURCES = [[4, 5, 6, 7, 8], [9], [11, 12, 4, 5, 6, 7, 8], [10, 10, 4], [5, 6, 7], [12, 11]]
PREFIX = [[8, 9], [], [4, 9, 9, 12, 5], None, [12], [6, 5, 4, 6, 5, 4]]  # the last: a limit of 4 < 6
A, B = 1.0, 2


def _search(model, sources, cfg, prefix, ids=None):
    """What the inference glue does, by hand: encode, cache, limits a * length + b, search."""
    src = torch.full((len(sources), max(map(len, sources)) + 1), PAD)
    for i, s in enumerate(sources):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS])
    enc = model.encode(src, torch.tensor([len(s) + 1 for s in sources]))
    limit = max_lengths(torch.tensor([len(s) for s in sources]), A, B)
    return search(model.decode_step, model.init_cache(enc), limit, cfg, ids=ids, prefix=prefix)


def _teacher_forced(model, src_ids, toks):
    """log_softmax of the full forward pass over <s> + toks: (len(toks) + 1, V)."""
    src = torch.tensor([src_ids + [EOS]])
    tgt_in = torch.tensor([[BOS] + toks])
    hidden = model(src, torch.tensor([src.shape[1]]), tgt_in, torch.tensor([tgt_in.shape[1]])).hidden
    return torch.log_softmax(model.generator(hidden[0]).float(), -1)


def _forced_then_free(model, src_ids, prefix, limit):
    """The prefix, then the argmax of the last position of the full forward pass over <s> + output, until
    </s> or the limit (raised to the prefix): no cache, no search code."""
    out = list(prefix)
    while len(out) < max(limit, len(prefix)):
        logp = _teacher_forced(model, src_ids, out)[-1]
        logp[[PAD, BOS]] = float("-inf")  # never generated
        tok = int(logp.argmax())
        if tok == EOS:
            break
        out.append(tok)
    return out


def _rescored(model, src_ids, toks, limit):
    """The teacher-forced log-probability of toks (+ </s> unless the output was cut at its limit)."""
    logp = _teacher_forced(model, src_ids, toks)
    targets = toks + [EOS] if len(toks) < limit else toks
    return sum(float(logp[i, t]) for i, t in enumerate(targets))


@torch.no_grad()
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_greedy_with_prefix_equals_forced_then_free_full_forward_and_its_score_the_rescoring(norm):
    model = _model(norm)
    got = _search(model, SOURCES, DecodeConfig(max_len_a=A, max_len_b=B), PREFIX)
    for s, p, hyps, scores in zip(SOURCES, PREFIX, got.tokens, got.scores):
        p, limit = p or [], max(len(s) + B, len(p or []))
        assert hyps[0] == _forced_then_free(model, s, p, limit)
        assert hyps[0][: len(p)] == p
        assert scores[0] == pytest.approx(_rescored(model, s, hyps[0], limit), rel=REL, abs=1e-5)  # a sum of fp32s
    assert got.tokens[5][0] == PREFIX[5]  # a limit of 4 < 6: exactly the prefix


@torch.no_grad()
def test_no_prefix_decodes_as_before_and_mixed_batches_are_invariant():
    model = _model("pre")
    for strategy in ("greedy", "beam", "sample"):
        cfg = DecodeConfig(strategy=strategy, beam_size=4, nbest=1 if strategy == "greedy" else 3, len_penalty=0.6,
                           top_k=3, temperature=0.8, seed=3, max_len_a=A, max_len_b=B)
        ids = list(range(len(SOURCES)))
        plain = _search(model, SOURCES, cfg, None, ids)
        assert _search(model, SOURCES, cfg, [[]] * len(SOURCES), ids) == plain  # bit for bit
        mixed = _search(model, SOURCES, cfg, PREFIX, ids)
        for i, (s, p) in enumerate(zip(SOURCES, PREFIX)):
            alone = _search(model, [s], cfg, [p], [i])
            assert alone.tokens[0] == mixed.tokens[i]
            assert alone.scores[0] == pytest.approx(mixed.scores[i], rel=1e-6, abs=1e-5)
            assert all(h[: len(p or [])] == (p or []) for h in mixed.tokens[i])
            if not p:
                assert mixed.tokens[i] == plain.tokens[i]


@torch.no_grad()
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_with_prefix_raw_scores_are_teacher_forced_and_the_exact_stop_changes_nothing(alpha):
    model = _model()
    got = {}
    for nbest in (1, 4):
        cfg = DecodeConfig(strategy="beam", beam_size=4, nbest=nbest, len_penalty=alpha, max_len_a=A, max_len_b=B)
        got[nbest] = _search(model, SOURCES, cfg, PREFIX)
    assert [h[0] for h in got[1].tokens] == [h[0] for h in got[4].tokens]
    assert [s[0] for s in got[1].scores] == pytest.approx([s[0] for s in got[4].scores], abs=1e-5)
    for s, p, hyps, scores in zip(SOURCES, PREFIX, got[4].tokens, got[4].scores):
        limit = max(len(s) + B, len(p or []))
        for toks, score in zip(hyps, scores):
            assert toks[: len(p or [])] == (p or [])
            n = len(toks) + (len(toks) < limit)  # </s> counted unless cut at the limit
            assert score * length_penalty(n, alpha) == pytest.approx(_rescored(model, s, toks, limit), abs=1e-4)


@torch.no_grad()
def test_every_draw_begins_with_its_prefix_and_seeded_draws_are_batch_invariant():
    model = _model()
    cfg = DecodeConfig(strategy="sample", nbest=5, top_k=2, top_p=0.9, seed=11, max_len_a=A, max_len_b=B)
    ids = list(range(len(SOURCES)))
    a = _search(model, SOURCES, cfg, PREFIX, ids)
    assert a == _search(model, SOURCES, cfg, PREFIX, ids)
    for i, (s, p) in enumerate(zip(SOURCES, PREFIX)):
        assert len(a.tokens[i]) == 5 and all(h[: len(p or [])] == (p or []) for h in a.tokens[i])
        alone = _search(model, [s], cfg, [p], [i])
        assert alone.tokens[0] == a.tokens[i]
        assert alone.scores[0] == pytest.approx(a.scores[i], rel=1e-6, abs=1e-5)


# ----------------------------------------------------------------------------- prefix files and streams


ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1"


def _v1():
    return tformer.load(V1 / "checkpoint", device="cpu"), V1


FILE_PREFIXES = ["DOG", "", "A BIG", "", "SMALL WOMAN", "CAT CAT CAT", "", "RED"]


@pytest.mark.parametrize("options", [{}, {"beam": 4, "nbest": 3}])
def test_a_prefix_file_streams_what_translate_with_prefixes_gives(tmp_path, options):
    """The oracle: the list form (itself held to a forced-then-free full forward in test_api); the file and
    the streams must give the same outputs line by line, whatever the chunking, gzip or not."""
    translator, v1 = _v1()
    lines = (v1 / "input.en").read_text(encoding="utf-8").splitlines()[: len(FILE_PREFIXES)]
    want = translator.translate(lines, prefix=[p or None for p in FILE_PREFIXES], **options)
    for t, p in zip(want, FILE_PREFIXES):
        assert all(h.text.startswith(p) for h in t.hypotheses)
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "prefix.de.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(FILE_PREFIXES) + "\n")
    nbest = options.get("nbest", 1) > 1
    n = translator.translate_file(tmp_path / "in.en", tmp_path / "out.de", prefix_file=tmp_path / "prefix.de.gz",
                                  chunk_size=3, **options)
    assert n == len(lines)
    text = (tmp_path / "out.de").read_text(encoding="utf-8")
    assert text == "".join(format_translation(t, i, nbest) for i, t in enumerate(want))
    streamed = translator.translate_iterable(iter(lines), prefix=iter(FILE_PREFIXES), chunk_size=3, **options)
    assert [[h.text for h in t.hypotheses] for t in streamed] == [[h.text for h in t.hypotheses] for t in want]


def test_prefix_streams_of_another_length_are_refused_naming_both(tmp_path):
    translator, v1 = _v1()
    (tmp_path / "in.en").write_text("a dog\nthe cat\nred\n", encoding="utf-8")
    (tmp_path / "short.de").write_text("DOG\n\n", encoding="utf-8")
    (tmp_path / "out.de").write_text("earlier\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in\.en has 3 lines but .*short\.de has 2; give one prefix per input line"):
        translator.translate_file(tmp_path / "in.en", tmp_path / "out.de", prefix_file=tmp_path / "short.de")
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == "earlier\n"  # nothing written
    (tmp_path / "bad.de").write_bytes(b"DOG\n\xff\n\n")
    with pytest.raises(DataError, match=r"bad\.de, line 2.*not valid UTF-8"):
        translator.translate_file(tmp_path / "in.en", tmp_path / "out.de", prefix_file=tmp_path / "bad.de")
    with pytest.raises(DataError, match="the input: more lines than the prefixes, whose last is line 1"):
        list(translator.translate_iterable(["a", "b", "c"], prefix=["A"], chunk_size=2))
    with pytest.raises(DataError, match="the prefixes: more lines than the input, whose last is line 2"):
        list(translator.translate_iterable(["a", "b"], prefix=["A", None, "C"]))
    with pytest.raises(DataError, match=r"prefix\[1\]: 2000 target pieces"):
        translator.translate(["a", "b"], prefix=[None, "DOG " * 500])


def test_translate_prefix_file_on_the_command_line(tmp_path):
    translator, v1 = _v1()
    lines = (v1 / "input.en").read_text(encoding="utf-8").splitlines()[: len(FILE_PREFIXES)]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "prefix.de").write_text("\n".join(FILE_PREFIXES) + "\n", encoding="utf-8")

    def cli(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "tformer", "translate", "--checkpoint", v1 / "checkpoint",
                               *map(str, args)], input=stdin, capture_output=True, text=True, timeout=300,
                              cwd=ROOT)

    want = [t.text for t in translator.translate(lines, prefix=[p or None for p in FILE_PREFIXES])]
    r = cli("--input", tmp_path / "in.en", "--prefix-file", tmp_path / "prefix.de")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == want
    r = cli("--prefix-file", tmp_path / "prefix.de", stdin="\n".join(lines) + "\n")  # standard input
    assert r.returncode == 0 and r.stdout.splitlines() == want, r.stderr
    (tmp_path / "out.de").write_text("earlier\n", encoding="utf-8")
    r = cli("--input", tmp_path / "in.en", "--prefix-file", tmp_path / "prefix.de", "--output", tmp_path / "out.de",
            stdin=None)
    assert r.returncode == 0 and (tmp_path / "out.de").read_text(encoding="utf-8").splitlines() == want
    r = cli("--prefix-file", tmp_path / "prefix.de", "--output", tmp_path / "out.de", stdin="a dog\n")
    assert r.returncode == 2
    assert "standard input has 1 lines but" in r.stderr and "prefix.de has 8" in r.stderr
    assert (tmp_path / "out.de").read_text(encoding="utf-8").splitlines() == want  # left as it was
