"""Searches over toy probability tables and their oracles written out plainly: the searches run under the rules
a DecodeConfig asks for, a step function over {history: {token: p}} tables, the plain greedy path and every
path the rules (or the constraints) allow, best first."""

import itertools
import math

import torch

from tformer.config import DecodeConfig
from tformer.data import Vocab
from tformer.decode import TensorCache, beam_search, greedy_search, length_penalty, rules_for, sample

PAD, BOS, EOS = Vocab.pad, Vocab.bos, Vocab.eos
V = 7  # 4 specials + tokens 4, 5, 6


def run_greedy(step, cache, limit, prefix=None, stop=None, **rules):
    """greedy_search under the rules that `rules` (DecodeConfig's min_len, no_repeat_ngram,
    repetition_penalty) and `prefix` ask for, built by rules_for with the limits it raises."""
    built, limit = rules_for(DecodeConfig(**rules), limit, prefix)
    return greedy_search(step, cache, limit, built, stop=stop)


def run_beam(step, cache, limit, K, alpha=0.6, nbest=1, finish="top_k", penalty_rule="gnmt", prefix=None, stop=None,
             constraints=None, **rules):
    """beam_search as `run_greedy` above; `constraints`: the phrase input of that name (one list per sentence)."""
    phrases = None if constraints is None else {"constraints": constraints}
    built, limit = rules_for(DecodeConfig(strategy="beam", **rules), limit, prefix, phrases)
    return beam_search(step, cache, limit, built, beam=K, alpha=alpha, nbest=nbest, finish=finish,
                       penalty_rule=penalty_rule, stop=stop)


def run_sample(step, cache, limit, ids, n=1, temperature=1.0, top_k=0, top_p=1.0, seed=0, prefix=None, stop=None,
               **rules):
    """sample as `run_greedy` above."""
    built, limit = rules_for(DecodeConfig(strategy="sample", **rules), limit, prefix)
    return sample(step, cache, limit, built, ids, n=n, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                  stop=stop)


