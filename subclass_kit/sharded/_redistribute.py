"""Redistribution of a local shard from one list of placements to another.

Placements apply left to right (see ``placements``), so a mesh dim's shard is a piece of
what the mesh dims before it left. Redistribution first takes every mesh dim that must
change back to Replicate, last mesh dim first (gather / reduce, each on the shape its mesh
dim splits; a Partial bound for a Shard takes the one-collective reduce-scatter), then gives
each its new placement left to right from the replicated value (a local chunk, or a
zero-masked operand) with no communication. A mesh dim that keeps its placement must change
all the same when an earlier mesh dim that splits the same tensor dim changes (its piece is
a piece of that one's). The one exception is FSDP over TP's swap (``_swap``).
"""

from __future__ import annotations

import torch

from ._comm import gather_shards, reduce_scatter_partial, take_chunk
from ._layout import chunk_size, level_shape, strided_pieces
from .mesh import MeshRef
from .placements import Partial, Replicate, Shard, _StridedShard

_REPLICATE = Replicate()

__all__ = ["redistribute_local", "cost"]


def _swap(src: tuple, dst: tuple, mesh_shape: tuple, coord: tuple, global_shape, i: int) -> int | None:
    """The mesh dim ``j`` when mesh dim ``i`` can change between ``_StridedShard(e, sf)`` and
    Replicate/Partial while ``j`` keeps ``Shard(e)``: FSDP's all-gather (and reduce-scatter)
    of a TP shard, one collective over ``i`` as DTensor does. That holds when ``j`` is the
    only other mesh dim on ``e``, has ``sf`` ranks, and every coordinate's pieces line up
    with ``j``'s chunks (always for even sizes; checked on the sizes)."""
    s, d = src[i], dst[i]
    strided, other = (s, d) if type(s) is _StridedShard else (d, s)
    if type(strided) is not _StridedShard or other.is_shard():
        return None
    e, sf = strided.dim, strided.split_factor
    others = [j for j in range(len(src)) if j != i and (src[j].shard_dim() == e or dst[j].shard_dim() == e)]
    if len(others) != 1:
        return None
    j = others[0]
    if j < i or src[j] != Shard(e) or dst[j] != src[j] or mesh_shape[j] != sf:
        return None
    n = level_shape(global_shape, src if type(s) is _StridedShard else dst, mesh_shape, coord, i)[e]
    if type(n) is not int:
        return None
    k = mesh_shape[i]
    for c in range(k):
        sizes = [m for _, m in strided_pieces(n, k, c, sf)]
        if [chunk_size(sum(sizes), sf, t) for t in range(sf)] != sizes:
            return None
    return j


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
    n = len(src)
    shape = mesh.shape
    swaps = {i: j for i in range(n) for j in [_swap(src, dst, shape, coord, global_shape, i)] if j is not None}
    change = [src[i] != dst[i] for i in range(n)]
    for j in range(n):
        e = src[j].shard_dim()
        if change[j] or e is None:
            continue
        for i in range(j):
            if change[i] and swaps.get(i) != j and e in (src[i].shard_dim(), dst[i].shard_dim()):
                change[j] = True
                break
    cur = list(src)
    for i in reversed(range(n)):
        s, d = cur[i], dst[i]
        if not change[i] or s.is_replicate():
            continue
        if i in swaps:
            j = swaps[i]
            e = cur[j].shard_dim()
            if type(s) is _StridedShard:  # the TP shard back: a plain gather of its pieces
                piece = chunk_size(level_shape(global_shape, cur, shape, coord, i)[e], s.split_factor, coord[j])
                local = gather_shards(local, mesh, i, e, piece)
            elif type(d) is _StridedShard:  # Partial -> the strided shard of the TP shard
                local = reduce_scatter_partial(local, mesh, i, s.op, e, coord[i])  # type: ignore[attr-defined]
                cur[i] = d
                continue
            else:
                local = s.to_replicate(local, mesh, i, ())
            cur[i] = _REPLICATE
            continue
        if (type(s) is Partial and type(d) is Shard
                and not any(cur[j].shard_dim() == d.dim for j in range(i + 1, n))
                and not any(change[j] and d.dim in (src[j].shard_dim(), dst[j].shard_dim()) for j in range(i))):
            local = s.reduce_scatter(local, mesh, i, d.dim, coord[i])
            cur[i] = d
            continue
        local = s.to_replicate(local, mesh, i, level_shape(global_shape, cur, shape, coord, i))
        cur[i] = _REPLICATE
    for i in range(n):
        d = dst[i]
        if cur[i] != d:
            if i in swaps and type(d) is _StridedShard:  # this rank's chunk of its TP shard
                local = take_chunk(local, shape[i], coord[i], d.dim)
            else:
                local = d.from_replicate(local, mesh, i, coord[i])
            cur[i] = d
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
