"""Data-parallel training over processes started by `torchrun` (torch.distributed: gloo on CPU, NCCL on GPU).

    torchrun --nproc-per-node 2 -m tformer train --config multi30k_en_de --run-dir runs/m30k

Every process builds the same model from the same seed (rank 0's weights are broadcast anyway) and walks the
same deterministic batch order; an update takes `world x train.accum_steps` consecutive batches and process r
computes batches r, r + world, ... of them. Each process back-propagates its summed loss; one all_reduce
per update then sums the gradients, the token counts, the logged statistics and the stop flags (Ctrl-C in
one process stops all of them at the same update), and the gradients are divided by the update's target
tokens: exactly the gradient of one process with the whole update as its batch. A process with no batch
in the last update of an epoch still joins the all_reduce (with zeros), so nothing waits forever.
Only rank 0 reads the data first, trains tokenizers and writes the run folder, logs and checkpoints;
checkpoints hold every rank's random state, so `--resume` (with the same number of processes) continues
exactly.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tformer.errors import ConfigError


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    created: bool = False  # this process group was started here (and is destroyed here)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config key 'train.device' is cuda, but PyTorch sees no CUDA device here; use "
                          "train.device=cpu (or auto)")
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def setup(device_name: str, timeout_minutes: float = 60.0) -> Context:
    """The process group torchrun asks for (WORLD_SIZE > 1), or a single-process context."""
    device = resolve_device(device_name)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Context(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    created = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
        created = True
    return Context(dist.get_rank(), dist.get_world_size(), device, created)


def teardown(ctx: Context) -> None:
    if ctx.created and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(ctx: Context, obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_parameters(ctx: Context, model: nn.Module) -> None:
    if ctx.enabled:
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def all_reduce_update(ctx: Context, params: list[nn.Parameter], stats: list[float]) -> list[float]:
    """Sum every parameter's gradient and `stats` over the ranks with ONE all_reduce; returns the summed
    stats. Parameters without a gradient take part as zeros (and get one). One process: nothing to do."""
    if not ctx.enabled:
        return stats
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params]
                     + [torch.tensor(stats, dtype=params[0].grad.dtype, device=params[0].grad.device)])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n
    return flat[offset:].tolist()


def sum_ranks(ctx: Context, value: float) -> float:
    """`value` summed over the processes (one small all_reduce); itself in one process."""
    if not ctx.enabled:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64 if ctx.device.type == "cpu" else torch.float32,
                     device=ctx.device)
    dist.all_reduce(t)
    return float(t.item())


def any_rank(ctx: Context, *flags: bool) -> list[bool]:
    """Each flag, true if it is true in any process (one small all_reduce)."""
    if not ctx.enabled:
        return list(flags)
    t = torch.tensor([float(f) for f in flags], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


def gather_rng(ctx: Context) -> list[Tensor]:
    """Every rank's CPU random state (rank order), on every rank."""
    state = torch.get_rng_state()
    if not ctx.enabled:
        return [state]
    out = [torch.empty_like(state) for _ in range(ctx.world)]
    if ctx.device.type == "cuda":  # NCCL moves CUDA tensors only
        moved = [o.to(ctx.device) for o in out]
        dist.all_gather(moved, state.to(ctx.device))
        return [m.cpu() for m in moved]
    dist.all_gather(out, state)
    return out


def barrier(ctx: Context) -> None:
    if ctx.enabled:
        dist.barrier()
