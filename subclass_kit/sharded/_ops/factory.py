"""Factories from a ShardedTensor: ``*_like`` and ``new_*`` (autograd and optimizers use them).
(``rand_like`` and the other random ones are in ``random``: they draw as the dense op does.)

A fresh value is whole on every rank, so a result is never Partial: ``zeros_like`` of a
Partial tensor is Replicate (``empty_like(t, device=)``, as ``nn.Module.to_empty`` runs it,
and ``empty_like`` of a meta tensor keep the Partial). ``new_*`` with the tensor's own global shape keeps its
shards; any other shape is replicated (its local is the whole tensor).
"""

from __future__ import annotations

from .._layout import local_shape
from ..placements import Partial, Replicate
from ..tensor import ShardedTensor, spec
from ._common import aten, fast_plan, global_meta, on_locals, plain_values, planned, wrap_out

__all__ = ["like_factory", "new_factory", "is_same_size"]


def _no_partial(pl) -> tuple:
    return tuple(p.settled() for p in pl)


@ShardedTensor.implements(
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
    aten.full_like.default,
)
def like_factory(func, types, args, kwargs):
    """Same layout as the input (Partial becomes Replicate)."""
    meta, pl, mesh, coord, fast = _like_plan(func, args, kwargs)
    if fast is not None:
        return fast(args, kwargs) if kwargs else fast(args)
    return wrap_out(func(args[0].local, *args[1:], **kwargs), meta, mesh, pl, coord)


def _like_decide(func, args, kwargs):
    mesh, pl, coord = spec(args[0])
    if func is not aten.empty_like.default or ("device" not in kwargs and args[0].device.type != "meta"):
        # An uninitialized result can be laid out anyhow: ``empty_like(t, device=)``, what
        # nn.Module.to_empty runs, keeps a Partial parameter Partial (as DTensor; so does
        # ``to_empty(device=None)`` of a meta one, whose device torch drops); a scratch
        # tensor on the same device (dropout's mask, filled next) is Replicate, so filling it
        # and using it as a factor of a Partial costs nothing.
        pl = _no_partial(pl)
    meta = global_meta(func, args, kwargs)
    fast = None
    if plain_values(kwargs):
        # dropout's empty_like, an optimizer's zeros_like (torch passes pin_memory=): the op
        # on the local, the result built from what the plan knows.
        fp = fast_plan(func, meta, mesh, pl, coord, args, kwargs)
        fast = None if fp is None else on_locals(*fp, args, kwargs)
    return meta, pl, mesh, coord, fast


_like_plan = planned(_like_decide)


_NEW = {
    aten.new_empty.default, aten.new_zeros.default, aten.new_ones.default,
    aten.new_full.default, aten.new_empty_strided.default,
}


@ShardedTensor.implements(*_NEW)
def new_factory(func, types, args, kwargs):
    """A new tensor of a global size: sharded like the input if the size is the input's
    (``new_empty``/``new_empty_strided``: Partial too)."""
    meta, pl, mesh, coord, lsize, lstride = _new_plan(func, args, kwargs)
    if lstride is None:
        local = func(args[0].local, lsize, *args[2:], **kwargs)
    else:
        local = func(args[0].local, lsize, lstride, *args[3:], **kwargs)
    return wrap_out(local, meta, mesh, pl, coord)


def _new_decide(func, args, kwargs):
    x = args[0]
    mesh, cur, coord = spec(x)
    size = tuple(args[1])
    meta = global_meta(func, args, kwargs)
    same = len(size) == x.dim() and all(a == b for a, b in zip(size, x.shape))
    # An uninitialized one may stay a pending sum, as DTensor's: it is about to be
    # overwritten by a value of the input's placements (autograd's new_empty_strided + copy_
    # of a gradient), so no reduction is forced.
    empty = func in (aten.new_empty.default, aten.new_empty_strided.default)
    pl = (cur if empty else _no_partial(cur)) if same else (Replicate(),) * mesh.ndim
    lsize = local_shape(size, pl, mesh.shape, coord)
    lstride = None
    if func is aten.new_empty_strided.default:
        from .._layout import contiguous_strides

        # The local keeps the requested layout's dim order, as a compact tensor.
        order = sorted(range(len(size)), key=lambda d: -args[2][d]) if all(type(s) is int for s in args[2]) else range(len(size))
        st = [0] * len(size)
        acc = 1
        for d in reversed(list(order)):
            st[d] = acc
            acc = acc * lsize[d]
        lstride = st if len(size) else contiguous_strides(lsize)
    return meta, pl, mesh, coord, lsize, lstride


_new_plan = planned(_new_decide)


@ShardedTensor.implements(aten.is_same_size.default)
def is_same_size(func, types, args, kwargs):
    """Compares global shapes."""
    a, b = args
    return tuple(a.shape) == tuple(b.shape)