def tables_step(tables, shared=True):
    """Next-token probabilities from {history tuple: {token: p}}, one table per sentence (the sentence-level
    entry "sentence" names it; the histories ride as a hypothesis-level entry). Every tensor it makes is on
    the device of `prev`, so that it can run under the device oracle. `shared`: a sentence's hypotheses share
    its sentence-level row (greedy, beam); sampling gives every sample its own copy."""

    def step(prev, cache):
        hist = prev[:, None] if "hyp.hist" not in cache else torch.cat([cache["hyp.hist"], prev[:, None]], 1)
        which = cache["sentence"].tolist()
        assert len(set(which)) == len(which) or not shared  # one row per sentence, never copied per hypothesis
        per = prev.shape[0] // len(which)  # rows per sentence
        assert per * len(which) == prev.shape[0]
        rows = []
        for r, h in enumerate(hist.tolist()):
            row = [-1e9] * V
            for tok, p in tables[which[r // per]].get(tuple(h[1:]), {EOS: 1.0}).items():
                row[tok] = math.log(p)
            rows.append(row)
        return torch.tensor(rows, device=prev.device), TensorCache({"hyp.hist": hist, "sentence": cache["sentence"]})

    return step


def random_table(seed, depth=5, peaky=False):
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(depth):
        for hist in itertools.product([4, 5, 6], repeat=n):
            p = torch.rand(4, generator=g)
            p = p**3 + 0.01 if peaky else p + 0.05
            table[hist] = dict(zip([EOS, 4, 5, 6], (p / p.sum()).tolist()))
    return table


def cache_of(sentences):
    return TensorCache({"sentence": torch.tensor(sentences)})


def completes(out, tok, phrases):
    """Whether taking `tok` after `out` ends the output in one of `phrases` (written plainly)."""
    seq = out + [tok]
    return any(len(p) <= len(seq) and seq[len(seq) - len(p):] == p for p in phrases)


def _forbidden(out, tok, min_len, n, avoid=()):
    """The rules written plainly: </s> before min_len tokens; a token completing an n-gram already in out, or
    one of the phrases to `avoid`."""
    if tok == EOS and len(out) < min_len:
        return True
    if completes(out, tok, avoid):
        return True
    if n and len(out) >= n:
        grams = {tuple(out[i : i + n]) for i in range(len(out) - n + 1)}
        return tuple(out[len(out) - n + 1 :] + [tok]) in grams
    return False


def plain_greedy(table, limit, min_len=0, n=0, prefix=(), avoid=()):
    """One sentence, no tensors: the prefix, then the most probable allowed token until </s> or the limit
    (raised to the prefix); the score sums log p of every token taken, </s> included."""
    out, score = [], 0.0
    while len(out) < max(limit, len(prefix)):
        probs = table.get(tuple(out), {EOS: 1.0})
        if len(out) < len(prefix):
            tok = prefix[len(out)]
        else:
            allowed = {t: p for t, p in probs.items() if not _forbidden(out, t, min_len, n, avoid)}
            assert allowed, "the table must leave the rules something to choose"
            tok = max(allowed, key=allowed.get)
        score += math.log(probs[tok])
        if tok == EOS:
            break
        out.append(tok)
    return out, score


def plain_paths(table, limit, alpha, rule, min_len=0, n=0, prefix=(), avoid=()):
    """Every path the rules allow through `table`, beginning with the prefix, ending in </s> or cut at the
    limit, as (length-normalised score, tokens), best first; `avoid`: phrases no token after the prefix may
    complete."""
    limit, paths = max(limit, len(prefix)), []

    def walk(path, logp):
        for tok, p in table.get(tuple(path), {EOS: 1.0}).items():
            if len(path) < len(prefix):
                if tok != prefix[len(path)]:
                    continue
            elif _forbidden(path, tok, min_len, n, avoid):
                continue
            lp, size = logp + math.log(p), len(path) + 1
            if tok == EOS or size == limit:
                paths.append((lp / length_penalty(size, alpha, rule), path if tok == EOS else path + [tok]))
            else:
                walk(path + [tok], lp)

    walk([], 0.0)
    return sorted(paths, key=lambda h: -h[0])


REPEAT = {h: {4: 0.5, 5: 0.28, 6: 0.12, EOS: 0.1} for n in range(6) for h in itertools.product([4, 5, 6], repeat=n)}
RULE_TABLES = [random_table(10 + s, depth=6, peaky=True) for s in range(4)] + [REPEAT]  # 4 4 4 4 ... unless ruled
RULE_PREFIX = [[4], None, [5, 5], [], None]


def holds(tokens, phrase):
    n = len(phrase)
    return any(tokens[i:i + n] == phrase for i in range(len(tokens) - n + 1))


def shortest(phrases, prefix=()):
    """The fewest tokens of an output that begins with `prefix` and holds every phrase, by trying every order of
    the phrases and overlapping each with what came before as much as possible (what the automaton must find)."""
    best = None
    for order in itertools.permutations(phrases):
        out = list(prefix)
        for p in order:
            if holds(out, p):
                continue
            k = max(j for j in range(len(p)) if j == 0 or out[-j:] == p[:j] if j <= len(out))
            out += p[k:]
        best = len(out) if best is None else min(best, len(out))
    return best if best is not None else len(prefix)


def constrained_paths(table, limit, alpha, rule, phrases, prefix=()):
    """Every path through `table` that begins with the prefix, ends in </s> or is cut at the limit, and holds
    every phrase; best first by the length-normalised score. The limit is raised to the shortest length that
    holds the prefix and the phrases (and by the plain search's rule, to the prefix)."""
    need = shortest(phrases, prefix)
    limit, paths = max(limit, len(prefix), need), []

    def walk(path, logp):
        for tok, p in table.get(tuple(path), {EOS: 1.0}).items():
            if len(path) < len(prefix) and tok != prefix[len(path)]:
                continue
            lp, size = logp + math.log(p), len(path) + 1
            if tok == EOS or size == limit:
                out = path if tok == EOS else path + [tok]
                if all(holds(out, ph) for ph in phrases):
                    paths.append((lp / length_penalty(size, alpha, rule), out))
            else:
                walk(path + [tok], lp)

    walk([], 0.0)
    return sorted(paths, key=lambda h: -h[0])
