"""View ops: the shard moves with the dim it is on, or the view replicates that mesh dim.

- ``t``/``transpose``/``permute``: the shard follows its dim.
- ``unsqueeze``/``squeeze``: the shard shifts past the inserted/removed dims.
- ``view``/``_unsafe_view`` (what ``reshape``/``flatten`` end in): see ``reshape``.
- ``expand``: the shard follows its dim; a sharded size-1 dim being broadcast is gathered.
- ``slice``/``select``/``split``/``split_with_sizes``/``unbind`` along an unsharded dim act
  locally; along a sharded dim they gather it first. ``diagonal`` gathers its two dims.
- ``cat``/``stack``: in the first operand's layout; a shard on the concatenated dim is
  gathered first.

(``as_strided`` is replayed as these views: see ``as_strided``.)

Partial placements pass through every view unchanged (views are linear). The helpers here
that wrap a view's local result (``_finish``, the planned alias path ``_fast_view``) serve
``reshape`` too.
"""

from __future__ import annotations

from ... import _compat
from ...ctx import ctx_of
from ..placements import Replicate, Shard
from ..tensor import ShardedTensor, placements_of, sig_of, spec
from ._common import TensorMeta, aten, global_meta, move, fast_plan, planned, spec_of, wrap_out

__all__ = ["detach", "permute_like", "expand", "along_dim", "diagonal", "complex_view"]


def _released(x, dims) -> tuple:
    """``x``'s placements with the mesh dims sharding any of ``dims`` gathered."""
    return tuple(Replicate() if p.is_shard() and p.dim in dims else p for p in placements_of(x))


def _release(x, dims) -> tuple:
    """``x``'s local with mesh dims sharding any of ``dims`` gathered; and its placements."""
    target = _released(x, dims)
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
    meta, dim, pl, fast = _unsqueeze_plan(func, args, kwargs)
    if fast is not None and args[0]._gathered_view is None:
        return _fast_view(fast, args)
    return _finish(func, args, kwargs, func(args[0].local, dim), meta, pl)


