"""Several processes, one global batch: what the losses and the training loop need from
torch.distributed (launched by torchrun: tasks/train.py's `launch`).

Every process holds a contiguous shard of the global batch (`shard`). A loss that compares rows of
the batch gathers its sentence vectors from all processes (`gather_rows`), so each row's negatives
are the whole global batch, in the order one device would see it, and every process computes the
same global loss. Only the local shard keeps its gradient; it is scaled by the number of processes
so that DDP's gradient average comes out as the global loss's gradient, exactly as on one device.
Outside torchrun (one process) both are the identity.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from tasks.config.base import InputError

PR_SET_PDEATHSIG = 1  # prctl(2)

Gather = Callable[[torch.Tensor], torch.Tensor]  # a loss's rows -> the rows it compares


def no_gather(rows: torch.Tensor) -> torch.Tensor:
    """This process's rows only: the losses' default, and what recipes without in-batch negatives get."""
    return rows


def world() -> tuple[int, int]:
    """(rank, number of processes); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def processes(devices: int | str, device: str) -> int:
    """How many training processes `train.devices` asks for on `device`: `auto` is one per visible GPU."""
    if devices == "auto":
        return torch.cuda.device_count() if device.startswith("cuda") else 1
    if device.startswith("cuda") and devices > torch.cuda.device_count():
        raise InputError(f"train.devices: {devices}, but {torch.cuda.device_count()} GPU(s) are visible")
    return devices


def process_device(device: str) -> str:
    """This process's device: under torchrun each process has its own GPU (LOCAL_RANK)."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{os.environ['LOCAL_RANK']}"
    return device


def die_with_parent() -> None:
    """Be killed when the process that started this one dies (Linux): torchrun starts its processes
    in sessions of their own, so a `kill -9` of the launcher's process group would leave them training."""
    parent = os.getppid()
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def shard(rows: Sequence, rank: int, size: int) -> Sequence:
    """This process's contiguous part of a global batch: sizes differ by one at most, none repeated."""
    cut = [len(rows) * r // size for r in range(size + 1)]
    return rows[cut[rank]:cut[rank + 1]]


class _ScaledGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """(rows_here, ...) -> (global rows, ...): every process's rows in rank order; the local shard keeps
    its gradient (scaled by the number of processes, see the module's docstring), the others none."""
    rank, size = world()
    if size == 1:
        return local
    counts = [torch.zeros(1, dtype=torch.long, device=local.device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([len(local)], device=local.device))
    counts = [int(c) for c in counts]
    padded = torch.zeros((max(counts), *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[:len(local)] = local.detach()
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded)  # all_gather needs one shape: shards differ by a row at most
    parts = [p[:n] for p, n in zip(parts, counts)]
    parts[rank] = _ScaledGradient.apply(local, float(size))
    return torch.cat(parts)


def gather_tokens(local: torch.Tensor, gather: Gather = gather_rows) -> torch.Tensor:
    """(rows_here, tokens_here, ...) -> (global rows, the longest tokens of any process, ...): `gather` after each
    process fills its token axis with zeros to the longest of all (a padded token's vector and mask are 0)."""
    if world()[1] == 1:
        return gather(local)
    if local.dtype == torch.bool:  # gloo gathers no bool tensor
        return gather_tokens(local.to(torch.uint8), gather).bool()
    longest = torch.tensor([local.shape[1]], device=local.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    filled = torch.nn.functional.pad(local, (0, 0) * (local.dim() - 2) + (0, int(longest) - local.shape[1]))
    return gather(filled)


def data_parallel(module: torch.nn.Module) -> torch.nn.Module:
    """`module` under DistributedDataParallel when there are several processes (gradients averaged
    across them in the backward pass), else itself. Some parameters take no part in a recipe's loss
    (BERT's pooler under mean pooling): DDP is told to look for them."""
    if world()[1] == 1:
        return module
    device = next(module.parameters()).device
    return torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device] if device.type == "cuda" else None, find_unused_parameters=True)


def mean_over_processes(value: torch.Tensor) -> float:
    """The mean of a scalar over the processes: the global batch's loss for the log."""
    if world()[1] == 1:
        return value.item()
    total = value.detach().clone()
    dist.all_reduce(total)
    return total.item() / world()[1]


def from_process_0(flag: bool) -> bool:
    """Process 0's `flag`, in every process (a decision only process 0 can take, such as a health stop)."""
    if world()[1] == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def from_every_process(state: torch.Tensor) -> list[torch.Tensor]:
    """One tensor per process, in rank order (each process's RNG state, for the checkpoint)."""
    if world()[1] == 1:
        return [state]
    states: list = [None] * world()[1]
    dist.all_gather_object(states, state)
    return states
