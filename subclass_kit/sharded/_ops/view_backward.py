"""The ``*_backward`` ops autograd emits for view ops, and the ``*_scatter`` ops
functionalization emits for writes into views.

Each one places a gradient (or a source) into a region of a tensor of the input's global
size; the rest is zeros (``*_backward``) or the base tensor (``*_scatter``):

- ``slice_backward`` / ``slice_scatter`` along ``dim``: the region is a range of ``dim``, so
  a shard on any other dim stays where it is; a shard on ``dim`` is gathered first.
- ``select_backward`` / ``select_scatter``: ``dim`` is inserted (removed from the source),
  shards past it shift by one.
- ``diagonal_backward``: the two diagonal dims are gathered, the others keep their shards.

The result is built on each rank with the local sizes of its shard. The ops are linear in
the gradient, so ``Partial('sum')``/``Partial('avg')`` pass through ``*_backward`` (the
zeros are the same on every rank); other Partials are reduced first. A ``*_scatter``
keeps a Partial only when base and source are Partial alike.
"""

from __future__ import annotations

from .._layout import local_shape
from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of, spec
from ._common import aten, global_meta, move, move_plain, planned, spec_of, wrap_out

__all__ = ["embed_backward", "scatter_into_view"]

_LINEAR = ("sum", "avg")


def _grad_target(pl, gone: set) -> tuple:
    """Placements of the gradient the rule runs on: shards on ``gone`` gathered, Partials
    that are not linear reduced."""
    return tuple(
        Replicate() if (p.is_shard() and p.dim in gone) or (p.is_partial() and p.op not in _LINEAR) else p
        for p in pl
    )


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _embed_decide(func, args, kwargs):
    g = args[0]
    mesh, cur, coord = spec(g)
    sizes = tuple(args[1])
    nd = len(sizes)
    if func is aten.slice_backward.default:
        dim = args[2] % nd
        target = _grad_target(cur, {dim})
        out_pl = target
    elif func is aten.select_backward.default:
        dim = args[2] % nd
        target = _grad_target(cur, set())
        out_pl = tuple(Shard(p.dim + (p.dim >= dim)) if p.is_shard() else p for p in target)
    else:  # diagonal_backward(grad, input_sizes, offset, dim1, dim2): the diagonal is the last dim of grad
        d1, d2 = args[3] % nd, args[4] % nd
        target = _grad_target(cur, {g.dim() - 1})
        kept = [d for d in range(nd) if d not in (d1, d2)]
        out_pl = tuple(Shard(kept[p.dim]) if p.is_shard() else p for p in target)
    lsizes = list(local_shape(sizes, out_pl, mesh.shape, coord))
    return global_meta(func, args, kwargs), target, out_pl, lsizes, mesh, coord


_embed_plan = planned(_embed_decide)


@ShardedTensor.implements(aten.slice_backward.default, aten.select_backward.default, aten.diagonal_backward.default)
def embed_backward(func, types, args, kwargs):
    """The gradient of a view, placed into zeros of the input's size, shard by shard."""
    meta, target, out_pl, lsizes, mesh, coord = _embed_plan(func, args, kwargs)
    local = move(args[0], target)
    res = func(local, lsizes, *args[2:], **kwargs)
    return wrap_out(res, meta, mesh, out_pl, coord)


def _scatter_decide(func, args, kwargs):
    base, src = args[0], args[1]
    mesh, coord = spec_of(func, args, kwargs)
    nd = base.dim()
    dim = _arg(args, kwargs, 2, "dim", 0) % nd
    bpl = placements_of(base) if type(base) is ShardedTensor else (Replicate(),) * mesh.ndim
    spl = placements_of(src) if type(src) is ShardedTensor else (Replicate(),) * mesh.ndim
    out = []
    for p, q in zip(bpl, spl):
        if p.is_shard() and p.dim != dim:
            out.append(p)
        elif p.is_partial() and p == q and p.op in _LINEAR:
            out.append(p)
        else:
            out.append(Replicate())
    out_pl = tuple(out)
    drop = func is aten.select_scatter.default
    src_pl = tuple(
        Shard(p.dim - (drop and p.dim > dim)) if p.is_shard() else p for p in out_pl
    )
    return global_meta(func, args, kwargs), out_pl, src_pl, mesh, coord


_scatter_plan = planned(_scatter_decide)


@ShardedTensor.implements(aten.slice_scatter.default, aten.select_scatter.default)
def scatter_into_view(func, types, args, kwargs):
    """Write ``src`` into a slice/select of ``base`` (functionalized ``base[i:j] = src``)."""
    meta, out_pl, src_pl, mesh, coord = _scatter_plan(func, args, kwargs)
    base, src = args[0], args[1]
    lb = move(base, out_pl) if type(base) is ShardedTensor else move_plain(base, mesh, coord, out_pl)
    ls = move(src, src_pl) if type(src) is ShardedTensor else move_plain(src, mesh, coord, src_pl)
    res = func(lb, ls, *args[2:], **kwargs)
    return wrap_out(res, meta, mesh, out_pl, coord)
