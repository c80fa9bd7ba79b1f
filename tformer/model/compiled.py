"""The decoding step compiled ahead of time (`decode.compile`): the model's own `decode_step`, exported by torch.export
and compiled by AOTInductor into C++ kernels, so a step no longer pays PyTorch's cost per operator (a few
microseconds each, a few hundred per step) and Python's around them.

It is the same function, not a second model: the graph is `Transformer.decode_step` over a cache of plain tensors
(what the ONNX export traces, tformer.export.onnx), with the batch, the hypotheses, the source and the positions
decoded all dynamic, so one compilation serves every batch. The searches see a step function and a cache with
`reorder`, as always (`CompiledStep`, `CompiledCache`).

Measured (benchmarks/aot_step.py, benchmarks/RESULTS.md): on a Zen 4, a `student_small`-shaped model's greedy
step ran 1.6-2.0x as fast at 1-32 sentences, and an OPUS-MT-base-shaped one 1.6-1.8x at 8 sentences and 1.15x at 32,
but 0.9x at one sentence (tformer's eager products of one row are faster than the ones inductor calls). So where
it runs is measured too: at load, eager and compiled steps take turns on made-up batches of 1, 4, 16 and 64 rows
(hypotheses), and a search whose batch starts with N rows runs the one that won at the count nearest to N
(`CompiledStep.wins`); the choice is saved beside the package.

Compiling takes about 30 s on two cores (export included), once per model, machine and torch version: the package
is saved under $TFORMER_CACHE/steps and loaded from there afterwards. It holds its own copy of the weights (frozen
into the package, in its own layouts: an OPUS-MT-base-shaped model's process grew from 1.37 to 2.09 GB; mapping
them from the file instead, `force_mmap_weights`, saved nothing). CPU, fp32, one model, the vanilla
Transformer that the exports cover (tformer.config_checks.export_problems); a lexical shortlist decodes eagerly.

Notation: L decoder layers, B sentences, N = B x K hypotheses (K per sentence, consecutive rows), H heads, S source
length, t positions decoded, Dh head dim, V vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from tformer.config_checks import export_problems
from tformer.errors import ConfigError
from tformer.files import cache_dir, replace_atomically
from tformer.model.cache import DecoderCache

log = logging.getLogger(__name__)

ROWS = (1, 4, 16, 64)  # the row counts (hypotheses) at which the compiled step is timed against the eager one


class _Step(nn.Module):
    """`decode_step` over plain tensors: tokens (N,), src_mask (B, S), cross keys/values (L, B, H, S, Dh) each,
    self keys/values (L, N, H, t, Dh) each -> logits (N, V) and the self keys/values with position t added."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, src_mask: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: Tensor,
                self_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        cache = DecoderCache(src_mask, list(zip(cross_k, cross_v)), list(zip(self_k, self_v)), preallocated=False)
        logits, new = self.model.decode_step(tokens, cache)
        return logits, torch.stack([k for k, _ in new.self_kv]), torch.stack([v for _, v in new.self_kv])


@dataclass(frozen=True)
class CompiledCache:
    """What the compiled step reads and returns: per sentence (B) what depends on the source, per hypothesis (N)
    the self-attention keys and values so far, every layer's stacked."""

    src_mask: Tensor  # (B, S) bool
    cross_k: Tensor  # (L, B, H, S, Dh)
    cross_v: Tensor
    self_k: Tensor  # (L, N, H, t, Dh)
    self_v: Tensor

    @property
    def t(self) -> int:
        return self.self_k.shape[3]

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "CompiledCache":
        """Keep, reorder or repeat hypotheses (`hyp_rows` (N',)) and, if given, sentences (`sentence_rows`)."""
        def sentences(x: Tensor, dim: int) -> Tensor:
            return x if sentence_rows is None else x.index_select(dim, sentence_rows)

        return CompiledCache(sentences(self.src_mask, 0), sentences(self.cross_k, 1), sentences(self.cross_v, 1),
                             self.self_k.index_select(1, hyp_rows), self.self_v.index_select(1, hyp_rows))


