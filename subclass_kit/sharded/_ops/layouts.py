"""Ops on the layouts the op rules do not handle: a tensor dim sharded by several mesh dims
(nested ``[Shard(0), Shard(0)]``, FSDP-over-TP's ``[_StridedShard(0, sf), Shard(0)]``).

The rules of the other families reason about one mesh dim per tensor dim (an offset, a
chunk of the global dim). Rather than teach each of them, every op on such a layout comes
here first (``ShardedTensor.__torch_dispatch__`` asks, once such a layout exists):

- elementwise ops (torch's ``pointwise`` tag, copies and casts) whose sharded operands all
  share one layout and shape, without Partial, run on the locals and keep the layout, as
  DTensor's pointwise strategy does; so does ``mm`` of such a layout of the rows by a
  replicated matrix;
- a ``view`` that splits or keeps each sharded dim into dims its chunks are whole rows of
  views the local (``reshape.split_view``: a flatten's ``_StridedShard`` unflattened is a
  ``Shard`` again, as DTensor's);
- every other op gets its operands redistributed to the nearest layout the rules handle
  (``simple_target``: a nested dim keeps its first mesh dim, a strided one its TP shard)
  and runs by its rule. An in-place op writes its result back into the operand's own
  layout; a view of such a copy is marked as gathered (writing into it raises).

Never a wrong value: a rule never sees a layout it does not know.
"""

from __future__ import annotations

import torch

from ..placements import Partial, Placement, Replicate, Shard, _StridedShard, is_simple
from ..tensor import LAYOUT_HOOK, ShardedTensor, relayout, spec
from ._common import TensorMeta, aten, global_meta, wrap_out
from .reshape import split_view

__all__ = ["simple_target", "layout_dispatch"]

_R = Replicate()

# The ops whose handler only copies the placements along (aliases, ``*_like`` factories).
_PASS = {
    aten.detach.default, aten.alias.default, aten.zeros_like.default, aten.ones_like.default,
    aten.empty_like.default, aten.full_like.default, aten.lift_fresh.default,
}
_VIEWS = {aten.view.default, aten._unsafe_view.default}
_ELEMENTWISE = {aten._to_copy.default, aten.clone.default, aten.copy_.default, aten.fill_.Scalar, aten.zero_.default}


def simple_target(placements: tuple, mesh_shape: tuple) -> tuple:
    """The layout an op rule handles nearest to ``placements``: of the mesh dims sharding one
    tensor dim, a nested run keeps its first (one gather per other mesh dim), a strided
    shard gives way to the Shard it strides for (FSDP's all-gather), anything else is
    replicated.

    Example:
        >>> simple_target((Shard(0), Shard(0)), (2, 2)), simple_target((_StridedShard(0, split_factor=2), Shard(0)), (2, 2))
        ((Shard(0), Replicate()), (Replicate(), Shard(0)))
    """
    out: list[Placement] = list(placements)
    by_dim: dict = {}
    for i, p in enumerate(placements):
        if p.is_shard():
            by_dim.setdefault(p.shard_dim(), []).append(i)
    for e, where in by_dim.items():
        first = where[0]
        if type(placements[first]) is Shard:
            keep = first
        elif (len(where) == 2 and type(placements[where[1]]) is Shard
              and placements[first].split_factor == mesh_shape[where[1]]):  # type: ignore[attr-defined]
            keep = where[1]
        else:
            keep = None
        for i in where:
            if i != keep:
                out[i] = _R
    return tuple(out)


def _sharded(args, kwargs):
    for a in args:
        if type(a) is ShardedTensor:
            yield a
        elif type(a) in (list, tuple):
            yield from (b for b in a if type(b) is ShardedTensor)
    for v in kwargs.values():
        if type(v) is ShardedTensor:
            yield v


def _keeps(func, args, kwargs, pl) -> bool:
    if any(type(p) is Partial for p in pl):
        return False
    if func not in _ELEMENTWISE and torch.Tag.pointwise not in func.tags:
        return False
    shape = None
    for a in (*args, *kwargs.values()):
        if type(a) is ShardedTensor:
            if spec(a)[1] != pl or (shape is not None and a.shape != shape):
                return False
            shape = a.shape
        elif isinstance(a, torch.Tensor):
            if a.dim() != 0:
                return False
        elif type(a) in (list, tuple) and any(isinstance(b, torch.Tensor) for b in a):
            return False
    return True


