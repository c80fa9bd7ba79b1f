"""The decoding rules of a batch, as objects, built once per batch and applied by every search alike.

A rule (common.Rule) is one small object with the hooks it needs, modelled on CTranslate2's `LogitsProcessor`
list and Hugging Face's `LogitsProcessorList`:

    of(given, max_len)     build it for a batch: None when it would do nothing there (penalty 1, n-gram 0, no
                           prefix, no phrases), so the plain search does no extra work; may raise the limits
    logits(logits, at)     change a step's logits before the search normalises them   (repetition penalty)
    mask(scores, at)       set to -inf, in place, the tokens it forbids, nothing else  (the others)
    forced(at)             the token each row must take (-1: free), kept at its score from before the masks
    forced_score(scores)   what those tokens score instead (default: that score)
    select(rows)           keep / reorder / repeat its per-row state with the batch's rows
    advance(rows, tokens)  move its per-row state on by the tokens chosen
    candidates, take       beam search only: choose among candidates (constraints: extra candidates, banks)

`at` is the search's live batch (batch.Batch: at.t, at.history (N, t), at.row_sentence (N,)). A search turns
a step's logits into its scores by `Rules.scores`, the one chain every search runs:

    logits hooks  ->  the search's normalisation (greedy, beam: log-softmax; sampling: / temperature)
                  ->  forced tokens read their scores  ->  mask hooks  ->  (sampling: top-k / top-p filter)
                  ->  forced tokens written back, every other token of a forced row -inf

`ORDER` lists the rule classes; `rules_for` builds them in that order (each `of` sees the limits the ones
before it raised) and each hook runs in that order too. Masks commute (each only writes -inf), so their order
changes no bit; it is fixed for the reader. The rules:

    RepetitionPenalty   repetition_penalty != 1: logits of tokens a row has output divided / multiplied
    UnknownPenalty      unk_penalty > 0: the <unk> logit lowered by it
    NeverSpecial        always: <pad> and <s> are never output
    MinLength           min_len > 0: </s> only after min_len tokens
    NoRepeatNgram       no_repeat_ngram > 0: no n-gram twice in a row's output
    Avoid               phrases["avoid"]: phrases no output may hold (negative constraints; every search)
    Constraints         phrases["constraints"]: phrases every output must hold (decode.constraints; beam only)
    ForcedPrefix        a prefix: each output starts with it, its tokens scored at their log-probability (or 0:
                        decode.prefix_score)

The prefix is a forcing rule: it overrides the masks (a prefix may repeat an n-gram; its token keeps its score
from before them), and the limits are raised to hold it; min_len and the n-gram rule count its tokens as the
output's. The lexical shortlist is not a
rule: it changes the step itself (the output projection is computed for the batch's lists only, the search
runs in their columns: tformer.inference, tformer.shortlist), which a rule on the full vocabulary's scores
would give back.

To add a rule: a `Rule` subclass with `of` and the hooks it needs (here, or a module of its own for a large
one, as constraints), and its class in `ORDER`. A rule reading a per-sentence phrase input declares it
(`phrase = PhraseInput(...)`); `PHRASE_INPUTS` gathers the declarations, and every entry point (the API
keyword, the HTTP field, the command-line option, the shortlist) reads them from there: nothing else changes.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from tformer.config import DecodeConfig
from tformer.data.vocab import Vocab
from tformer.decode.common import (PhraseInput, Phrases, Rule, force, forced_scores, log_probs, owned_fp32,
                                   penalize_repeats, prefix_table, row_topk)
from tformer.decode.constraints import Constraints


class Given(NamedTuple):
    """What a batch gives its rules to be built from."""

    cfg: DecodeConfig
    prefix: Tensor  # (B, P) the forced prefixes, padded with -1 (common.prefix_table)
    phrases: Phrases  # the phrase inputs given, by name (PHRASE_INPUTS)
    bos: int
    eos: int


class RepetitionPenalty(Rule):
    """The repetition penalty (common.penalize_repeats) on each row's tokens so far, its prefix's included."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        p = given.cfg.repetition_penalty
        return (cls(p) if p != 1.0 else None), max_len

    def logits(self, logits: Tensor, at) -> Tensor:
        return penalize_repeats(logits, at.history, self.penalty)  # (N, V)