class CompiledStep:
    """A step function for the searches (decode.common.StepFn) over a `CompiledCache`; `start` turns the model's
    `init_cache` into one."""

    def __init__(self, run: Callable[..., list[Tensor]], positions: int, seconds: float, path: Path,
                 faster: tuple[bool, ...] = (True,) * len(ROWS)) -> None:
        self._run = run
        self.positions = positions  # the most positions it decodes (the model's table of positions)
        self.seconds = seconds  # what compiling took (0: loaded from the disk)
        self.path = path
        self.faster = faster  # per count of ROWS: whether it ran faster than the eager step (`measure`)

    def summary(self) -> dict:
        """What compiling cost and where the compiled step runs, for a report (`tformer serve`'s /v1/info)."""
        return {"compile_seconds": round(self.seconds, 1), "package": str(self.path),
                "compiled_at_rows": [r for r, fast in zip(ROWS, self.faster) if fast],
                "eager_at_rows": [r for r, fast in zip(ROWS, self.faster) if not fast]}

    def wins(self, rows: int) -> bool:
        """Whether a search starting with `rows` rows (sentences x beams) runs faster compiled: the measurement
        at the count of ROWS nearest to it, on a log scale."""
        return self.faster[min(range(len(ROWS)), key=lambda i: abs(math.log(ROWS[i]) - math.log(max(rows, 1))))]

    def start(self, cache: DecoderCache) -> CompiledCache:
        """The model's cache before the first position (`Transformer.init_cache`) as the compiled step reads it."""
        cross_k = torch.stack([k for k, _ in cache.cross])  # (L, B, H, S, Dh)
        cross_v = torch.stack([v for _, v in cache.cross])
        L, B, H, _, Dh = cross_k.shape
        empty = cross_k.new_empty(L, B, H, 0, Dh)
        return CompiledCache(cache.src_mask, cross_k, cross_v, empty, empty)

    def __call__(self, tokens: Tensor, cache: CompiledCache) -> tuple[Tensor, CompiledCache]:
        if cache.t >= self.positions:
            raise ConfigError(f"the compiled decoding step decodes at most {self.positions} positions (its table "
                              f"of positions); lower decode.max_len_a / max_len_b, or decode with decode.compile=false")
        logits, self_k, self_v = self._run(tokens, cache.src_mask, cache.cross_k, cache.cross_v, cache.self_k,
                                           cache.self_v)
        return logits, CompiledCache(cache.src_mask, cache.cross_k, cache.cross_v, self_k, self_v)


def compile_problems(model: nn.Module) -> list[str]:
    """Why `model` has no compiled step (empty: it can have one)."""
    from tformer.model.transformer import Transformer

    if not isinstance(model, Transformer):
        return ["an ensemble (several checkpoints)"]
    problems = export_problems(model.cfg)
    if model.cfg.attention == "graph":
        problems.append("model.attention=graph (packed rows; use sdpa or dense)")
    weight = model.tgt_embed.tokens.weight
    if weight.device.type != "cpu":
        problems.append(f"a model on {weight.device.type} (the CPU only)")
    if weight.dtype != torch.float32 or any("quantized" in type(m).__module__ for m in model.modules()):
        problems.append("weights not in fp32 (decode.precision=fp32 and decode.quantize=none only)")
    return problems


