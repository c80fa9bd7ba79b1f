"""Dynamic int8 inference on a CPU (`decode.quantize: int8`), with PyTorch's own quantization.

Every linear layer (attention projections, FFN, generator) gets int8 weights, one scale per tensor, and
quantizes its input on the fly, one scale per call, and fbgemm multiplies in int8 (what that gains over fp32
depends on the model and the CPU: benchmarks/RESULTS.md measures whole decodings). Embeddings, LayerNorm and attention itself stay fp32. The activation scale is taken
over the whole batch, so unlike fp32 decoding an int8 output can change (slightly) with the sentences it is
batched with; the BLEU change is reported in benchmarks/RESULTS.md. Loading reaches it through the shared
precision policy (tformer.precision.for_inference), which refuses it together with bf16/fp16 weights.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tformer.attention import MultiHeadAttention
from tformer.errors import ConfigError


def quantize_int8(model: nn.Module) -> nn.Module:
    """Make `model` (in eval mode, on the CPU) an int8 inference model, in place; returns it."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"decode.quantize=int8 runs on a CPU (PyTorch's dynamic int8 layers); the model is on "
                          f"{device}: load it with device='cpu', or use decode.quantize=none")
    with warnings.catch_warnings():  # torch.ao warns that its quantized tensors move to torchao one day
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.quantize_int8()
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model.eval()
