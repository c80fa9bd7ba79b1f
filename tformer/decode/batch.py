"""The live part of a search's batch, and everything kept in step with its rows: the one place where rows
take their tokens, follow their parents and leave (a sentence stopped or done), the cache and the rules' state
with them. The three searches only choose. Notation: L live units (a sentence; in sampling, one sample), k
rows per unit (beam: its hypotheses; else 1), N = L x k rows, T the longest output allowed, t tokens so far."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.data.vocab import Vocab
from tformer.decode.common import Cache, StepFn, Stop, stopped
from tformer.decode.rules import Rules


class Batch:
    """What a search decodes now: `cache` and `rules` (decode.rules.Rules) follow the rows, `sentence` (L,) is
    each unit's sentence in the search's batch, `carried` the search's own value per unit, kept with it
    (greedy: whether the row still runs; beam: the hypotheses' raw scores (L, k); sampling: the sample's
    index). `out` (B, T), if given (greedy: one row per unit), receives each unit's tokens as it leaves. The
    rules read `t`, `history` and `row_sentence` from it (common.Rule)."""

    def __init__(self, cache: Cache, rules: Rules, sentence: Tensor, carried: Tensor, width: int,
                 out: Tensor | None = None) -> None:
        N, device = sentence.shape[0], sentence.device
        self.cache, self.rules = cache, rules
        self.sentence, self.carried, self.out = sentence, carried, out  # (L,), (L, ...), (B, T)
        self.k, self.t = 1, 0
        self.tokens = torch.full((N, width), Vocab.eos, dtype=torch.long, device=device)  # (N, T) </s> past t
        self.prev = torch.full((N,), Vocab.bos, dtype=torch.long, device=device)  # (N,) the next step's input
        self._parents: Tensor | None = None  # (N,) each row's parent, while the cache has not followed yet

    @property
    def L(self) -> int:
        return self.sentence.shape[0]

    @property
    def history(self) -> Tensor:
        """(N, t) each row's tokens so far (a view)."""
        return self.tokens[:, : self.t]

    @property
    def row_sentence(self) -> Tensor:
        """(N,) each row's sentence in the search's batch."""
        return self.sentence if self.k == 1 else self.sentence.repeat_interleave(self.k)

    def go_on(self, stop: Stop | None) -> bool:
        """Take out the units whose sentence `stop` ends now (common.stopped); whether any unit is left."""
        gone = stopped(stop, self.sentence)  # (L,) or None
        if gone is not None:
            self.keep(gone)
        return bool(self.L)

    def step(self, step: StepFn) -> Tensor:
        """(N, V) the next token's logits for every row, the cache moved on."""
        logits, self.cache = step(self.prev, self.cache)
        return logits

    def advance(self, tokens: Tensor, parents: Tensor | None = None) -> None:
        """Every row takes `tokens` (N',); with `parents` (N',) (beam), new row i continues row parents[i], and
        the cache follows at the next `keep`."""
        if parents is not None:
            self.tokens = self.tokens.index_select(0, parents)  # (N', T)
            self.k = tokens.shape[0] // self.L
        self.tokens[:, self.t] = tokens
        self.t += 1
        self.prev = tokens
        self.rules.advance(parents, tokens)
        self._parents = parents

    def keep(self, gone: Tensor | None) -> None:
        """Units `gone` (L,) bool (None: none) leave, with their rows; the cache follows the rows' parents."""
        parents, self._parents = self._parents, None
        if gone is None:
            if parents is not None:
                self.cache = self.cache.reorder(parents)
            return
        if self.out is not None:  # what every unit has so far: the leaving ones' last
            self.out.index_copy_(0, self.sentence, self.tokens)
        units = (~gone).nonzero()[:, 0]  # (L',)
        k = self.k
        rows = units if k == 1 else (units[:, None] * k + torch.arange(k, device=units.device)).reshape(-1)  # (L'k,)
        self.sentence, self.carried = self.sentence[units], self.carried[units]
        self.prev, self.tokens = self.prev.index_select(0, rows), self.tokens.index_select(0, rows)
        self.cache = self.cache.reorder(rows if parents is None else parents.index_select(0, rows), units)
        self.rules.select(rows)