def _key(model: nn.Module) -> str:
    """The model's weights and configuration, this CPU and torch: what a saved package is valid for."""
    from tformer.model.matmul import _machine_key

    h = hashlib.sha256(repr(model.cfg).encode() + _machine_key().encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode() + str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
    return h.hexdigest()[:24]


def compile_step(model: nn.Module) -> CompiledStep:
    """`model`'s decoding step compiled ahead of time (see the module docstring), read from $TFORMER_CACHE/steps
    when this model, machine and torch version were compiled before; ConfigError, with the reasons, where it
    cannot be (`compile_problems`)."""
    problems = compile_problems(model)
    if problems:
        raise ConfigError("decode.compile: this model's step cannot be compiled: " + "; ".join(problems))
    path = cache_dir() / "steps" / f"step-{_key(model)}.pt2"
    seconds = 0.0
    if not path.exists():
        tic = time.perf_counter()
        log.info("compile: compiling the decoding step (AOTInductor; about 30 s on two cores, once per model)")
        from torch._inductor.exc import CppCompileError, InductorError, InvalidCxxCompiler

        try:
            _compile(model, path)
        except (InvalidCxxCompiler, CppCompileError, InductorError, OSError) as e:
            detail = str(e).strip().splitlines()
            raise ConfigError(f"decode.compile: compiling the decoding step failed ({type(e).__name__}: "
                              f"{detail[0] if detail else ''}); it needs a C++ compiler (c++, or $CXX); decode "
                              f"without --compile (decode.compile=false)") from e
        seconds = time.perf_counter() - tic
        log.info("compile: the decoding step compiled in %.0f s, saved to %s", seconds, path)
    step = CompiledStep(torch._inductor.aoti_load_package(str(path)), _positions(model), seconds, path)
    choice = path.with_suffix(".json")
    try:
        faster = tuple(json.loads(choice.read_text())["faster"])
        if len(faster) != len(ROWS) or not all(isinstance(f, bool) for f in faster):
            raise ValueError(f"{len(faster)} entries")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            log.info("compile: %s unreadable (%s); timing again", choice, e)
        faster = measure(model, step)
        with replace_atomically(choice) as f:
            json.dump({"rows": list(ROWS), "faster": list(faster)}, f)
    step.faster = faster
    where = step.summary()
    log.info("compile: measured faster compiled at %s rows (sentences x beams), eager at %s",
             where["compiled_at_rows"] or "no", where["eager_at_rows"] or "no")
    return step


def measure(model: nn.Module, step: CompiledStep, steps: int = 6) -> tuple[bool, ...]:
    """Per count of ROWS, whether `step` decoded `steps` positions of a made-up batch of that many sentences (16
    source tokens each) faster than the model's eager `decode_step`, taking turns (matmul._fastest)."""
    from tformer.model.matmul import _fastest

    g = torch.Generator().manual_seed(0)
    vocab = model.src_embed.tokens.num_embeddings
    faster = []
    with torch.inference_mode():
        for rows in ROWS:
            enc = model.encode(torch.randint(4, vocab, (rows, 16), generator=g), torch.full((rows,), 16))
            tokens = torch.randint(4, model.generator.out_features, (rows,), generator=g)

            def eager(tokens=tokens, enc=enc):
                cache = model.init_cache(enc)
                for _ in range(steps):
                    _, cache = model.decode_step(tokens, cache)

            def compiled(tokens=tokens, enc=enc):
                cache = step.start(model.init_cache(enc))
                for _ in range(steps):
                    _, cache = step(tokens, cache)

            faster.append(_fastest({"compiled": compiled, "eager": eager}) == "compiled")
    return tuple(faster)


def _positions(model: nn.Module) -> int:
    """How many positions the decoder's table holds: a learned table's rows, or the sinusoids computed so far (the
    compiled graph reads that table; eagerly it grows)."""
    positions = model.tgt_embed.positions
    return getattr(positions, "max_positions", None) or positions.table.shape[0]


def _compile(model: nn.Module, path: Path) -> None:
    import torch._inductor.config as inductor

    cfg = model.cfg
    L, H, Dh = len(model.decoder.layers), cfg.n_heads, cfg.d_model // cfg.n_heads
    B, K, S, t = 2, 3, 7, 3  # example sizes, all dynamic in the graph
    example = (torch.randint(4, 10, (B * K,)), torch.ones(B, S, dtype=torch.bool), torch.randn(L, B, H, S, Dh),
               torch.randn(L, B, H, S, Dh), torch.randn(L, B * K, H, t, Dh), torch.randn(L, B * K, H, t, Dh))
    hyps, sentences, source = torch.export.Dim("hyps"), torch.export.Dim("sentences"), torch.export.Dim("source")
    past = torch.export.Dim("past", max=_positions(model) - 1)
    dims = ({0: hyps}, {0: sentences, 1: source}, {1: sentences, 3: source}, {1: sentences, 3: source},
            {1: hyps, 3: past}, {1: hyps, 3: past})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # (the packager wants the .pt2 ending)
    with torch.no_grad(), inductor.patch(freezing=True):
        program = torch.export.export(_Step(model).eval(), example, dynamic_shapes=dims, strict=False)
        torch._inductor.aoti_compile_and_package(program, package_path=str(tmp))
    tmp.replace(path)  # whole or not at all: a process killed while compiling leaves no package that loads