class UnknownPenalty(Rule):
    """The logit of <unk> lowered by decode.unk_penalty before the search normalises: <unk> becomes e^penalty
    times less likely against every other token, and the scores stay a distribution (fairseq's --unkpen
    subtracts from the log-probability after the softmax instead)."""

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        p = given.cfg.unk_penalty
        return (cls(p) if p else None), max_len

    def logits(self, logits: Tensor, at) -> Tensor:
        if not owned_fp32(logits):
            logits = logits.to(torch.float32, copy=True)
        logits[:, Vocab.unk] -= self.penalty  # (N,)
        return logits  # (N, V)


class NeverSpecial(Rule):
    """<pad> and <s> (ids 0 and 1: tformer.data.vocab) are never output."""

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        return cls(), max_len

    def mask(self, scores: Tensor, at) -> Tensor:
        scores[:, :2] = float("-inf")
        return scores


class MinLength(Rule):
    """</s> is forbidden before `min_len` tokens (the prefix's count)."""

    def __init__(self, min_len: int, eos: int) -> None:
        self.min_len, self.eos = min_len, eos

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        n = given.cfg.min_len
        return (cls(n, given.eos) if n else None), max_len

    def mask(self, scores: Tensor, at) -> Tensor:
        if at.t < self.min_len:
            scores[:, self.eos] = float("-inf")
        return scores


class NoRepeatNgram(Rule):
    """No token may complete an n-gram already in the row's output (the prefix's included)."""

    def __init__(self, n: int) -> None:
        self.n = n

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        n = given.cfg.no_repeat_ngram
        return (cls(n) if n else None), max_len

    def mask(self, scores: Tensor, at) -> Tensor:
        n, t, history = self.n, at.t, at.history  # history (N, t)
        if t >= n:  # the n-gram ending at the next token needs n-1 earlier tokens, and a match needs n more
            windows = history.unfold(1, n, 1)  # (N, t-n+1, n)
            prefix = history[:, t - n + 1 :]  # (N, n-1)
            match = (windows[:, :, : n - 1] == prefix[:, None, :]).all(-1)  # (N, t-n+1)
            rows, cols = match.nonzero(as_tuple=True)
            scores[rows, windows[rows, cols, n - 1]] = float("-inf")
        return scores


