"""Decoding sees a step function and a cache, never the model class.

    step(tokens (B,), cache) -> (logits (B, V), cache)

The cache is a dict of tensors with the batch first, so any search can keep or reorder rows.
"""

from tformer.decode.greedy import Hypotheses, greedy_search, max_lengths, select_rows

__all__ = ["Hypotheses", "greedy_search", "max_lengths", "select_rows"]
