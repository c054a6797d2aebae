"""View ops: the shard moves with the dim it is on, or the view replicates that mesh dim.

- ``t``/``transpose``/``permute``: the shard follows its dim.
- ``unsqueeze``/``squeeze``: the shard shifts past the inserted/removed dims.
- ``view``/``_unsafe_view`` (what ``reshape``/``flatten`` end in): a sharded dim survives
  when the output has a dim of the same size at the same element offset (the product of the
  sizes before it), e.g. ``(B, S, H)`` sharded on ``H`` viewed as ``(B*S, H)``. It also
  survives, evenly chunked, when it leads a merge (``(B, S, H)`` sharded on ``B`` viewed as
  ``(B*S, H)``, ``B`` divisible by the mesh dim) or is split with the shard on the first part
  (divisible); otherwise a merged or split sharded dim is gathered first (its chunks would
  not be contiguous).
- ``expand``: the shard follows its dim; a sharded size-1 dim being broadcast is gathered.
- ``slice``/``select``/``split``/``split_with_sizes``/``unbind`` along an unsharded dim act
  locally; along a sharded dim they gather it first. ``diagonal`` gathers its two dims.
- ``cat``/``stack``: in the first operand's layout; a shard on the concatenated dim is
  gathered first.

(``as_strided`` is replayed as these views: see ``as_strided``.)

Partial placements pass through every view unchanged (views are linear).
"""

from __future__ import annotations

import math

from ... import _compat
from ...ctx import ctx_of
from .._layout import chunk_size
from ..mesh import LAYOUTS_SEEN
from ..placements import Replicate, Shard, _StridedShard
from ..tensor import ShardedTensor, placements_of, sig_of, spec
from ._common import TensorMeta, aten, global_meta, move, fast_plan, planned, spec_of, wrap_out
from .view_targets import (regroup_target as _regroup_target, split_layout as _split_layout, strided_target as _strided_target,
                           view_target as _view_target)

__all__ = ["detach", "permute_like", "reshape_like", "split_view", "expand", "along_dim", "diagonal", "complex_view"]


def _release(x, dims) -> tuple:
    """``x``'s local with mesh dims sharding any of ``dims`` gathered; and its placements."""
    pl = placements_of(x)
    target = tuple(Replicate() if p.is_shard() and p.dim in dims else p for p in pl)
    return move(x, target), target


def _finish(func, args, kwargs, local, meta, pl, gathered: bool = False):
    """Wrap the view's local result; ``gathered``: the input's shard was gathered first, so
    the result is a copy, not a view of the input's shard."""
    mesh, _, coord = spec(args[0])
    if type(meta) is not TensorMeta:
        out = type(local)(wrap_out(r, m, mesh, pl, coord) for r, m in zip(local, meta))
    else:
        out = wrap_out(local, meta, mesh, pl, coord)
    base = args[0]._gathered_view
    if gathered or base is not None:
        # A write into it would not reach the base (see check_writable).
        for o in (out if type(out) in (list, tuple) else (out,)):
            o._gathered_view = base or func
    return ShardedTensor.correct_aliasing(func, args, kwargs, out)


def _fast_view(fast, args):
    """The common view, planned: no gather, one result aliasing its input ``args[0]``."""
    op, make = fast
    x = args[0]
    n = len(args)
    out = make(op(x.local) if n == 1 else op(x.local, args[1]) if n == 2 else op(x.local, *args[1:]))
    _alias(out, x)
    return out


_alias = _compat.functionalize_unsafe_set


def _fast_of(func, args, kwargs, meta, pl):
    # Views only (not _unsafe_view, which returns a new tensor): the fast path aliases.
    if kwargs or not ShardedTensor.op_aliasing(func).simple_view:
        return None
    mesh, _, coord = spec(args[0])
    return fast_plan(func, meta, mesh, pl, coord, args)


@ShardedTensor.implements(aten.detach.default, aten.alias.default)
def detach(func, types, args, kwargs):
    """The same global tensor over an alias of the local (autograd detaches every saved
    tensor, so this is among the most frequent ops)."""
    x = args[0]
    # Planned per signature: the result's metadata is the input's. Outer offset 0 only (the
    # signature does not hold it) and no gathered view (whose marker the result shares).
    if not kwargs and x._gathered_view is None and x.storage_offset() == 0:
        run = _alias_plan(func, args, kwargs)
        if run is not None:
            return run(x)
    return _builtin_alias(func, types, args, kwargs)


