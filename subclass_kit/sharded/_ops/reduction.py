"""Reductions (``sum``, ``mean``, ``prod``, ``amax``/``amin``, ``max``/``min``) and softmax-likes.

Reducing over a sharded dim leaves each rank with an operand of the result, so the output
is ``Partial``: ``Partial('sum')`` for ``sum`` and ``mean`` (each rank divides its local sum
by the *global* count, which stays exact for uneven shards), ``Partial('product')`` for
``prod``, ``Partial('max'/'min')`` for the extrema. Unreduced shards shift past the removed dims. A Partial input stays Partial
through a reduction of the same kind (a sum of sums); otherwise it is reduced first.

``softmax``/``log_softmax`` (and their backward) act locally along an unsharded dim and
gather a sharded one first.

``var``/``std`` (and ``*_mean``) over a sharded dim all-gather each rank's count, mean and
sum of squared deviations (result-sized) and combine them by Chan's formula: one collective,
the rows never move.
"""

from __future__ import annotations

import math

import torch

from ... import collectives as _coll
from .._comm import waited
from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of, spec
from .indexing import along_decide, along_general, reduction_rule
from ._common import aten, global_meta, move, move_plain, fast_plan, on_locals, planned, spec_of, wrap_out

__all__ = ["reduce", "softmax_like", "moments", "vector_norm"]

_KIND = {
    aten.sum.default: "sum", aten.sum.dim_IntList: "sum",
    aten.mean.default: "sum", aten.mean.dim: "sum",
    aten.amax.default: "max", aten.max.default: "max",
    aten.amin.default: "min", aten.min.default: "min",
    aten.prod.default: "product", aten.prod.dim_int: "product",
}
_KEEPS = {"sum": ("sum", "avg"), "max": ("max",), "min": ("min",), "product": ("product",)}


def _dims_keepdim(func, x, args, kwargs):
    nd = x.dim()
    if func in (aten.sum.default, aten.mean.default, aten.max.default, aten.min.default, aten.prod.default):
        return list(range(nd)), False
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(nd)), keepdim
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % nd for d in dim}) if nd else [], keepdim


@ShardedTensor.implements(*_KIND)
def reduce(func, types, args, kwargs):
    """Reduce the local shard; a reduced shard dim becomes a Partial of the same kind."""
    plan = _reduce_plan(func, args, kwargs)
    fast = plan[0]
    if fast is not None:
        return fast(args) if not kwargs else fast(args, kwargs)
    _, meta, target, out_pl, mean_of_shard, mesh, coord, identity = plan
    local = move(args[0], target)
    if identity is not None and local.numel() == 0:
        # This rank's shard of a reduced dim is empty (a dim smaller than the mesh): the
        # local max/min is the identity of the reduction, not torch's "non-zero size" error
        # (which would leave the other ranks waiting in the all-reduce).
        dims, keepdim = _dims_keepdim(func, local, args, kwargs)
        shape = [1 if d in dims else n for d, n in enumerate(local.shape) if keepdim or d not in dims]
        res = torch.full(shape, identity, dtype=local.dtype, device=local.device)
    elif mean_of_shard is not None:
        dims, keepdim, count = mean_of_shard
        res = aten.sum.dim_IntList(local, dims, keepdim, dtype=kwargs.get("dtype")) / count
    else:
        res = func(local, *args[1:], **kwargs)
    return wrap_out(res, meta, mesh, out_pl, coord)


