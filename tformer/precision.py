"""Number formats, one policy for training, inference and serving.

    train.precision    fp32 | bf16 | fp16   the forward pass under autocast; weights and optimizer in fp32
    decode.precision   fp32 | bf16 | fp16   the weights held in that format (chosen when loading); logits go
                                            to fp32 before the log-softmax, so log-probabilities and scores
                                            are computed and summed in fp32
    decode.quantize    none | int8          int8 linear layers on a CPU (tformer.model.quantize), fp32
                                            activations: with decode.precision=fp32 only

Reduced precision needs units that compute in it: on a GPU, bf16 needs compute capability 8.0 (Ampere) or
later; on a CPU, the flags in `CPU_UNITS`, and kernels that use them: PyTorch's dispatch capped below AVX-512
(ATEN_CPU_CAPABILITY=avx2) or oneDNN's (ONEDNN_MAX_CPU_ISA=AVX2) runs the AVX2 kernels whatever the CPU has
(`dispatch_cap`). Without them PyTorch still runs, emulating the format far slower than fp32 (`EMULATED`), so
decoding refuses (a ConfigError naming the key and the missing flag) and training warns. Emulation computes the
same numbers: tests, not users, set TFORMER_EMULATED_PRECISION=1 to decode in bf16 on any CPU (`EMULATION_SWITCH`).
"""

from __future__ import annotations

import functools
import os

import torch

from tformer.errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# CPU instruction sets with native matrix products in each reduced precision (any one suffices), as
# /proc/cpuinfo names them: AVX-512 BF16 (Intel Cooper Lake and later, AMD Zen 4 and later) or AMX;
# AVX-512 FP16 or AMX-FP16 (Intel Sapphire Rapids and later, Granite Rapids)
CPU_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}

# what emulation costs, measured on an AMD EPYC Zen 3 (AVX2, 2 threads, torch 2.13; benchmarks/RESULTS.md)
EMULATED = ("measured on an AVX2 CPU: a 1024x1024 bf16 matrix product about 150x slower, a bf16-autocast training "
            "step about 20x slower")


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags from /proc/cpuinfo (Linux); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_cpu_units(precision: str, flags: set[str] | None = None) -> tuple[str, ...] | None:
    """The CPU flags `precision` ("bf16"/"fp16") would need, when this CPU has none of them; None when it has
    one, when the precision needs none, or when the flags cannot be read (then nothing is claimed)."""
    flags = cpu_flags() if flags is None else flags
    units = CPU_UNITS.get(precision)
    if units is None or flags is None or any(u in flags for u in units):
        return None
    return units


# Tests set this to 1 so that decode.precision=bf16/fp16 runs where users are refused: the CPU's kernels then
# emulate the format (slow, the same numbers), and every bf16 promise is checked on every machine.
EMULATION_SWITCH = "TFORMER_EMULATED_PRECISION"


@functools.lru_cache(maxsize=None)
def dispatch_cap(precision: str) -> str | None:
    """Why the kernels PyTorch and oneDNN dispatch to in this process cannot use a CPU's `precision` units
    though /proc/cpuinfo has them (their own switches cap them); None when nothing caps them."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return f"PyTorch runs its {capability} kernels here (ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')})"
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=DTYPES[precision]), None)
        except RuntimeError:
            return f"oneDNN has no {precision} kernels here (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')})"
    return None


def unsupported(precision: str, device: torch.device, flags: set[str] | None = None) -> str | None:
    """Why `device` has no native units for `precision` (a sentence naming what is missing); None when it has
    them, or for fp32."""
    if precision == "fp32":
        return None
    if device.type == "cpu":
        flags = cpu_flags() if flags is None else flags
        missing = missing_cpu_units(precision, flags)
        if missing is not None:
            return f"this CPU has no {' or '.join(missing)} (/proc/cpuinfo flags)"
        return None if flags is None else dispatch_cap(precision)  # flags unreadable: nothing is claimed
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        major, minor = torch.cuda.get_device_capability(device)
        return f"this GPU (compute capability {major}.{minor}) has no bf16 units; they start with 8.0 (Ampere)"
    return None


def check_decode(precision: str, quantize: str, device: torch.device, flags: set[str] | None = None) -> None:
    """ConfigError, naming the key, for a decoding precision this device cannot run natively, or for one
    combined with int8 weights."""
    from tformer.config import DecodeConfig

    DecodeConfig(precision=precision, quantize=quantize)  # its own check refuses bf16 with int8, by key
    why = unsupported(precision, device, flags)
    if why and os.environ.get(EMULATION_SWITCH) != "1":
        raise ConfigError(f"config key 'decode.precision': {precision} on {device.type}: {why}; PyTorch would emulate "
                          f"{precision} far slower than fp32 ({EMULATED}). Use decode.precision=fp32"
                          + (" (or decode.quantize=int8 for speed)" if device.type == "cpu" else ""))


def for_inference(model: torch.nn.Module, precision: str, quantize: str) -> torch.nn.Module:
    """`model` (in eval mode) as the decoding policy asks, in place: its weights in `precision`, or its linear
    layers int8 (`quantize`); checked first (`check_decode`). Float linear layers on a CPU then run on the matrix
    library measured fastest for their shapes (tformer.model.matmul). Returns it."""
    device = next(model.parameters()).device
    check_decode(precision, quantize, device)
    if quantize == "int8":
        from tformer.model.quantize import quantize_int8

        return quantize_int8(model)
    if precision != "fp32":
        model.to(DTYPES[precision])
    from tformer.model.matmul import prepack

    return prepack(model)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating-point format a model's weights are held in (int8 models: fp32, their activations')."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