@ShardedTensor.implements(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(func, types, args, kwargs):
    meta, target, pl, gone, fast = _squeeze_plan(func, args, kwargs)
    x = args[0]
    if fast is not None and x._gathered_view is None:
        # squeeze.dims by the global size-1 dims, never func on the local: a shard's local
        # can be 1 long in a dim whose global size is not (it must stay).
        out = fast[1](aten.squeeze.dims(x.local, gone))
        _alias(out, x)
        return out
    local = move(x, target)
    return _finish(func, args, kwargs, aten.squeeze.dims(local, gone), meta, pl, local is not x.local)


def _squeeze_decide(func, args, kwargs):
    x = args[0]
    nd = x.dim()
    if func is aten.squeeze.default:
        cand = range(nd)
    elif func is aten.squeeze.dim:
        cand = [args[1] % nd] if nd else []
    else:
        cand = [d % nd for d in args[1]] if nd else []
    gone = sorted(d for d in cand if x.shape[d] == 1)
    target, meta = _released(x, set(gone)), global_meta(func, args, kwargs)
    pl = _shift(target, lambda d: d - sum(g < d for g in gone))
    fast = _fast_of(func, args, kwargs, meta, pl) if target == placements_of(x) else None
    return meta, target, pl, gone, fast


_squeeze_plan = planned(_squeeze_decide)


@ShardedTensor.implements(aten.view_as_real.default, aten.view_as_complex.default)
def complex_view(func, types, args, kwargs):
    """``view_as_real`` (a new last dim of 2) keeps every shard and Partial;
    ``view_as_complex`` gathers a shard of the last dim (the pairs it merges), keeps the rest."""
    meta, target, fast = _complex_plan(func, args, kwargs)
    x = args[0]
    if fast is not None and x._gathered_view is None:
        return _fast_view(fast, args)
    local = move(x, target)
    return _finish(func, args, kwargs, func(local), meta, target, local is not x.local)


def _complex_decide(func, args, kwargs):
    x = args[0]
    target = _released(x, {x.dim() - 1} if func is aten.view_as_complex.default else set())
    meta = global_meta(func, args, kwargs)
    return meta, target, _fast_of(func, args, kwargs, meta, target) if target == placements_of(x) else None


_complex_plan = planned(_complex_decide)


@ShardedTensor.implements(aten.expand.default)
def expand(func, types, args, kwargs):
    """The shard follows its dim; a broadcast sharded dim is gathered first."""
    x = args[0]
    meta, bad, pl, size, fast = _expand_plan(func, args, kwargs)
    if fast is not None and x._gathered_view is None:
        op, make = fast
        out = make(op(x.local, size, *args[2:]))
        _alias(out, x)
        return out
    local, _ = _release(x, bad)
    return _finish(func, args, kwargs, func(local, size, *args[2:], **kwargs), meta, pl, local is not x.local)


def _expand_decide(func, args, kwargs):
    x = args[0]
    meta = global_meta(func, args, kwargs)
    lead = len(meta.shape) - x.dim()
    cur = placements_of(x)
    bad = {p.dim for p in cur if p.is_shard() and x.shape[p.dim] == 1 and meta.shape[p.dim + lead] != 1}
    target = tuple(Replicate() if p.is_shard() and p.dim in bad else p for p in cur)
    # The local's size: the global one, but each kept shard's dim at the local's size.
    size = list(meta.shape)
    local_size = x.local.shape
    for p in target:
        if p.is_shard():
            size[p.dim + lead] = local_size[p.dim]
    pl = _shift(target, lambda d: d + lead)
    fast = None if bad else _fast_of(func, args, kwargs, meta, pl)
    return meta, bad, pl, size, fast


_expand_plan = planned(_expand_decide)


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
    meta, target, pl, fast = _along_plan(func, args, kwargs)
    if fast is not None and args[0]._gathered_view is None:
        return fast(args)
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
    meta = global_meta(func, args, kwargs)
    fast = None
    if target == cur:  # nothing gathered: the view of the local, planned
        if type(meta) is TensorMeta:
            fp = _fast_of(func, args, kwargs, meta, pl)
            fast = None if fp is None else lambda args, fp=fp: _fast_view(fp, args)
        elif not kwargs and ShardedTensor.op_aliasing(func).view_pairs == ((0, 0),):
            fast = _fast_views(func, args, meta, pl)
    return meta, target, pl, fast


def _fast_views(func, args, metas, pl):
    """``run(args)`` for a view op with several results (split, unbind), each viewing
    ``args[0]``, when nothing is gathered: the op on the local, each result built from
    what the plan knows and aliased as ``correct_aliasing`` would; None under symbolic sizes."""
    mesh, _, coord = spec(args[0])
    makes = []
    for m in metas:
        fp = fast_plan(func, m, mesh, pl, coord) if type(m) is TensorMeta else None
        if fp is None:
            return None
        makes.append(fp[1])
    op = _compat.raw_op(func)

    def run(args):
        x = args[0]
        out = [mk(r) for mk, r in zip(makes, op(x.local, *args[1:]))]
        for o in out:
            _alias(o, x)
        return out

    return run


_along_plan = planned(_along_decide)


def _unsqueeze_decide(func, args, kwargs):
    x, dim = args[0], args[1] % (args[0].dim() + 1)
    meta, pl = global_meta(func, args, kwargs), _shift(placements_of(x), lambda d: d + (d >= dim))
    return meta, dim, pl, _fast_of(func, args, kwargs, meta, pl)


_unsqueeze_plan = planned(_unsqueeze_decide)


@ShardedTensor.implements(aten.diagonal.default)
def diagonal(func, types, args, kwargs):
    """The two diagonal dims are gathered; the other shards move to their place among the
    kept dims (the diagonal becomes the last dim)."""
    meta, target, pl, fast = _diagonal_plan(func, args, kwargs)
    x = args[0]
    if fast is not None and x._gathered_view is None:
        return _fast_view(fast, args)
    local = move(x, target)
    return _finish(func, args, kwargs, func(local, *args[1:], **kwargs), meta, pl, local is not x.local)


def _diagonal_decide(func, args, kwargs):
    x = args[0]
    nd = x.dim()
    d1 = (args[2] if len(args) > 2 else kwargs.get("dim1", 0)) % nd
    d2 = (args[3] if len(args) > 3 else kwargs.get("dim2", 1)) % nd
    target = _released(x, {d1, d2})
    kept = [d for d in range(nd) if d not in (d1, d2)]
    meta = global_meta(func, args, kwargs)
    pl = _shift(target, kept.index)
    return meta, target, pl, _fast_of(func, args, kwargs, meta, pl) if target == placements_of(x) else None


_diagonal_plan = planned(_diagonal_decide)


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