class Avoid(Rule):
    """No output holds any of its sentence's `avoid` phrases (negative constraints: CTranslate2's
    suppress_sequences, Hugging Face's bad_words_ids), in every search: a token that would complete one, given
    the row's tokens so far (its prefix's included), is forbidden. A prefix is forced whatever the rules say,
    so a prefix may hold one (the rule then forbids only what comes after it)."""

    phrase = PhraseInput("avoid", "target phrases no output may hold (negative constraints)", 64,
                         ("greedy", "beam", "sample"), False)

    def __init__(self, heads: Tensor, last: Tensor) -> None:
        self.heads = heads  # (B, C, m) each phrase's tokens but its last, right-aligned, -1 (any) on the left
        self.last = last  # (B, C) each phrase's last token; -1 where a sentence has fewer than C phrases

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        per = given.phrases.get("avoid")
        if not per or not any(per):
            return None, max_len
        phrases = [[list(p) for p in (s or ())] for s in per]
        if len(phrases) != max_len.shape[0]:
            raise ValueError(f"{len(phrases)} avoid lists for a batch of {max_len.shape[0]} sentences")
        for i, s in enumerate(phrases):
            if any(not p or min(p) < 0 or {0, given.bos, given.eos} & set(p) for p in s):  # id 0: <pad>
                raise ValueError(f"sentence {i}: an avoided phrase is empty or holds a negative or special id ({s}); "
                                 "give ids without <s>, </s>, <pad>")
        C = max(map(len, phrases))
        m = max(len(p) for s in phrases for p in s) - 1
        heads = torch.full((len(phrases), C, m), -1, dtype=torch.long)
        last = torch.full((len(phrases), C), -1, dtype=torch.long)
        for i, s in enumerate(phrases):
            for c, p in enumerate(s):
                heads[i, c, m - len(p) + 1 :] = torch.tensor(p[:-1], dtype=torch.long)
                last[i, c] = p[-1]
        return cls(heads.to(max_len.device), last.to(max_len.device)), max_len

    def mask(self, scores: Tensor, at) -> Tensor:
        rows = at.row_sentence  # (N,)
        last = self.last.index_select(0, rows)  # (N, C)
        match = last >= 0  # (N, C) a phrase whose heads the row's last tokens end with
        m = self.heads.shape[2]
        if m:
            heads = self.heads.index_select(0, rows)  # (N, C, m)
            tail = at.history[:, -m:] if at.t >= m else torch.cat(  # (N, m) -2 before the output: matches no token
                [at.history.new_full((at.history.shape[0], m - at.t), -2), at.history], 1)
            match &= ((heads == tail[:, None, :]) | (heads < 0)).all(2)
        hit = torch.where(match, float("-inf"), float("inf")).to(scores.dtype)  # (N, C)
        return scores.scatter_reduce_(1, last.clamp(min=0), hit, "amin")  # in place; no read back to the host


class ForcedPrefix(Rule):
    """Each output of sentence i begins with exactly prefix[i]: a row inside its prefix takes the token due, at
    its log-probability, or at 0 with decode.prefix_score zero (Hugging Face scores its forced tokens so)."""

    def __init__(self, table: Tensor, zero: bool = False) -> None:
        self.table = table  # (B, P) padded with -1
        self.zero = zero

    @classmethod
    def of(cls, given: Given, max_len: Tensor) -> tuple[Rule | None, Tensor]:
        rule = cls(given.prefix, given.cfg.prefix_score == "zero") if given.prefix.shape[1] else None
        return rule, max_len  # the limits hold it already

    def forced_score(self, scores: Tensor) -> Tensor:
        return torch.zeros_like(scores) if self.zero else scores

    def forced(self, at) -> Tensor | None:
        if at.t >= self.table.shape[1]:  # every sentence is past its prefix
            return None
        return self.table[at.row_sentence, at.t]  # (N,) the prefix token due, -1 past the prefix


ORDER: tuple[type[Rule], ...] = (RepetitionPenalty, UnknownPenalty, NeverSpecial, MinLength, NoRepeatNgram, Avoid,
                                 Constraints, ForcedPrefix)
PHRASE_INPUTS: tuple[PhraseInput, ...] = tuple(r.phrase for r in ORDER if r.phrase is not None)


def phrase_input(name: str) -> PhraseInput:
    for p in PHRASE_INPUTS:
        if p.name == name:
            return p
    raise KeyError(f"no phrase input {name!r}; there are {', '.join(p.name for p in PHRASE_INPUTS)}")


def _has(rule: Rule, hook: str) -> bool:
    return getattr(type(rule), hook) is not getattr(Rule, hook)


