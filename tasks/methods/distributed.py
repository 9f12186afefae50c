"""Several processes, one global batch: what the losses and the training loop need from
torch.distributed (launched by torchrun; tasks/distributed_train.py).

Every process holds a contiguous shard of the global batch (`shard`). A loss that compares rows of
the batch gathers its sentence vectors from all processes (`gather_rows`), so each row's negatives
are the whole global batch, in the order one device would see it, and every process computes the
same global loss. Only the local shard keeps its gradient; it is scaled by the number of processes
so that DDP's gradient average comes out as the global loss's gradient, exactly as on one device.
Outside torchrun (one process) both are the identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, number of processes); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
