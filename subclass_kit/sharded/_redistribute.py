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

from .mesh import MeshRef
from .placements import Replicate

_REPLICATE = Replicate()

__all__ = ["redistribute_local", "cost"]


def redistribute_local(
    local: torch.Tensor, mesh: MeshRef, coord: tuple, src: tuple, dst: tuple, global_shape
) -> torch.Tensor:
    """This rank's shard under ``dst``, from its shard under ``src`` (placements normalized).

    Each placement does its own part (``to_replicate``, ``from_replicate``, a Partial's
    ``reduce_scatter``); this only orders the steps.

    Example (a one-rank mesh needs no communication):
        >>> import torch
        >>> from subclass_kit.sharded import Shard, Replicate
        >>> redistribute_local(torch.ones(2, 2), MeshRef.local(), (0,), (Shard(0),), (Replicate(),), (2, 2)).shape
        torch.Size([2, 2])
    """
    if src == dst:
        return local
    # A rule that chose one tensor dim on two mesh dims would get a wrong value from the
    # steps below, not an error: refuse it here, where every move passes.
    sharded = [p.shard_dim() for p in dst if p.is_shard()]
    assert len(sharded) == len(set(sharded)), f"redistribute to nested placements {dst}"
    cur = list(src)
    for i in reversed(range(len(src))):
        s, d = cur[i], dst[i]
        if s == d or s.is_replicate():
            continue
        if s.is_partial() and d.is_shard() and not any(p.is_shard(d.dim) for j, p in enumerate(cur) if j != i):
            local = s.reduce_scatter(local, mesh, i, d.dim, coord[i])
            cur[i] = d
            continue
        local = s.to_replicate(local, mesh, i, global_shape)
        cur[i] = _REPLICATE
    for i, (s, d) in enumerate(zip(cur, dst)):
        if s != d:
            local = d.from_replicate(local, mesh, i, coord[i])
    return local


def cost(src, dst) -> float:
    """Cost of ``src -> dst`` on one mesh dim, in units of the global tensor's size (0 =
    free; used to pick op strategies): a gather moves it once, an all-reduce twice.

    Example:
        >>> from subclass_kit.sharded import Shard, Replicate, Partial
        >>> cost(Replicate(), Shard(0)) < cost(Shard(0), Replicate()) < cost(Partial(), Replicate())
        True
    """
    return src.cost_to(dst)
