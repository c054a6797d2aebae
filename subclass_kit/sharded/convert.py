"""``distribute``: lay a whole tensor out over a mesh (the other conversions, ``from_local``,
``to_local`` and ``redistribute``, live beside ShardedTensor in ``tensor.py``, whose methods
they are; they are re-exported here).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _compat
from .. import collectives as _coll
from ._comm import waited
from ._layout import contiguous_strides
from .mesh import MeshLike
from .placements import Partial, Placement, Replicate, normalize_placements
from ._redistribute import redistribute_local
from .tensor import ShardedTensor, ambient_mesh, from_local, redistribute, to_local, wrap

__all__ = ["from_local", "to_local", "redistribute", "distribute"]


@_compat.allow_in_graph
def _distribute(t, ref, placements, src_data_rank):
    if not isinstance(t, torch.Tensor) or isinstance(t, ShardedTensor):
        raise TypeError(f"distribute takes a plain torch.Tensor, got {type(t).__name__}.")
    pl = normalize_placements(placements, ref.ndim, t.dim(), what="distribute")
    coord = ref.coordinate()
    local = t.detach()
    if not coord:  # outside the mesh: an empty local, as torch's
        out = wrap(local.new_empty(0), ref, pl, coord, t.shape, contiguous_strides(t.shape), t.dtype)
        return out.requires_grad_(True) if t.requires_grad else out
    if src_data_rank is not None:
        for i, name in enumerate(ref.group_names):
            if ref.shape[i] > 1:
                local = waited(_coll.broadcast(local.contiguous(), src_data_rank, name))
    full = (Replicate(),) * ref.ndim
    local = redistribute_local(local, ref, coord, full, tuple(Replicate() if type(p) is Partial else p for p in pl), t.shape)
    for i, p in enumerate(pl):
        # torch's Partial._partition_value: a sum's operands are the value over the ranks
        # on every rank; an average's, a max's and a min's the value itself. A product's
        # (torch refuses it: an n-th root is not exact) the value on the first rank, ones
        # elsewhere, as redistribute makes them.
        if type(p) is Partial and p.op == "sum" and ref.shape[i] > 1:
            local = local / ref.shape[i]
        elif type(p) is Partial and p.op == "product":
            local = p.from_replicate(local, ref, i, coord[i])
    # A fresh, compact copy: a parameter's shard must not alias the dense tensor it came from.
    local = local.clone(memory_format=torch.contiguous_format)
    out = wrap(local, ref, pl, coord, t.shape, contiguous_strides(t.shape), t.dtype)
    if t.requires_grad:
        out.requires_grad_(True)
    return out



def distribute(t: torch.Tensor, mesh: MeshLike | None, placements: Sequence[Placement], *, src_data_rank: int | None = 0) -> ShardedTensor:
    """Lay a whole tensor out over ``mesh``: each rank keeps its part (a new leaf tensor).

    Like torch's ``distribute_tensor``: the values of the rank at coordinate
    ``src_data_rank`` of each mesh dimension are used (one broadcast per mesh dim of more
    than one rank); ``src_data_rank=None`` uses each rank's own ``t`` without communication.

    Args:
        t: the whole tensor (same shape on every rank).
        mesh: a torch ``DeviceMesh`` (or a ``MeshRef``); None: the mesh of the innermost
            ``with mesh:`` block, as torch's.
        placements: ``Shard(d)``, ``_StridedShard(d, split_factor=)``, ``Replicate()`` or
            ``Partial(op)`` per mesh dim. As torch's: a ``Partial('sum')`` mesh dim of ``k``
            ranks holds ``t / k`` on each (their sum is ``t``); ``avg``/``max``/``min`` hold
            ``t``; ``product`` holds ``t`` on the first rank, ones on the others.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, Shard, MeshRef
        >>> x = distribute(torch.arange(6.).reshape(3, 2), MeshRef.local(), [Shard(0)])
        >>> x.placements, x.to_local().shape
        ((Shard(0),), torch.Size([3, 2]))
    """
    return _distribute(t, ambient_mesh(mesh, "subclass_kit.sharded.distribute"), list(placements) if isinstance(placements, (list, tuple)) else placements, src_data_rank)