def _reduce_decide(func, args, kwargs):
    x = args[0]
    mesh, placements, coord = spec(x)
    kind = _KIND[func]
    dims, keepdim = _dims_keepdim(func, x, args, kwargs)
    target, out_pl = [], []
    for p in placements:
        if p.is_partial() and p.op not in _KEEPS[kind]:
            p = Replicate()
        target.append(p)
        if p.is_shard():
            if p.dim in dims:
                out_pl.append(Partial(kind))
            else:
                out_pl.append(Shard(p.dim if keepdim else p.dim - sum(d < p.dim for d in dims)))
        else:
            out_pl.append(p)
    meta = global_meta(func, args, kwargs)
    mean_of_shard = None
    if func in (aten.mean.default, aten.mean.dim) and any(p.is_shard() and p.dim in dims for p in target):
        # mean over a sharded dim: the local sum divided by the global count (exact for
        # uneven shards), a Partial('sum') of the mean.
        mean_of_shard = (dims, keepdim, math.prod(x.shape[d] for d in dims))
    target, out_pl = tuple(target), tuple(out_pl)
    identity = None
    if kind != "sum" and any(p.is_shard() and p.dim in dims for p in target):
        dt = meta.dtype
        if kind == "product":
            identity = None  # torch's prod of an empty shard is already 1
        elif dt == torch.bool:
            identity = kind == "min"
        elif dt.is_floating_point:
            identity = -math.inf if kind == "max" else math.inf
        elif not dt.is_complex:
            identity = torch.iinfo(dt).min if kind == "max" else torch.iinfo(dt).max
    fast = None
    if mean_of_shard is None and target == placements and (identity is None or x.local.numel()):
        fast = fast_plan(func, meta, mesh, out_pl, coord, args, kwargs)
        if fast is not None:
            # The key pins the keyword arguments' names (and values), so whether a hit
            # passes them is the plan's to decide.
            fast = on_locals(*fast, args) if not kwargs else _with_kwargs(*fast)
    return fast, meta, target, out_pl, mean_of_shard, mesh, coord, identity


def _with_kwargs(op, make):
    def run(args, kwargs):
        return make(op(args[0].local, *args[1:], **kwargs))

    return run


_reduce_plan = planned(_reduce_decide)


_SOFTMAX = {
    aten._softmax.default: 1,
    aten._log_softmax.default: 1,
    aten._softmax_backward_data.default: 2,
    aten._log_softmax_backward_data.default: 2,
}


