"""Several trained models decoding as one: at every step each model scores the next token and their
log-probabilities are averaged (OpenNMT-py's ensembles; the searches renormalise the mean, so it is the
normalised geometric mean of the models' distributions). An Ensemble answers what decoding asks of a model
(encode, init_cache, decode_step: tformer.inference.translate_ids), so greedy, beam and sampling decode it
unchanged, batch-invariant as for one model. Its members must share the target vocabulary (one checkpoint's
tokenizers read and write for all).

Notation: M models, B sentences, N hypotheses, V target vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer.decode.common import log_probs
from tformer.model.cache import DecoderCache
from tformer.model.output import Projection
from tformer.model.transformer import EncoderOutput, Transformer


class EnsembleEncoding(NamedTuple):
    outputs: list[EncoderOutput]  # one per model

    @property
    def mask(self) -> Tensor:
        """(B, S) bool: the positions every model's memory has (the models read the same source)."""
        return self.outputs[0].mask


class EnsembleCache(NamedTuple):
    caches: list[DecoderCache]  # one per model

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "EnsembleCache":
        return EnsembleCache([c.reorder(hyp_rows, sentence_rows) for c in self.caches])


class Ensemble(nn.Module):
    def __init__(self, models: list[Transformer]) -> None:
        super().__init__()
        if len(models) < 2:
            raise ValueError("an ensemble needs at least two models")
        vocab = {m.generator.out_features for m in models}
        if len(vocab) != 1:
            raise ValueError(f"the models have target vocabularies of different sizes {sorted(vocab)}")
        self.models = nn.ModuleList(models)
        self.cfg = models[0].cfg

    @property
    def generator(self) -> nn.Module:  # its size is what callers read (out_features)
        return self.models[0].generator

    def encode(self, src: Tensor, src_lengths: Tensor) -> EnsembleEncoding:
        return EnsembleEncoding([m.encode(src, src_lengths) for m in self.models])

    def init_cache(self, enc: EnsembleEncoding) -> EnsembleCache:
        return EnsembleCache([m.init_cache(e) for m, e in zip(self.models, enc.outputs)])

    def restricted_output(self, ids: Tensor) -> list[Projection]:
        """Each model's output projection of the target ids `ids` (K,) only, for decode_step."""
        return [m.restricted_output(ids) for m in self.models]

    def decode_step(self, tokens: Tensor, cache: EnsembleCache, output: list[Projection] | None = None
                    ) -> tuple[Tensor, EnsembleCache]:
        """tokens (N,) -> the mean of the models' log-probabilities (N, V) and the caches with this position;
        with `output` (`restricted_output`), over its K ids only (N, K), each model normalised over them."""
        outputs = output if output is not None else [None] * len(self.models)
        steps = [m.decode_step(tokens, c, o) for m, c, o in zip(self.models, cache.caches, outputs)]
        logp = torch.stack([log_probs(logits) for logits, _ in steps]).mean(0)  # (N, V)
        return logp, EnsembleCache([c for _, c in steps])
