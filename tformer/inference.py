"""Glue between a model and the searches in tformer.decode: batches of id lists in, id lists out."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.config import DecodeConfig
from tformer.data.batching import pad_frames, pad_sequences
from tformer.data.vocab import Vocab
from tformer.decode import NBest, max_lengths, search
from tformer.model import Transformer, build_model
from tformer.train.checkpoint import Checkpoint, load_checkpoint


@torch.inference_mode()
def translate_ids(model: Transformer, sources: list[list[int]] | list[Tensor], cfg: DecodeConfig) -> NBest:
    """Decode every source (ids, no specials; or frames (S, F) for a frame encoder), `cfg.batch_size` at a
    time, longest first; results in input order. Each sentence's output is independent of the batch it lands
    in. The length limit is a * (model source length) + b: tokens, or model frames after stacking."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    tokens: list[list[list[int]]] = [[] for _ in sources]
    scores: list[list[float]] = [[] for _ in sources]
    try:
        for start in range(0, len(order), cfg.batch_size):
            rows = order[start : start + cfg.batch_size]
            if isinstance(sources[rows[0]], Tensor):
                src = pad_frames([sources[i] for i in rows]).to(device)  # (B, S, F)
                src_lengths = torch.tensor([len(sources[i]) for i in rows], device=device)  # (B,)
            else:
                src = pad_sequences([sources[i] + [Vocab.eos] for i in rows], Vocab.pad).to(device)  # (B, S)
                src_lengths = torch.tensor([len(sources[i]) + 1 for i in rows], device=device)  # (B,)
            enc = model.encode(src, src_lengths)
            cache = model.init_cache(enc)
            n_src = enc.mask.sum(1) - (0 if src.is_floating_point() else 1)  # without </s>
            limit = max_lengths(n_src, cfg.max_len_a, cfg.max_len_b)  # (B,)
            hyp = search(model.decode_step, cache, limit, cfg, ids=rows)
            for i, toks, score in zip(rows, hyp.tokens, hyp.scores):
                tokens[i], scores[i] = toks, score
    finally:
        model.train(was_training)
    return NBest(tokens, scores)


def load_model(path: str, which: str = "best", overrides: list[str] = ()) -> tuple[Checkpoint, Transformer]:
    """A run folder's `which` checkpoint (or a checkpoint folder) as a model in eval mode."""
    ckpt = load_checkpoint(path, which=which, overrides=overrides)
    model = build_model(ckpt.cfg.model, *(len(t.vocab) for t in ckpt.tokenizers))
    ckpt.load_model_state(model)
    return ckpt, model.eval()