def _keeps_rows(func, args, kwargs, pl) -> bool:
    """``mm`` of an operand whose only shards are of its rows (dim 0, strided or nested) by
    a replicated matrix: each rank's rows times the matrix are its rows of the product, in
    the same layout (as DTensor keeps a ``_StridedShard`` through ``mm``)."""
    if func is not aten.mm.default or kwargs or type(args[0]) is not ShardedTensor or spec(args[0])[1] != pl:
        return False
    if any(not p.is_replicate() and not (p.is_shard() and p.shard_dim() == 0) for p in pl):
        return False
    w = args[1]
    return type(w) is not ShardedTensor or all(p.is_replicate() for p in spec(w)[1])


def _written(func) -> list:
    """Positions of the arguments ``func`` writes into (in-place ops and ``out=``)."""
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _local(a):
    return a.local if type(a) is ShardedTensor else a


def _tensors(t) -> bool:
    """A schema return type that is a Tensor or a list of them."""
    if isinstance(t, torch.ListType):
        t = t.getElementType()
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def _outside(func, args, kwargs, mesh):
    """The op on a rank outside the mesh: nothing runs, nothing is communicated; a tensor
    result is an empty local (a zero for a 0-d one) under Replicate, a bool True, as
    DTensor's defaults on such a rank."""
    pl = (_R,) * mesh.ndim
    written = _written(func)
    if written and written[0] == 0 and type(args[0]) is ShardedTensor:
        return args[0]
    returns = [r.type for r in func._schema.returns]
    if not returns or not all(_tensors(r) for r in returns):
        return True if [str(r) for r in returns] == ["bool"] else None
    meta = global_meta(func, args, kwargs)

    def make(m):
        if type(m) is not TensorMeta:
            return m if m is None else True
        local = torch.zeros((), dtype=m.dtype) if len(m.shape) == 0 else torch.tensor([], dtype=m.dtype)
        return wrap_out(local, TensorMeta(m.shape, m.stride, m.dtype, 0), mesh, pl, ())

    return type(meta)(make(m) for m in meta) if type(meta) in (list, tuple) else make(meta)


def layout_dispatch(func, args, kwargs):
    """Run ``func`` if one of its ShardedTensor operands has a layout the rules do not
    handle or lives on a mesh without this rank; NotImplemented otherwise (the op goes to
    its rule)."""
    odd = []
    for x in _sharded(args, kwargs):
        m, p, c = spec(x)
        if not c:
            return NotImplemented if func in _PASS else _outside(func, args, kwargs, m)
        if not is_simple(p):
            odd.append(x)
    if not odd or func in _PASS:
        return NotImplemented
    if func in _VIEWS and type(args[0]) is ShardedTensor:
        out = split_view(func, args, kwargs)
        if out is not None:
            return out
    mesh, pl, coord = spec(odd[0])
    if _keeps(func, args, kwargs, pl) or _keeps_rows(func, args, kwargs, pl):
        out = func(*[_local(a) for a in args], **{k: _local(v) for k, v in kwargs.items()})
        written = _written(func)
        if written and written[0] == 0:
            return args[0]
        meta = global_meta(func, args, kwargs)
        if type(meta) is not TensorMeta:
            return NotImplemented
        return wrap_out(out, meta, mesh, pl, coord)
    moved: dict = {}

    def simple(a):
        if type(a) is ShardedTensor:
            p = spec(a)[1]
            if not is_simple(p):
                if id(a) not in moved:
                    moved[id(a)] = relayout(a, simple_target(p, mesh.shape))
                return moved[id(a)]
        elif type(a) in (list, tuple):
            return type(a)(simple(b) for b in a)
        return a

    new_args = [simple(a) for a in args]
    new_kwargs = {k: simple(v) for k, v in kwargs.items()}
    out = func(*new_args, **new_kwargs)
    names = [a.name for a in func._schema.arguments]
    for i in _written(func):
        x = args[i] if i < len(args) else kwargs.get(names[i])
        if type(x) is ShardedTensor and id(x) in moved:
            # The op wrote into the copy: bring the copy back into the operand's layout.
            y = moved[id(x)]
            x.local.copy_(relayout(y, spec(x)[1], x.shape, x.stride()).local)
            if out is y:
                out = x
    if func.is_view and type(out) is ShardedTensor:
        # The view ran on a relaid copy: its metadata is the copy's (offset 0 at the copy's
        # start); a view of the operand has the dense view's, storage offset included.
        meta = global_meta(func, args, kwargs)
        if type(meta) is TensorMeta:
            out = wrap_out(out.local, meta, *spec(out))
    if func.is_view:
        for o in (out if type(out) in (list, tuple) else (out,)):
            if type(o) is ShardedTensor:
                o._gathered_view = func
    return out


LAYOUT_HOOK[0] = layout_dispatch
