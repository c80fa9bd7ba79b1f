"""`train.compile`: the model's forward pass through torch.compile (TorchInductor), with the loss, the backward
pass's bookkeeping, the optimizer and evaluation as they were.

    forward     compiled once with symbolic sizes (dynamic=True): token-budget batches of any batch size and
                lengths reuse the one graph, so a resume that starts on another batch runs the same code
    randomness  inductor draws dropout's bits from torch's generator, as eager does (fallback_random), so the
                RNG state saved in a checkpoint still decides every mask
    exactness   inductor sums the gradients of gathers (embeddings, index_put) with atomic adds whose order
                changes from run to run (measured: the same batch's gradients twice, not bitwise equal); the run
                turns on torch.use_deterministic_algorithms (warn_only), under which inductor leaves those
                sums to PyTorch's deterministic kernels: the same batch gives the same gradients, and a
                resumed run equals a straight one bitwise
    cache       inductor keeps compiled code on disk (TORCHINDUCTOR_CACHE_DIR, by default
                /tmp/torchinductor_$USER): a second run of the same model compiles from it, much faster
    fallback    where torch.compile cannot run (no dynamo for this Python, no C++ compiler, an operation it
                cannot trace) the first call fails; the run logs the reason once and goes on eager

Compiling takes its time in the first update (and the first backward); `tformer train` logs it. Whether it
pays depends on the machine: benchmarks/train_throughput.py --compile measures it beside eager.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

log = logging.getLogger("tformer")


def cache_dir() -> str:
    """Where inductor keeps compiled code (its own default unless TORCHINDUCTOR_CACHE_DIR says otherwise)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
        return inductor_cache_dir()
    except Exception:  # a torch without that module: say what the variable would be
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def why_not(device: torch.device) -> str | None:
    """Why torch.compile cannot run here at all (a sentence), or None."""
    import torch._dynamo

    try:
        torch._dynamo.eval_frame.check_if_dynamo_supported()
    except RuntimeError as e:
        return str(e)
    if device.type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as e:  # inductor's CPU code is C++
            return f"inductor needs a C++ compiler for CPU code ({e})"
    return None


class CompiledForward:
    """The model as the training step calls it: `model(...)` runs the compiled forward, and every attribute
    (generator, ctc, ...) is the model's own, so the loss code does not know the difference. The parameters,
    the state dict and the checkpoints stay the model's (no `_orig_mod.` prefixes)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.reason = why_not(device)
        self.compiled = None if self.reason else torch.compile(model, dynamic=True,
                                                               options={"fallback_random": True})
        self.compiled_once = self.told = False  # the first compiled call done; the trainer told of it
        if self.reason:
            log.warning("train.compile: cannot compile here: %s; training runs eager", self.reason)

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            return self.model(*args, **kwargs)
        if self.compiled_once:
            return self.compiled(*args, **kwargs)
        rng = torch.get_rng_state()  # a failed attempt must not move the dropout stream
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:  # torch.compile raises many kinds (BackendCompilerFailed, Unsupported, ...)
            self.reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            self.compiled = None
            torch.set_rng_state(rng)
            log.warning("train.compile: compiling the forward failed (%s); training runs eager", self.reason)
            return self.model(*args, **kwargs)
        self.compiled_once = True
        return out

    def just_compiled(self) -> bool:
        """True once, after the call that compiled (the trainer logs that update's time then)."""
        news = self.compiled_once and not self.told
        self.told = self.told or news
        return news

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
