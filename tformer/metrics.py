"""Accuracies as pure functions (BLEU and chrF arrive with the translation recipes)."""

from __future__ import annotations

from torch import Tensor


def token_accuracy(logits: Tensor, target: Tensor, pad: int) -> tuple[int, int]:
    """(correct, total) over non-pad positions; logits (N, V), target (N,)."""
    real = target != pad
    return int(((logits.argmax(-1) == target) & real).sum()), int(real.sum())


def exact_match(hypotheses: list[list], references: list[list]) -> float:
    """Fraction of hypotheses equal to their reference as whole sequences."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        return 0.0
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)
