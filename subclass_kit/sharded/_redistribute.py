"""Redistribution of a local shard from one list of placements to another.

Mesh dimensions are independent because no tensor dimension is sharded by two of them
(``normalize_placements`` refuses that), so the steps commute: first every mesh dim that
must change gives up its Shard or Partial (gather / reduce, last mesh dim first; a Partial
bound for a Shard takes the one-collective reduce-scatter), then each takes its new
placement from the replicated value (a local chunk, or a zero-masked operand) with no
communication.
"""

from __future__ import annotations

import torch

from . import _comm as comm
from .mesh import MeshRef
from .placements import Partial, Replicate, Shard

__all__ = ["redistribute_local", "cost"]


def redistribute_local(
    local: torch.Tensor, mesh: MeshRef, coord: tuple, src: tuple, dst: tuple, global_shape
) -> torch.Tensor:
    """This rank's shard under ``dst``, from its shard under ``src`` (placements normalized).

    Example (a one-rank mesh needs no communication):
        >>> import torch
        >>> redistribute_local(torch.ones(2, 2), MeshRef.local(), (0,), (Shard(0),), (Replicate(),), (2, 2)).shape
        torch.Size([2, 2])
    """
    if src == dst:
        return local
    cur = list(src)
    for i in reversed(range(len(src))):
        s, d = cur[i], dst[i]
        if s == d or type(s) is Replicate:
            continue
        if type(s) is Shard:
            local = comm.gather_shards(local, mesh, i, s.dim, global_shape[s.dim])
        elif type(d) is Shard and s.op in ("sum", "avg", "max", "min") and not any(
            type(p) is Shard and p.dim == d.dim for j, p in enumerate(cur) if j != i
        ):
            local = comm.reduce_scatter_partial(local, mesh, i, s.op, d.dim, coord[i])
            cur[i] = d
            continue
        else:
            local = comm.reduce_partial(local, mesh, i, s.op)
        cur[i] = Replicate()
    for i, (s, d) in enumerate(zip(cur, dst)):
        if s == d:
            continue
        if type(d) is Shard:
            local = comm.take_chunk(local, mesh.shape[i], coord[i], d.dim)
        elif type(d) is Partial and d.op == "sum":
            local = comm.zero_unless_first(local, coord[i])
        # Replicate -> Partial(avg/max/min) keeps the value: every operand is the result.
    return local


# Relative cost of turning one placement into another on one mesh dim, in units of the
# global tensor's size: a gather moves it once, an all-reduce twice, local chunking nothing.
def cost(src, dst) -> float:
    """Cost of ``src -> dst`` on one mesh dim (0 = free; used to pick op strategies).

    Example:
        >>> cost(Replicate(), Shard(0)) < cost(Shard(0), Replicate()) < cost(Partial(), Replicate())
        True
    """
    if src == dst:
        return 0.0
    if type(src) is Replicate:
        return 0.01 if type(dst) is Shard else 0.02
    if type(src) is Shard:
        return 1.0 if type(dst) is not Partial else 1.02
    # Partial -> Shard is one reduce-scatter; -> Replicate an all-reduce.
    return 1.0 if type(dst) is Shard else 2.0