def _alias_decide(func, args, kwargs):
    x = args[0]
    ctx, shape, stride = ctx_of(x), tuple(x.shape), x.stride()
    sig = sig_of(ctx, shape, stride)
    if sig is None:
        return None
    make = ShardedTensor.parts_builder(ctx, size=shape, stride=stride, _sig=sig)
    op = _compat.fast_op(func)

    def run(x):
        out = make(op(x.local))
        _alias(out, x)
        return out

    return run


_alias_plan = planned(_alias_decide)
_make = ShardedTensor.make


def _builtin_alias(func, types, args, kwargs):
    """detach/alias of any ShardedTensor: an alias of the local, the same metadata and state."""
    x = args[0]
    out = _make((_compat.fast_op(func)(x.local),), ctx_of(x), x.shape, x.stride(), x.storage_offset(),
                state={"_sig": x._sig, "_gathered_view": x._gathered_view})
    _alias(out, x)
    return out


def _shift(pl, fn) -> tuple:
    return tuple(Shard(fn(p.dim)) if p.is_shard() else p for p in pl)


@ShardedTensor.implements(aten.t.default, aten.transpose.int, aten.permute.default)
def permute_like(func, types, args, kwargs):
    """The shard follows its dim through a permutation."""
    meta, pl, fast = _permute_plan(func, args, kwargs)
    x = args[0]
    if fast is not None and x._gathered_view is None:
        return _fast_view(fast, args)
    return _finish(func, args, kwargs, func(x.local, *args[1:], **kwargs), meta, pl)


def _permute_decide(func, args, kwargs):
    x = args[0]
    nd = x.dim()
    if func is aten.permute.default:
        perm = [d % nd for d in (args[1] if len(args) > 1 else kwargs["dims"])]
    else:
        perm = list(range(nd))
        if nd == 2 or func is aten.transpose.int:
            d0, d1 = (0, 1) if func is aten.t.default else (args[1] % nd, args[2] % nd)
            perm[d0], perm[d1] = perm[d1], perm[d0]
    meta = global_meta(func, args, kwargs)
    pl = _shift(placements_of(x), perm.index)
    return meta, pl, _fast_of(func, args, kwargs, meta, pl)


_permute_plan = planned(_permute_decide)


@ShardedTensor.implements(aten.unsqueeze.default)
def unsqueeze(func, types, args, kwargs):
    meta, dim, pl = _unsqueeze_plan(func, args, kwargs)
    return _finish(func, args, kwargs, func(args[0].local, dim), meta, pl)


