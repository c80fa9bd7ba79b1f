"""Lexical constraints: a decoding rule of beam search (decode.rules), read from the phrase input
"constraints". Every output of a sentence must hold each of its phrases (token id lists) somewhere, as a
contiguous run of tokens.

The rule keeps, per hypothesis, where it stands: which phrases it has completed (a bit mask) and the longest
end of its output that begins a phrase (a node of the sentence's Aho-Corasick automaton over its phrases,
whose failure links find a phrase that starts inside another). From any such state, `dist` says how many more
tokens the shortest output holding every phrase still needs; it is computed exactly, over the automaton, when
the batch begins. Three things follow from it:

- a token is allowed only if the state it leads to still fits: its `dist` at most the tokens left before the
  sentence's length limit; </s> only once every phrase is in. So every hypothesis alive can still finish with
  all its phrases, and the search always returns outputs that hold them;
- a limit too short for the phrases (after the prefix, if any) is raised to the shortest length that holds
  them, as a limit shorter than a prefix is raised to it;
- `progress` (the tokens of the shortest completion already made: D - dist, D the whole need) sorts the
  beam's candidates into banks. A constraint's first token is rarely among a hypothesis's best few, so
  without banks the beam fills with hypotheses that put the phrases off until the limit forces them. The
  candidates are every hypothesis's best 2K tokens and every token of the batch's phrases; they are taken
  round-robin across banks, each bank's best first, the bank with more progress first on a tie (Post &
  Vilar's dynamic beam allocation, 2018, with Hu et al.'s vectorised form, 2019; the beam is shared by the
  banks that have candidates, not split into fixed shares).

A sentence without phrases is one bank: its candidates are taken in score order, so it decodes exactly as
without the rule, whatever its batch holds. Notation: B sentences, N hypothesis rows, M automaton nodes of the
whole batch, a the most tokens in one sentence's phrases, S = 2^C masks (C: the most phrases of one sentence).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from tformer.decode.common import PhraseInput, Rule

MAX_PHRASES = 8  # per sentence: the states are masks over them, 2^C per automaton node
_FAR = 1 << 20  # `dist` of a state that cannot complete (never met: every state can emit the missing phrases)


def _automaton(phrases: list[list[int]], alphabet: list[int]) -> tuple[list[list[int]], list[int]]:
    """The Aho-Corasick automaton of `phrases` over `alphabet` plus one column for any other token: the
    transitions (m, A + 1) as node lists, node 0 the root, and each node's mask of the phrases that end there
    (the failure links' included)."""
    children: list[dict[int, int]] = [{}]
    out = [0]
    for c, phrase in enumerate(phrases):
        node = 0
        for tok in phrase:
            if tok not in children[node]:
                children.append({})
                out.append(0)
                children[node][tok] = len(children) - 1
            node = children[node][tok]
        out[node] |= 1 << c
    column = {tok: a for a, tok in enumerate(alphabet)}
    delta = [[0] * (len(alphabet) + 1) for _ in children]
    fail, queue = [0] * len(children), []
    for tok, child in children[0].items():
        delta[0][column[tok]] = child
        queue.append(child)
    while queue:  # breadth first: a node's failure link is shallower, so it is complete when reached
        node = queue.pop(0)
        out[node] |= out[fail[node]]
        delta[node] = list(delta[fail[node]])
        for tok, child in children[node].items():
            fail[child] = delta[fail[node]][column[tok]]
            delta[node][column[tok]] = child
            queue.append(child)
    return delta, out


def _distances(delta: Tensor, out: Tensor, C: int) -> Tensor:
    """(m, 2^C) the fewest tokens from each (node, mask) to an output holding all C phrases: 0 at the full
    mask, else 1 + the best next state's; by relaxation over all tokens until nothing changes."""
    m = delta.shape[0]
    masks = torch.arange(1 << C)
    full = (1 << C) - 1
    dist = torch.full((m, 1 << C), _FAR, dtype=torch.long)
    dist[:, full] = 0
    nxt_mask = out[delta][:, :, None] | masks  # (m, A+1, S) the mask after each token
    nxt_node = delta[:, :, None].expand_as(nxt_mask)  # (m, A+1, S)
    while True:
        best = dist[nxt_node, nxt_mask].amin(1) + 1  # (m, S)
        new = torch.minimum(dist, best)
        if torch.equal(new, dist):
            return dist
        dist = new


class Constraints(Rule):
    """The rule's tables for one batch, and the state of each hypothesis row: a mask on the step's scores,
    state kept with the rows (`select`) and moved on by the chosen tokens (`advance`), and beam search's choice
    among candidates (`candidates`: the phrases' tokens beside each row's best; `take`: the banks).
    Each sentence has its own alphabet (the tokens of its phrases, padded with -1 to the batch's longest, a):
    a row looks at its own sentence's few tokens, never at the whole batch's."""

    phrase = PhraseInput("constraints", "target phrases every output must hold (lexically constrained beam search)",
                         MAX_PHRASES, ("beam",), True)

    def __init__(self, alphabet: Tensor, delta: Tensor, out: Tensor, dist: Tensor, roots: Tensor, need: Tensor,
                 full: Tensor, node: Tensor, met: Tensor, max_len: Tensor, eos: int) -> None:
        self.alphabet = alphabet  # (B, a) each sentence's phrase tokens, -1 past them
        self.delta, self.out, self.dist = delta, out, dist  # (M, a+1) by local column (a: any other), (M,), (M, S)
        self.roots, self.need, self.full = roots, need, full  # (B,) each sentence's root, its need D, its full mask
        self.node, self.met = node, met  # (N,) each row's automaton node and mask
        self.sentence = torch.arange(len(roots), device=roots.device)  # (N,) each row's sentence
        self.max_len, self.eos = max_len, eos  # (B,) the limits, final (no later rule raises them); </s>

    @classmethod
    def of(cls, given: Any, max_len: Tensor) -> tuple["Constraints | None", Tensor]:
        """The rule for a batch (decode.rules.Given) whose phrase input "constraints" holds a phrase; else None."""
        phrases = given.phrases.get(cls.phrase.name)
        if phrases is None or not any(phrases):
            return None, max_len
        return cls.build(phrases, given.prefix, max_len, given.eos, (0, given.bos, given.eos))  # id 0: <pad>

    @classmethod
    def build(cls, phrases: Sequence[Sequence[Sequence[int]] | None], prefix: Tensor, max_len: Tensor, eos: int,
              specials: Sequence[int] = ()) -> tuple["Constraints", Tensor]:
        """The rule for a batch: `phrases`, one list of token id lists per sentence (None or empty: none);
        `prefix` (B, P) the forced prefixes padded with -1 (common.prefix_table); `specials`: ids no phrase may
        hold (<pad>, <s>, </s>). Returns it, with one row per sentence at the start, and the limits `max_len`
        (B,) raised where the phrases do not fit."""
        B, device = max_len.shape[0], max_len.device
        phrases = [[list(p) for p in (s or ())] for s in phrases]
        if len(phrases) != B:
            raise ValueError(f"{len(phrases)} constraint lists for a batch of {B} sentences")
        for i, s in enumerate(phrases):
            if len(s) > MAX_PHRASES:
                raise ValueError(f"sentence {i} has {len(s)} constraints; at most {MAX_PHRASES} per sentence")
            if any(not p or min(p) < 0 or set(p) & set(specials) for p in s):
                raise ValueError(f"sentence {i}: a constraint is empty or holds a negative or special id ({s}); give "
                                 "ids without <s>, </s>, <pad>")
        alphabets = [sorted({tok for p in s for tok in p}) for s in phrases]
        a = max(map(len, alphabets), default=0)
        C = max(map(len, phrases), default=0)
        deltas, outs, dists, roots, need, full, start, offset = [], [], [], [], [], [], [], 0
        for i, (s, alphabet) in enumerate(zip(phrases, alphabets)):
            delta, out = _automaton(s, alphabet)
            delta_t, out_t = torch.tensor(delta), torch.tensor(out)
            dist = torch.full((len(delta), 1 << C), _FAR, dtype=torch.long)
            dist[:, : 1 << len(s)] = _distances(delta_t, out_t, len(s))
            node, met = 0, 0
            for tok in prefix[i].tolist():  # where the prefix leaves the sentence
                if tok < 0:
                    break
                node = delta[node][alphabet.index(tok) if tok in alphabet else len(alphabet)]
                met |= out[node]
            other = delta_t[:, -1:]  # padded columns (never a token's) lead where any other token does
            deltas.append(torch.cat([delta_t[:, :-1], other.expand(-1, a - len(alphabet)), other], 1) + offset)
            outs.append(out_t)
            dists.append(dist)
            roots.append(offset)
            need.append(int(dist[0, 0]))
            full.append((1 << len(s)) - 1)
            start.append((offset + node, met, int((prefix[i] >= 0).sum()) + int(dist[node, met])))
            offset += len(delta)
        as_long = dict(dtype=torch.long, device=device)
        table = torch.tensor([al + [-1] * (a - len(al)) for al in alphabets], **as_long).reshape(B, a)
        shortest = torch.tensor([n for _, _, n in start], dtype=max_len.dtype, device=device)
        max_len = torch.maximum(max_len, shortest)
        rule = cls(table, torch.cat(deltas).to(device), torch.cat(outs).to(device),
                   torch.cat(dists).to(device), torch.tensor(roots, **as_long), torch.tensor(need, **as_long),
                   torch.tensor(full, **as_long), torch.tensor([n for n, _, _ in start], **as_long),
                   torch.tensor([m for _, m, _ in start], **as_long), max_len, eos)
        return rule, max_len

    def select(self, rows: Tensor) -> None:
        """Keep, reorder or repeat hypothesis rows (as the cache's hyp-level entries)."""
        self.node, self.met = self.node.index_select(0, rows), self.met.index_select(0, rows)
        self.sentence = self.sentence.index_select(0, rows)

    def extra(self) -> Tensor:
        """(N, a) each row's sentence's phrase tokens, -1 past them: candidates beside the row's best ones."""
        return self.alphabet.index_select(0, self.sentence)

    def _after(self, tokens: Tensor, own: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(node, mask) after each row takes its `tokens` (N, n); `own`: the rows' alphabets (extra()), if
        at hand. </s> moves a row as any other token does: only `progress` asks, and an ending has it all."""
        own = self.extra() if own is None else own  # (N, a)
        hit = tokens[:, :, None] == own[:, None, :]  # (N, n, a)
        column = torch.where(hit.any(2), hit.int().argmax(2), own.shape[1])  # (N, n) local column, a: other
        node = self.delta[self.node[:, None], column]  # (N, n)
        return node, self.met[:, None] | self.out[node]

    def mask(self, logp: Tensor, at: Any) -> Tensor:
        """The rule on a step's scores (N, V), in place: -inf for every token after which the row's phrases no
        longer fit in the tokens left (its limit minus the tokens it will have), and for </s> until every
        phrase is in."""
        remaining = self.max_len.index_select(0, self.sentence) - at.t - 1  # (N,)
        own = self.extra()  # (N, a)
        cols = own.clamp(min=0)  # padding reads and writes <pad>'s column, which is -inf already
        kept = logp.gather(1, cols)  # (N, a) the phrases' tokens, judged one by one below
        other = self.dist[self.roots[self.sentence], self.met]  # (N,) any other token: back to the root
        short = (other > remaining).nonzero()[:, 0]  # rows that must go on with their phrases' tokens only
        if short.numel():
            logp.index_fill_(0, short, float("-inf"))
        node, met = self._after(cols, own)  # (N, a)
        fits = (self.dist[node, met] <= remaining[:, None]) & (own >= 0)  # (N, a)
        logp.scatter_(1, cols, kept.masked_fill(~fits, float("-inf")))
        logp[:, self.eos].masked_fill_(self.met != self.full[self.sentence], float("-inf"))
        return logp

    def progress(self, tokens: Tensor) -> Tensor:
        """(N, n) each candidate's bank: how many tokens of its sentence's shortest completion the row has made
        once it takes `tokens` (N, n); 0 for a sentence without phrases."""
        node, met = self._after(tokens)
        return self.need[self.sentence][:, None] - self.dist[node, met]

    def advance(self, rows: Tensor | None, tokens: Tensor) -> None:
        """Each new row continues parent row `rows` (N',) (None: itself) by `tokens` (N',)."""
        if rows is not None:
            self.select(rows)
        node, met = self._after(tokens[:, None])
        self.node, self.met = node[:, 0], met[:, 0]

    def candidates(self, scores: Tensor, values: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's candidates: its best (values, tokens) (N, n) and every token of its sentence's phrases
        that is not among them already (-inf where it is), read from `scores` (N, V)."""
        extra = self.extra()  # (N, a) the row's sentence's phrase tokens, -1 past them
        seen = (extra[:, :, None] == tokens[:, None, :]).any(2) | (extra < 0)
        extra = extra.clamp(min=0)  # padding: <pad>, at -inf
        extra_values = scores.gather(1, extra).masked_fill(seen, float("-inf"))
        return torch.cat([values, extra_values], 1), torch.cat([tokens, extra], 1)

    def take(self, cand: Tensor, tokens: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """(scores, positions) (L, n) of the n candidates `cand` (L, m) the banks take (`choose`), by the progress
        each candidate's token (`tokens`, (N, m/k)) makes."""
        banks = self.progress(tokens).reshape(cand.shape)  # (L, m)
        at = choose(cand, banks, n)
        return cand.gather(1, at), at


def choose(scores: Tensor, banks: Tensor, n: int) -> Tensor:
    """(L, n) the positions of the candidates the beam keeps, in the order taken: each sentence's candidates
    `scores` (L, m) ranked within their banks `banks` (L, m), then taken round-robin, best of each bank
    first and the higher bank first among equals; -inf candidates last. With one bank: score order."""
    order = scores.argsort(dim=1, descending=True, stable=True)  # (L, m)
    bank = banks.gather(1, order)
    nb = int(banks.max()) + 1 if banks.numel() else 1
    seen = torch.nn.functional.one_hot(bank.clamp(min=0), nb).cumsum(1)  # (L, m, nb)
    rank = seen.gather(2, bank.clamp(min=0)[:, :, None])[:, :, 0] - 1  # (L, m) rank within its bank
    key = rank * nb + (nb - 1 - bank)
    key = key.masked_fill(~torch.isfinite(scores.gather(1, order)), torch.iinfo(key.dtype).max)
    return order.gather(1, key.argsort(dim=1, stable=True)[:, :n])
