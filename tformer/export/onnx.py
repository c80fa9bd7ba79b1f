"""Export to ONNX: two graphs that onnxruntime (or any ONNX runtime) runs, with the checkpoint's vocabularies.

    tformer export --format onnx RUN_DIR OUT        OUT/encoder.onnx, OUT/step.onnx, OUT/vocab.{src,tgt}.txt

encoder.onnx is the encoder and the first decoding step; step.onnx one decoding step over an explicit key/value
cache. Batch, source and cache lengths are dynamic. `onnx_greedy` is the decoding loop over them: the reference
use of the export, and its test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from tformer.checkpoint import save_tokenizers
from tformer.errors import ConfigError
from tformer.export import check_exportable
from tformer.model.cache import DecoderCache


class OnnxEncoder(torch.nn.Module):
    """The encoder and the first decoding step (from <s>), as one graph: src (B, S) int64 ids with </s>,
    src_lengths (B,) -> log-probabilities of the first token (B, V), src_mask (B, S), the cross-attention
    keys and values of every layer (L, B, H, S, Dh) and the self-attention cache after position 0
    (L, B, H, 1, Dh). Starting the step graph from a cache of length >= 1 keeps its shapes free of zeros."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, src, src_lengths):
        from tformer.data.vocab import Vocab

        enc = self.model.encode(src, src_lengths)
        cache = dataclasses.replace(self.model.init_cache(enc), preallocated=False)  # traced: plain tensors
        bos = torch.full((src.shape[0],), Vocab.bos, dtype=torch.long, device=src.device)
        logits, cache = self.model.decode_step(bos, cache)
        return (torch.log_softmax(logits, -1), cache.src_mask, torch.stack([k for k, _ in cache.cross]),
                torch.stack([v for _, v in cache.cross]), torch.stack([k for k, _ in cache.self_kv]),
                torch.stack([v for _, v in cache.self_kv]))


class OnnxStep(torch.nn.Module):
    """One decoding step: tokens (N,) at position t = the cache length, src_mask (N, S), cross keys/values
    (L, N, H, S, Dh), self cache (L, N, H, t, Dh) -> log-probabilities (N, V) and the cache with position t
    (L, N, H, t+1, Dh). One row per hypothesis: for a beam, repeat a sentence's rows."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens, src_mask, cross_k, cross_v, self_k, self_v):
        cache = DecoderCache(src_mask, list(zip(cross_k, cross_v)), list(zip(self_k, self_v)))
        logits, new = self.model.decode_step(tokens, cache)
        return (torch.log_softmax(logits, -1), torch.stack([k for k, _ in new.self_kv]),
                torch.stack([v for _, v in new.self_kv]))


def export_onnx(checkpoint: str | Path, out: str | Path, which: str = "best") -> tuple[Path, Path]:
    """Write OUT/encoder.onnx and OUT/step.onnx (dynamic batch, source and cache lengths) plus the
    vocabularies; returns the two model paths."""
    from tformer.api import load

    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError("ONNX export needs onnx and onnxscript: pip install 'tformer[export]'") from None
    translator = load(checkpoint, which=which, device="cpu", attention="sdpa")  # graph weights run padded too
    cfg, model = translator.config.model, translator.model
    check_exportable(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    L, H, Dh = len(model.decoder.layers), cfg.n_heads, cfg.d_model // cfg.n_heads
    B, S, T = 2, 7, 3
    src = torch.randint(4, 10, (B, S))
    lengths = torch.tensor([S, S - 2])
    batch, source, past = torch.export.Dim("batch"), torch.export.Dim("source"), torch.export.Dim("past")
    enc_path, step_path = out / "encoder.onnx", out / "step.onnx"
    with torch.inference_mode():
        torch.onnx.export(OnnxEncoder(model).eval(), (src, lengths), str(enc_path), dynamo=True,
                          input_names=["src", "src_lengths"],
                          output_names=["log_probs", "src_mask", "cross_k", "cross_v", "self_k", "self_v"],
                          dynamic_shapes=({0: batch, 1: source}, {0: batch}))
        step_args = (torch.randint(4, 10, (B,)), torch.ones(B, S, dtype=torch.bool), torch.randn(L, B, H, S, Dh),
                     torch.randn(L, B, H, S, Dh), torch.randn(L, B, H, T, Dh), torch.randn(L, B, H, T, Dh))
        torch.onnx.export(OnnxStep(model).eval(), step_args, str(step_path), dynamo=True,
                          input_names=["tokens", "src_mask", "cross_k", "cross_v", "self_k", "self_v"],
                          output_names=["log_probs", "new_self_k", "new_self_v"],
                          dynamic_shapes=({0: batch}, {0: batch, 1: source}, {1: batch, 3: source},
                                          {1: batch, 3: source}, {1: batch, 3: past}, {1: batch, 3: past}))
    save_tokenizers(translator.checkpoint.tokenizers, out)
    return enc_path, step_path


def onnx_greedy(folder: str | Path, sources: list[list[int]], max_len: int = 100) -> list[list[int]]:
    """Greedy decoding with the exported graphs in onnxruntime (ids in, ids out; <pad> and <s> never
    chosen, as in tformer's search): the reference use of the export, and its test."""
    import onnxruntime as ort

    folder = Path(folder)
    enc = ort.InferenceSession(str(folder / "encoder.onnx"), providers=["CPUExecutionProvider"])
    step = ort.InferenceSession(str(folder / "step.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for ids in sources:  # one sentence at a time: the simplest correct loop
        src = np.array([ids + [2]], dtype=np.int64)
        logp, mask, ck, cv, sk, sv = enc.run(None, {"src": src, "src_lengths": np.array([src.shape[1]])})
        tokens: list[int] = []
        for _ in range(max_len):
            logp[:, :2] = -np.inf
            tok = int(logp[0].argmax())
            if tok == 2:
                break
            tokens.append(tok)
            logp, sk, sv = step.run(None, {"tokens": np.array([tok], dtype=np.int64), "src_mask": mask,
                                           "cross_k": ck, "cross_v": cv, "self_k": sk, "self_v": sv})
        out.append(tokens)
    return out