def _softmax_decide(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    i = _SOFTMAX[func]
    x = args[0]
    dim = args[i] % x.dim()
    tensors = [a for a in args[:i] if isinstance(a, ShardedTensor)]
    # Every tensor operand is brought to one layout: that of the first operand sharded on a
    # dim other than `dim` (so a backward's replicated incoming gradient is chunked to the
    # output's shard rather than the output gathered), minus a shard on `dim`, minus Partial
    # (softmax is not linear).
    def keep(p):
        return p.is_shard() and p.dim != dim

    base = next((placements_of(t) for t in tensors if any(keep(p) for p in placements_of(t))),
                placements_of(tensors[0]))
    pl = tuple(p if keep(p) else Replicate() for p in base)
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and all(placements_of(a) == pl if type(a) is ShardedTensor else not isinstance(a, torch.Tensor)
                          for a in args):
        fast = fast_plan(func, meta, mesh, pl, coord, args)
        if fast is not None:
            fast = on_locals(*fast, args)
    return meta, pl, mesh, coord, fast


_softmax_plan = planned(_softmax_decide)


@ShardedTensor.implements(*_SOFTMAX)
def softmax_like(func, types, args, kwargs):
    """Softmax along an unsharded dim runs locally; a sharded one is gathered first."""
    meta, pl, mesh, coord, fast = _softmax_plan(func, args, kwargs)
    if fast is not None:
        return fast(args)
    new = [
        move(a, pl) if type(a) is ShardedTensor else (move_plain(a, mesh, coord, pl) if isinstance(a, torch.Tensor) else a)
        for a in args
    ]
    return wrap_out(func(*new, **kwargs), meta, mesh, pl, coord)


# ---- variance and standard deviation over a sharded dim: one gather of statistics -----------
_MOMENTS = {
    aten.var.correction: ("var",),
    aten.std.correction: ("std",),
    aten.var_mean.correction: ("var", "mean"),
    aten.std_mean.correction: ("std", "mean"),
}


def _moments_apply(x, dims) -> bool:
    """Whether the gathered-statistics form applies: a real floating ShardedTensor sharded on a reduced
    dim, with no pending reduction (a variance is not linear in a Partial's operands)."""
    if type(x) is not ShardedTensor or not x.dtype.is_floating_point:
        return False
    pl = placements_of(x)
    return not any(p.is_partial() for p in pl) and any(p.is_shard() and p.dim in dims for p in pl)


def _moments_decide(func, args, kwargs):
    """``(along, dims)``: the along-dims rule's decisions (``along_decide``) where the
    gathered-statistics form does not apply, else ``(None, dims)``; ``dims`` the reduced dims."""
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    nd = x.dim()
    dims = sorted(range(nd) if dim is None or (isinstance(dim, (list, tuple)) and not dim)
                  else {d % nd for d in (dim if isinstance(dim, (list, tuple)) else (dim,))})
    if _moments_apply(x, dims):
        return None, dims
    return along_decide(func, args, kwargs), dims


# One plan per call signature for both forms: the common case (no sharded dim reduced) is
# the along-dims rule's fast path behind a single cache lookup.
_moments_plan = planned(_moments_decide)


def _local_moments(local: torch.Tensor, dims) -> torch.Tensor:
    """``(1, 4, *kept)``: this rank's count, rounded mean ``m``, the sum of its deviations
    from ``m`` (what rounding ``m`` lost, times the count) and the sum of their squares
    (keepdim), in at least float32 (a bf16 count is exact only up to 256)."""
    acc = torch.promote_types(local.dtype, torch.float32)
    x = local.to(acc)
    n = math.prod(local.shape[d] for d in dims)
    mean = aten.sum.dim_IntList(x, dims, True) / max(n, 1)  # an empty shard: 0, weighed by 0
    dev = x - mean
    return torch.stack([torch.full_like(mean, n), mean, aten.sum.dim_IntList(dev, dims, True),
                        aten.sum.dim_IntList(dev * dev, dims, True)]).unsqueeze(0)


def _combine(stats: torch.Tensor, n, correction):
    """Chan et al.'s parallel combination of the ranks' statistics (dim 0): M2 is the ranks'
    own plus each count times its mean's squared distance from the global mean. Every mean
    is taken relative to the first rank's rounded mean ``K`` (nonempty: torch.chunk leaves
    the last chunks empty), exact for nearby means, plus the rank's rounding correction, so a
    large common offset cancels before anything is squared: float32 statistics of data
    around 1e4 keep the spread (a sum of squares minus a squared sum would keep no digit)."""
    counts, means, dsum, m2 = stats.unbind(1)
    k = means[0]
    safe = counts.clamp(min=1)
    d = (means - k) + dsum / safe  # each rank's exact mean, relative to k
    shift = (counts * d).sum(0) / n
    own = m2 - dsum * dsum / safe
    e = d - shift
    return k + shift, (own + counts * e * e).sum(0) / max(0, n - correction)


@ShardedTensor.implements(*_MOMENTS)
def moments(func, types, args, kwargs):
    """``var``/``std`` (and ``*_mean``) reducing a sharded dim in one collective: each rank's
    count, mean and deviations' sums over its shard (result-sized, see ``_combine``), all-gathered
    over the mesh dims that shard a reduced dim and combined by Chan's formula -- the rows
    never move (DTensor, and the along-dims rule, gather them). Results are laid out as the
    along-dims rule lays them out (the reduced shards become Replicate), so every rank holds
    the same statistics. Other layouts take the along-dims rule."""
    along, dims = _moments_plan(func, args, kwargs)
    if along is not None:
        fast = along[-1]
        if fast is not None:
            return fast(args, kwargs)
        return along_general(along, func, args, kwargs)
    x = args[0]
    keepdim = kwargs.get("keepdim", False)
    correction = kwargs.get("correction")
    correction = 1 if correction is None else correction
    mesh, cur, coord = spec(x)
    stats = _local_moments(move(x, cur), dims)
    for i, p in enumerate(cur):
        if p.is_shard() and p.dim in dims and mesh.shape[i] > 1:
            stats = waited(_coll.all_gather_tensor(stats.contiguous(), 0, mesh.group_names[i]))
    mean, var = _combine(stats, math.prod(x.shape[d] for d in dims), correction)
    kept = tuple(Replicate() if p.is_shard() and p.dim in dims else p for p in cur)
    out = tuple(Shard(p.dim - sum(d < p.dim for d in dims)) if p.is_shard() and not keepdim else p for p in kept)
    meta = global_meta(func, args, kwargs)
    metas = (meta,) if len(_MOMENTS[func]) == 1 else meta
    first = (var.sqrt() if _MOMENTS[func][0] == "std" else var).to(x.dtype)
    res = tuple(wrap_out(r if keepdim else r.squeeze(dims), m, mesh, out, coord)
                for r, m in zip((first, mean.to(x.dtype)), metas))
    return res[0] if len(res) == 1 else res


for _f in _MOMENTS:
    reduction_rule(_f)  # the along-dims rule's entry for these ops (derived from their schema)


# ---- vector norms whose reduction is a sum, a max or a min (``torch.dist`` decomposes here) ---
_NORM_AS = {1: aten.sum.dim_IntList, math.inf: aten.amax.default, -math.inf: aten.amin.default}


_NORMS = (aten.linalg_vector_norm.default, aten.norm.Scalar, aten.norm.ScalarOpt_dim)


@ShardedTensor.implements(*_NORMS)
def vector_norm(func, types, args, kwargs):
    """``ord=1``/``inf``/``-inf`` over a sharded dim: ``abs`` then the sum/amax/amin rule, so the
    result is a ``Partial('sum'/'max'/'min')`` with no communication (DTensor: its norm
    partial); other orders, or nothing sharded reduced, take the along-dims rule."""
    x = args[0]
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", kwargs.get("p", 2))
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    op = _NORM_AS.get(ord_) if type(x) is ShardedTensor else None
    if op is not None:
        pl = placements_of(x)
        dims = list(range(x.dim())) if dim is None or (type(dim) in (list, tuple) and not dim) else (
            [d % max(x.dim(), 1) for d in (dim if type(dim) in (list, tuple) else (dim,))])
        if not any(p.is_partial() for p in pl) and any(p.is_shard() and p.dim in dims for p in pl):
            a = aten.abs.default(x)
            dtype = kwargs.get("dtype")
            if dtype is not None:
                a = aten._to_copy.default(a, dtype=dtype)
            return op(a, dims, keepdim)
    return _NORM_ALONG[func](func, types, args, kwargs)


_NORM_ALONG = {f: reduction_rule(f) for f in _NORMS}


# ---- histc with a given range: each rank bins its shard, the counts sum -----------------------
@ShardedTensor.implements(aten.histc.default)
def histc(func, types, args, kwargs):
    """``histc(x, bins, min, max)`` with ``min < max``: every rank bins its own elements into
    the same bins, so the result is ``Partial('sum')`` over the sharded mesh dims with no
    communication (as DTensor's). The default range (``min == max``) is the data's own extrema,
    and a Partial input's elements are not its values: those are computed whole."""
    from .generic import computed_whole

    x = args[0]
    named = dict(zip(("bins", "min", "max"), args[1:]), **kwargs)
    lo, hi = named.get("min", 0), named.get("max", 0)
    pl = placements_of(x)
    if type(x) is not ShardedTensor or not lo < hi or any(p.is_partial() for p in pl):
        return computed_whole(func, types, args, kwargs)
    mesh, _, coord = spec(x)
    out_pl = tuple(Partial("sum") if p.is_shard() else p for p in pl)
    return wrap_out(func(x.local, *args[1:], **kwargs), global_meta(func, args, kwargs), mesh, out_pl, coord)