@ShardedTensor.implements(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(func, types, args, kwargs):
    x = args[0]
    nd = x.dim()
    if func is aten.squeeze.default:
        cand = range(nd)
    elif func is aten.squeeze.dim:
        cand = [args[1] % nd] if nd else []
    else:
        cand = [d % nd for d in args[1]] if nd else []
    gone = sorted(d for d in cand if x.shape[d] == 1)
    local, pl = _release(x, set(gone))
    meta = global_meta(func, args, kwargs)
    pl = _shift(pl, lambda d: d - sum(g < d for g in gone))
    return _finish(func, args, kwargs, aten.squeeze.dims(local, gone), meta, pl, local is not x.local)


@ShardedTensor.implements(aten.view_as_real.default, aten.view_as_complex.default)
def complex_view(func, types, args, kwargs):
    """``view_as_real`` (a new last dim of 2) keeps every shard and Partial;
    ``view_as_complex`` gathers a shard of the last dim (the pairs it merges), keeps the rest."""
    x = args[0]
    local, pl = _release(x, {x.dim() - 1} if func is aten.view_as_complex.default else set())
    meta = global_meta(func, args, kwargs)
    return _finish(func, args, kwargs, func(local), meta, pl, local is not x.local)


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


@ShardedTensor.implements(aten.expand.default)
def expand(func, types, args, kwargs):
    """The shard follows its dim; a broadcast sharded dim is gathered first."""
    x = args[0]
    meta = global_meta(func, args, kwargs)
    lead = len(meta.shape) - x.dim()
    bad = {p.dim for p in placements_of(x) if p.is_shard() and x.shape[p.dim] == 1 and meta.shape[p.dim + lead] != 1}
    local, pl = _release(x, bad)
    size = list(meta.shape)
    for p in pl:
        if p.is_shard():
            size[p.dim + lead] = local.size(p.dim)
    pl = _shift(pl, lambda d: d + lead)
    return _finish(func, args, kwargs, func(local, size, *args[2:], **kwargs), meta, pl, local is not x.local)


_DIM_ARG = {
    aten.slice.Tensor: 1,
    aten.select.int: 1,
    aten.split.Tensor: 2,
    aten.split_with_sizes.default: 2,
    aten.unbind.int: 1,
    aten.unfold.default: 1,  # windows along dim; the window becomes a new last dim
}
_DROPS_DIM = {aten.select.int, aten.unbind.int}


@ShardedTensor.implements(*_DIM_ARG)
def along_dim(func, types, args, kwargs):
    """Indexing along one dim: local when it is not sharded, else after gathering it."""
    meta, target, pl = _along_plan(func, args, kwargs)
    local = move(args[0], target)
    return _finish(func, args, kwargs, func(local, *args[1:], **kwargs), meta, pl, local is not args[0].local)


def _along_decide(func, args, kwargs):
    x = args[0]
    i = _DIM_ARG[func]
    dim = args[i] if len(args) > i else kwargs.get("dim", 0)
    dim = dim % x.dim() if x.dim() else 0  # a 0-d tensor has one (virtual) dim
    cur = placements_of(x)
    target = tuple(Replicate() if p.is_shard() and p.dim == dim else p for p in cur)
    pl = _shift(target, lambda d: d - (d > dim)) if func in _DROPS_DIM else target
    return global_meta(func, args, kwargs), target, pl


_along_plan = planned(_along_decide)


def _unsqueeze_decide(func, args, kwargs):
    x, dim = args[0], args[1] % (args[0].dim() + 1)
    return global_meta(func, args, kwargs), dim, _shift(placements_of(x), lambda d: d + (d >= dim))


_unsqueeze_plan = planned(_unsqueeze_decide)


@ShardedTensor.implements(aten.diagonal.default)
def diagonal(func, types, args, kwargs):
    """The two diagonal dims are gathered; the other shards move to their place among the
    kept dims (the diagonal becomes the last dim)."""
    x = args[0]
    nd = x.dim()
    d1 = (args[2] if len(args) > 2 else kwargs.get("dim1", 0)) % nd
    d2 = (args[3] if len(args) > 3 else kwargs.get("dim2", 1)) % nd
    local, pl = _release(x, {d1, d2})
    kept = [d for d in range(nd) if d not in (d1, d2)]
    meta = global_meta(func, args, kwargs)
    return _finish(func, args, kwargs, func(local, *args[1:], **kwargs), meta, _shift(pl, kept.index), local is not x.local)


def _cat_decide(func, args, kwargs):
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    first = next(t for t in tensors if type(t) is ShardedTensor)
    spec_of(func, args, kwargs)  # one mesh for every operand (MeshError otherwise)
    mesh, cur, coord = spec(first)
    nd = first.dim() + (func is aten.stack.default)
    dim = dim % nd
    def keep(i, p):
        # Concatenation is linear: a Partial kind shared by the operands that have one stays,
        # the replicated ones joining as its operands (zero-masked under 'sum'; no
        # communication), as DTensor's.
        ps = [placements_of(t)[i] if type(t) is ShardedTensor else Replicate() for t in tensors]
        kinds = {q for q in ps if q.is_partial()}
        if len(kinds) == 1 and all(q.is_partial() or q.is_replicate() for q in ps):
            return kinds.pop()
        return Replicate() if p.is_partial() else p

    same_partial = [keep(i, p) for i, p in enumerate(cur)]
    target = tuple(Replicate() if p.is_shard() and p.dim == dim and func is aten.cat.default else p for p in same_partial)
    if func is aten.stack.default:
        out_pl = _shift(target, lambda d: d + (d >= dim))
    else:
        out_pl = target
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and all(type(t) is ShardedTensor and placements_of(t) == target for t in tensors):
        # Nothing moves (every operand already in the layout): the op on the locals, the
        # result built from what the plan knows.
        fp = fast_plan(func, meta, mesh, out_pl, coord)
        if fp is not None:
            op, make = fp

            def fast(args):
                return make(op([t.local for t in args[0]], *args[1:]))
    return meta, target, out_pl, mesh, coord, fast


_cat_plan = planned(_cat_decide)


@ShardedTensor.implements(aten.cat.default, aten.stack.default)
def cat(func, types, args, kwargs):
    """Concatenate (or stack) locally in the first operand's layout; a shard on the
    concatenated dim is gathered first, plain operands count as replicated."""
    from ._common import move_plain

    meta, target, out_pl, mesh, coord, fast = _cat_plan(func, args, kwargs)
    if fast is not None:
        return fast(args)
    locals_ = [move(t, target) if type(t) is ShardedTensor else move_plain(t, mesh, coord, target) for t in args[0]]
    return wrap_out(func(locals_, *args[1:], **kwargs), meta, mesh, out_pl, coord)
