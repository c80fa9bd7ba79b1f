"""What every search shares: the step-function and cache contracts, the rule contract (`Rule`, whose rules and
order are decode.rules) and the declaration of a phrase input a rule reads, results, length limits, cache row
selection, and the arithmetic the rules and searches call (repetition penalty, log-softmax, forcing a token,
wide top-k). Notation: B sentences, K hypotheses per sentence, N = B x K rows, V vocabulary, P longest prefix,
t tokens decoded so far."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import torch
from torch import Tensor

class Cache(Protocol):
    """What a search needs of a model's cache (tformer.model.cache.DecoderCache is the models' one)."""

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "Cache":
        """Keep, reorder or repeat hypotheses by `hyp_rows` and, if given, sentences by `sentence_rows`."""
        ...


StepFn = Callable[[Tensor, Cache], "tuple[Tensor, Cache]"]  # the logits it returns are the search's to overwrite
Stop = Callable[[list[int]], list[bool]]  # the batch's sentences still decoding -> which to stop now


def stopped(stop: Stop | None, sentences: Tensor) -> Tensor | None:
    """(L,) bool: which of the live `sentences` (indices into the search's batch) `stop` ends now; None when
    none does. A stopped sentence leaves the batch at once, as a finished one does, and gets no result that
    means anything (the caller no longer wants it): the others' results stay as they would have been."""
    if stop is None or not sentences.numel():
        return None
    gone = stop(sentences.tolist())
    return torch.tensor(gone, dtype=torch.bool, device=sentences.device) if any(gone) else None


@dataclass(frozen=True)
class PhraseInput:
    """A per-sentence input a rule reads besides the source: lists of target phrases, one list (or None) per
    sentence. The rule that reads it declares it (`Rule.phrase`); decode.rules.PHRASE_INPUTS gathers them, and
    every entry point reads that: the keyword of `Translator.translate`, the field of /v1/translate and its
    schema, the `tformer translate` option, the shortlist's kept tokens."""

    name: str  # translate(name=...), the /v1/translate field, `tformer translate --name-file`
    help: str  # one sentence: what every output does with these phrases
    max_phrases: int  # per sentence
    strategies: tuple[str, ...]  # the searches that enforce it (decode.strategy); others refuse it
    written: bool  # True: outputs must be able to write its tokens (a lexical shortlist keeps them)


Phrases = dict[str, list[list[list[int]] | None]]  # input name -> per sentence, its phrases as id lists (or None)


class Rule:
    """One decoding rule for one batch (decode.rules: the rules, their order, how to add one). A rule overrides
    the hooks it needs; `Rules` calls each hook of the rules that have it only, so a hook a rule lacks costs
    nothing. `at` is the search's live batch (decode.batch.Batch): `at.t` tokens decoded so far, `at.history`
    (N, t) each row's tokens, `at.row_sentence` (N,) each row's sentence in the search's batch."""

    phrase: PhraseInput | None = None  # the phrase input it reads, if any (PHRASE_INPUTS)

    @classmethod
    def of(cls, given: Any, max_len: Tensor) -> "tuple[Rule | None, Tensor]":
        """The rule for a batch (decode.rules.Given), or None when it would do nothing there; and the limits
        `max_len` (B,), raised where the rule needs more tokens than they allow."""
        raise NotImplementedError

    def logits(self, logits: Tensor, at: Any) -> Tensor:
        """A step's logits (N, V) changed before the search normalises them (may write over them)."""
        return logits

    def mask(self, scores: Tensor, at: Any) -> Tensor:
        """Set to -inf, in place, the scores (N, V) of the tokens it forbids, and change nothing else: masks
        then commute, and act alike on log-probabilities (greedy, beam) and on logits (sampling, before its
        top-k/top-p filter)."""
        return scores

    def forced(self, at: Any) -> Tensor | None:
        """(N,) the token each row must take now, -1 where it is free; None when no row is forced. A forced
        token keeps its score from before the masks, every other token of its row is -inf (`force`)."""
        return None

    def forced_score(self, scores: Tensor) -> Tensor:
        """(N,) what its forced tokens score, given their scores (N,) from before the masks: themselves, or
        another value (a prefix under decode.prefix_score zero: 0)."""
        return scores

    def select(self, rows: Tensor) -> None:
        """Keep, reorder or repeat its per-row state by `rows` (N',), as the cache's hypothesis rows."""

    def advance(self, rows: Tensor | None, tokens: Tensor) -> None:
        """Row i now continues row rows[i] (None: itself) with token tokens[i] (N',)."""

    def candidates(self, scores: Tensor, values: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Beam search: each row's candidates (values, tokens) (N, n) from its best tokens (N, n) and the
        step's `scores` (N, V). At most one rule of a batch chooses (`candidates`, `take`)."""
        return values, tokens

    def take(self, cand: Tensor, tokens: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Beam search: (scores, positions) (L, n) of the candidates `cand` (L, m) each sentence keeps, the
        candidates' tokens (N, m/k) at hand."""
        return cand.topk(n, dim=1)


class TensorCache(dict):
    """A cache as a dict of tensors, batch first: entries named "hyp.*" have one row per hypothesis, the others
    one row per sentence, shared by that sentence's hypotheses (rows i*K .. i*K+K-1 of a hypothesis-level
    tensor belong to sentence i). For step functions that are not models (tests, toy searches)."""

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "TensorCache":
        return TensorCache({k: v.index_select(0, hyp_rows) if k.startswith("hyp.")
                            else v if sentence_rows is None else v.index_select(0, sentence_rows)
                            for k, v in self.items()})


class Hypotheses(NamedTuple):
    tokens: list[list[int]]  # per sentence, without <s> and </s>
    scores: list[float]  # sum of log-probabilities of the tokens chosen, </s> included when reached


class NBest(NamedTuple):
    tokens: list[list[list[int]]]  # per sentence, its hypotheses best first, without <s> and </s>
    scores: list[list[float]]  # their scores (beam: length-normalised; greedy/sampling: log-probability)


def max_lengths(src_lengths: Tensor, a: float, b: int) -> Tensor:
    """The output limit a * source_length + b (at least 1), per sentence: (B,) -> (B,)."""
    return (src_lengths.double() * a + b).floor().long().clamp(min=1)


def prefix_table(prefix: list[list[int] | None] | None, max_len: Tensor, bos: int, eos: int
                 ) -> tuple[Tensor, Tensor]:
    """The forced prefixes (one id list per sentence, None or empty for none) as a (B, P) tensor padded with
    -1, P = 0 when no sentence has one; and the limits `max_len` (B,) raised where a prefix is longer, so that
    no prefix is cut (such a sentence's output is exactly its prefix)."""
    B = max_len.shape[0]
    prefix = [[] for _ in range(B)] if prefix is None else [list(p or ()) for p in prefix]
    if len(prefix) != B:
        raise ValueError(f"{len(prefix)} prefixes for a batch of {B} sentences")
    for i, p in enumerate(prefix):
        if any(tok < 0 or tok in (0, bos, eos) for tok in p):  # id 0: <pad> (tformer.data.vocab)
            raise ValueError(f"prefix {i} holds a special or negative id ({p}); give ids without <s>, </s>, <pad>")
    table = torch.full((B, max(map(len, prefix), default=0)), -1, dtype=torch.long, device="cpu")  # (B, P)
    for i, p in enumerate(prefix):
        table[i, : len(p)] = torch.tensor(p, dtype=torch.long, device="cpu")
    lengths = torch.tensor([len(p) for p in prefix], dtype=max_len.dtype, device=max_len.device)  # (B,)
    return table.to(max_len.device), torch.maximum(max_len, lengths)


def select_rows(cache: Cache, rows: Tensor) -> Cache:
    """Keep (or reorder, or repeat) rows `rows` of every cached tensor, hypotheses and sentences alike."""
    return cache.reorder(rows, rows)


def owned_fp32(logits: Tensor) -> bool:
    """True when `logits` are fp32 and own their memory (a step's fresh output, the search's to overwrite): a
    rule or the log-softmax may then write over them instead of allocating an (N, V) tensor."""
    return (logits.dtype == torch.float32 and logits._base is None and logits.is_contiguous()
            and not logits.requires_grad)


def penalize_repeats(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """The repetition penalty (Keskar et al., 2019), as CTranslate2 and Hugging Face's RepetitionPenalty
    processor apply it: the logit of every token already in a row's `history` (N, t) is divided by `penalty`
    where it is positive and multiplied by it where it is negative, so with penalty > 1 a token seen before is
    less likely whatever its logit's sign (< 1 favours it). Applied to the logits (N, V), before the log-softmax
    and the masks (decode.rules.RepetitionPenalty): the searches then score with the penalised distribution.
    Returns fp32 logits: written over `logits` when they are a step's own fp32 output, in a new tensor
    otherwise; `logits` as they are for penalty 1 or an empty history."""
    if penalty == 1.0 or not history.shape[1]:
        return logits
    if not owned_fp32(logits):
        logits = logits.to(torch.float32, copy=True)
    seen = logits.gather(1, history)  # (N, t): a token repeated in the history is penalised once
    return logits.scatter_(1, history, torch.where(seen > 0, seen / penalty, seen * penalty))


def log_probs(logits: Tensor) -> Tensor:
    """log_softmax over the vocabulary, in fp32, for a step's logits (N, V). Written over them when they are
    fp32 already and own their memory (a step's fresh output: the search's to overwrite), so a step allocates
    no (N, V) tensor for it; into a new tensor otherwise (bf16 logits, or a view of someone else's)."""
    if owned_fp32(logits):
        return torch.log_softmax(logits, dim=-1, out=logits)
    return torch.log_softmax(logits.float(), dim=-1)


def forced_scores(logp: Tensor, forced: Tensor) -> Tensor:
    """(N,) the score in `logp` (N, V) of each row's `forced` token (-1 where free: any value), read before the
    masks change `logp`: what `force` gives the forced token."""
    return logp.gather(1, forced.clamp(min=0)[:, None])[:, 0]


def force(allowed: Tensor, forced: Tensor, scores: Tensor) -> Tensor:
    """A forcing rule (Rule.forced: the prefix's), applied after the masks, in place: a row whose `forced` (N,)
    entry is a token (>= 0) may take that token only, at `scores` (N,) (its log-probability or logit before the
    masks, from `forced_scores`: whatever a mask said of it); every other token is -inf. Free rows (-1) keep
    `allowed` (N, V), the scores the masks left. Returns `allowed`."""
    rows = (forced >= 0).nonzero()[:, 0]  # (R,) rows inside their prefix
    if rows.numel():
        allowed.index_fill_(0, rows, float("-inf"))
        allowed[rows, forced[rows]] = scores[rows].to(allowed.dtype)
    return allowed


def _group_width(V: int) -> int | None:
    """A divisor of V between 32 and 128, the nearest to 64 (None when V has none): the size of the groups
    `row_topk` and `row_max` first reduce V to."""
    divisors = [c for c in range(32, 129) if V % c == 0]
    return min(divisors, key=lambda c: abs(c - 64)) if divisors else None


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for a wide (N, V) x, faster on a CPU: the row's V entries in c strided groups (j, j+W,
    j+2W, ...; W = V/c); each group's max by one vectorised reduction; the k best entries lie in the k groups
    with the largest maxima (any other group's max is below k entries that are), which are gathered and
    ranked. Values equal topk's; among tied values the index may differ."""
    N, V = x.shape
    c = _group_width(V)
    if c is None or 4 * k * c > V or not x.is_contiguous():
        return x.topk(k, dim=1)
    W = V // c
    groups = x.view(N, c, W).amax(1).topk(k, dim=1).indices  # (N, k) group j holds columns j + a * W
    cols = (groups[:, :, None] + torch.arange(0, V, W, device=x.device)).reshape(N, k * c)  # (N, k c)
    values, at = x.gather(1, cols).topk(k, dim=1)
    return values, cols.gather(1, at)


def row_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """x.max(dim=1) for a wide (N, V) x, by the same groups as `row_topk`: (values, indices)."""
    N, V = x.shape
    c = _group_width(V)
    if c is None or 4 * c > V or not x.is_contiguous():
        return x.max(dim=1)
    W = V // c
    cols = x.view(N, c, W).amax(1).argmax(1)[:, None] + torch.arange(0, V, W, device=x.device)  # (N, c)
    value, at = x.gather(1, cols).max(dim=1)
    return value, cols.gather(1, at[:, None])[:, 0]