class Rules:
    """A batch's rules, in `ORDER`, each hook called on the rules that have it: the chain of module docstring
    (`scores`), the rows kept with the batch (`select`, `advance`), beam search's choice (`candidates`,
    `take`)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._logits = [r for r in rules if _has(r, "logits")]
        self._masks = [r for r in rules if _has(r, "mask")]
        self._forcing = [r for r in rules if _has(r, "forced")]
        self._moving = [r for r in rules if _has(r, "select") or _has(r, "advance")]
        choosing = [r for r in rules if _has(r, "candidates") or _has(r, "take")]
        assert len(choosing) <= 1, "two rules choose beam candidates"
        self._chooser = choosing[0] if choosing else None

    def scores(self, logits: Tensor, at, normalise: Callable[[Tensor], Tensor] = log_probs,
               read: Callable[[Tensor], Tensor] | None = None, narrow: Callable[[Tensor], Tensor] | None = None
               ) -> tuple[Tensor, Tensor | None]:
        """A step's logits (N, V) -> the scores (N, V) the search chooses by, and the forced tokens (N,) (-1:
        free; None when no row is forced). `normalise`: the search's own (greedy, beam: log-probabilities,
        over the logits; sampling: logits / temperature); `read`: what a forced token's score is read from,
        given the normalised scores (default: themselves); `narrow`: applied after the masks (sampling's top-k /
        top-p filter and log-softmax)."""
        for r in self._logits:
            logits = r.logits(logits, at)
        x = normalise(logits)  # (N, V)
        pins = []
        for r in self._forcing:
            forced = r.forced(at)  # (N,) or None
            if forced is not None:  # read before the masks: a forced token keeps its own score
                pins.append((forced, r.forced_score(forced_scores(x if read is None else read(x), forced))))
        for r in self._masks:
            x = r.mask(x, at)  # in place
        if narrow is not None:
            x = narrow(x)
        for forced, kept in pins:
            x = force(x, forced, kept)  # in place
        return x, pins[-1][0] if pins else None

    def select(self, rows: Tensor) -> None:
        for r in self._moving:
            r.select(rows)

    def advance(self, rows: Tensor | None, tokens: Tensor) -> None:
        for r in self._moving:
            r.advance(rows, tokens)

    def candidates(self, scores: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Each row's candidate extensions (values, tokens) (N, n'): its n best tokens of `scores` (N, V), and
        what the choosing rule adds."""
        values, tokens = row_topk(scores, n)  # (N, n)
        if self._chooser is None:
            return values, tokens
        return self._chooser.candidates(scores, values, tokens)

    def take(self, cand: Tensor, tokens: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """(scores, positions) (L, n) of the candidates `cand` (L, m) each sentence keeps: the n best, or as the
        choosing rule takes them."""
        return cand.topk(n, dim=1) if self._chooser is None else self._chooser.take(cand, tokens, n)


def rules_for(cfg: DecodeConfig, max_len: Tensor, prefix: list[list[int] | None] | None = None,
              phrases: Phrases | None = None) -> tuple[Rules, Tensor]:
    """The rules of one batch, and its limits `max_len` (B,) raised where a prefix or the phrases need more:
    `prefix` one id list per sentence (None or empty: none); `phrases` the phrase inputs by name
    (PHRASE_INPUTS), each one list of phrases or None per sentence. A phrase input given to a search that
    does not enforce it (PhraseInput.strategies) is refused."""
    phrases = dict(phrases or {})
    unknown = set(phrases) - {p.name for p in PHRASE_INPUTS}
    if unknown:
        raise ValueError(f"no phrase input {sorted(unknown)}; there are {[p.name for p in PHRASE_INPUTS]}")
    for name, per in phrases.items():
        p = phrase_input(name)
        if per is not None and any(per) and cfg.strategy not in p.strategies:
            raise ValueError(f"{name} are enforced by {' or '.join(p.strategies)} search; decode.strategy is "
                             f"{cfg.strategy!r}: use strategy {p.strategies[0]!r}")
    table, max_len = prefix_table(prefix, max_len, Vocab.bos, Vocab.eos)  # (B, P), (B,)
    given = Given(cfg, table, phrases, Vocab.bos, Vocab.eos)
    rules = []
    for kind in ORDER:
        rule, max_len = kind.of(given, max_len)
        if rule is not None:
            rules.append(rule)
    return Rules(rules), max_len
