"""``view``/``_unsafe_view`` (what ``reshape``/``flatten`` end in): where each shard lands
(``view_targets`` holds the arithmetic), then the local viewed, or the lost shards gathered
first.

- A sharded dim survives when the output has a dim of the same size at the same element
  offset (the product of the sizes before it), e.g. ``(B, S, H)`` sharded on ``H`` viewed as
  ``(B*S, H)``.
- It also survives, evenly chunked, when it leads a merge (``(B, S, H)`` sharded on ``B``
  viewed as ``(B*S, H)``, ``B`` divisible by the mesh dim), is split with the shard on the
  first part (divisible), or is regrouped with the dims after it.
- Merged after other dims it becomes a ``_StridedShard`` (evenly chunked); a strided or
  nested layout whose chunks are, mesh dim by mesh dim, whole rows of (strided) output dims
  is a view of the local (``split_view``, also the layouts dispatch's entry).
- Otherwise a merged or split sharded dim is gathered first (its chunks would not be whole
  rows of an output dim).

Partial placements pass through unchanged (views are linear).
"""

from __future__ import annotations

import math

from .._layout import chunk_size
from ..mesh import LAYOUTS_SEEN
from ..placements import Replicate, Shard, _StridedShard
from ..tensor import ShardedTensor, spec
from ._common import aten, global_meta, move, planned
from .view import _fast_of, _fast_view, _finish, _shift
from .view_targets import (regroup_target as _regroup_target, split_layout as _split_layout, strided_target as _strided_target,
                           view_target as _view_target)

__all__ = ["reshape_like", "split_view"]


@ShardedTensor.implements(aten.view.default, aten._unsafe_view.default)
def reshape_like(func, types, args, kwargs):
    """A shard survives a view when its dim keeps its size and element offset."""
    meta, target, size, pl, fast = _reshape_plan(func, args, kwargs)
    x = args[0]
    if fast is not None and x._gathered_view is None:
        try:
            return _fast_view(fast, (x, size))
        except RuntimeError:
            pass  # the shard's strides do not allow the view: the general path copies
    local = move(x, target)
    copied = local is not args[0].local
    try:
        res = func(local, size)
    except RuntimeError:
        # The global view is valid but this shard's strides do not allow it (a chunk cut
        # out of a wider tensor): view a compact copy, as reshape would.
        res = func(local.contiguous(), size)
        copied = True
    return _finish(func, args, kwargs, res, meta, pl, copied)


def split_view(func, args, kwargs):
    """``view``/``_unsafe_view`` of a strided or nested layout that splits or keeps each of its
    sharded dims (``split_layout``): the local viewed, nothing moved (as DTensor's
    ``_StridedShard(0, sf)`` of ``(B*S, H)`` viewed as ``(B, S, H)`` is ``Shard(1)``); None
    when the view needs another layout first (the layouts dispatch then simplifies it)."""
    x = args[0]
    if kwargs or x._gathered_view is not None:
        return None
    mesh, cur, coord = spec(x)
    meta = global_meta(func, args, kwargs)
    hit = _split_layout(tuple(x.shape), tuple(meta.shape), cur, mesh.shape, coord)
    if hit is None:
        return None
    pl, size = hit
    try:
        res, copied = func(x.local, size), False
    except RuntimeError:
        res, copied = func(x.local.contiguous(), size), True  # (see reshape_like)
    return _finish(func, args, kwargs, res, meta, pl, copied)


def _strided_factor(cur, i, shape, out_shape, hit, moves, mesh_shape):
    """The split factor of mesh dim ``i``'s strided shard of the merged output dim ``e``
    (``hit``: ``(e, the global factor)``), or None when another shard makes the pieces
    interleave. A shard of a dim outside the merge does not matter; an earlier mesh dim's
    shard of a leading dim of it, already regrouped onto ``e``, makes the pieces that many
    times fewer (torch's ``[Shard(0), _StridedShard(0, sf)]``); any later one interleaves."""
    e, sf = hit
    lo = math.prod(out_shape[:e])
    hi = lo * out_shape[e]
    for j, q in enumerate(cur):
        if j == i or not q.is_shard():
            continue
        g = q.dim
        if math.prod(shape[:g + 1]) <= lo or math.prod(shape[:g]) >= hi:
            continue  # (outside the merged dims)
        if j > i or type(q) is not Shard or moves.get(g) != e or sf % mesh_shape[j]:
            return None
        sf //= mesh_shape[j]
    return sf


def _reshape_decide(func, args, kwargs):
    x = args[0]
    mesh, cur, coord = spec(x)
    meta = global_meta(func, args, kwargs)
    moves = {}
    lost = set()
    strided = {}
    shape, size = tuple(x.shape), list(meta.shape)
    for i, p in enumerate(cur):
        if p.is_shard():
            e = _view_target(shape, meta.shape, p.dim)
            n = shape[p.dim]  # the chunked size: the input's when the dim is kept
            if e is None:
                e = _regroup_target(shape, tuple(meta.shape), p.dim, mesh.shape[i])
                if e is None:
                    # a shard merged after other dims: a strided shard
                    hit = _strided_target(shape, tuple(meta.shape), p.dim, mesh.shape[i])
                    sf = None if hit is None else _strided_factor(cur, i, shape, tuple(meta.shape), hit, moves, mesh.shape)
                    if sf is None:
                        lost.add(p.dim)
                        continue
                    e, strided[i] = hit[0], sf
                n = size[e] if i in strided and e in moves.values() else meta.shape[e]
            if e in moves.values() and i not in strided:
                lost.add(p.dim)  # (two shards cannot land on one dim)
                continue
            moves[p.dim] = e
            size[e] = chunk_size(n, mesh.shape[i], coord[i])
    if lost:
        # Mesh dim by mesh dim, the chunks may still be whole rows of (strided) output dims
        # (a later mesh dim's shard of a merge's leading dim): a view of the local
        hit = _split_layout(shape, tuple(meta.shape), cur, mesh.shape, coord)
        if hit is not None:
            LAYOUTS_SEEN[0] = True
            return meta, cur, list(hit[1]), hit[0], _fast_of(func, args, kwargs, meta, hit[0])
    target = tuple(Replicate() if p.is_shard() and p.dim in lost else p for p in cur)
    pl = _shift(target, moves.__getitem__)
    if strided:
        pl = tuple(_StridedShard(p.dim, split_factor=strided[i]) if i in strided else p for i, p in enumerate(pl))
        LAYOUTS_SEEN[0] = True  # (the ops' layout hook then sees it: see placements.normalize_placements)
    # Fast only when nothing is gathered (the local is viewed as it is).
    fast = _fast_of(func, args, kwargs, meta, pl) if target == cur else None
    return meta, target, size, pl, fast


_reshape_plan = planned(_reshape_decide)
