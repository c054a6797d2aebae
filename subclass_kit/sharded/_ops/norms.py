"""Layer norm (``native_layer_norm`` and its backward): what ``SequenceParallel`` runs on an
activation sharded on the sequence dim.

Each row is normalized over the trailing ``normalized_shape`` dims alone, so a shard on a
leading dim (batch, sequence) stays: the op runs on the local rows, the statistics
(``mean``, ``rstd``) are sharded alike, and nothing is communicated. A shard on a normalized
dim, or a Partial, is gathered first. The weight and bias are used whole (replicated); in the
backward their gradients sum over every row, so where the rows are sharded they arrive
``Partial('sum')`` -- reduced when read (``full_tensor()``) or by the optimizer step, as
DTensor's sequence parallelism leaves them.
"""

from __future__ import annotations

from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from ._common import aten, global_meta, move, move_plain, spec_of, wrap_out

__all__ = ["layer_norm", "layer_norm_backward"]


def _rows(x, axis: int, mesh_ndim: int) -> tuple:
    """``x``'s placements with every shard of a normalized dim (or a Partial) replicated."""
    pl = placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * mesh_ndim
    return tuple(p if type(p) is Shard and p.dim < axis else Replicate() for p in pl)


def _local(x, mesh, coord, target):
    if x is None:
        return None
    return move(x, target) if type(x) is ShardedTensor else move_plain(x, mesh, coord, target)


@ShardedTensor.implements(aten.native_layer_norm.default)
def layer_norm(func, types, args, kwargs):
    """``(out, mean, rstd)``; rows sharded on a leading dim stay sharded."""
    x, shape, weight, bias, eps = args
    mesh, coord = spec_of(func, args, kwargs)
    rows = _rows(x, x.dim() - len(shape), mesh.ndim)
    whole = (Replicate(),) * mesh.ndim
    outs = func(_local(x, mesh, coord, rows), shape, _local(weight, mesh, coord, whole),
                _local(bias, mesh, coord, whole), eps)
    metas = global_meta(func, args, kwargs)
    return tuple(wrap_out(o, m, mesh, rows, coord) for o, m in zip(outs, metas))


@ShardedTensor.implements(aten.native_layer_norm_backward.default)
def layer_norm_backward(func, types, args, kwargs):
    """``(grad_input, grad_weight, grad_bias)``: grad_input sharded like the rows; the
    parameters' gradients Partial('sum') over the mesh dims that shard the rows."""
    grad_out, x, shape, mean, rstd, weight, bias, mask = args
    mesh, coord = spec_of(func, args, kwargs)
    rows = _rows(x, x.dim() - len(shape), mesh.ndim)
    whole = (Replicate(),) * mesh.ndim
    outs = func(*(_local(t, mesh, coord, rows) for t in (grad_out, x)), shape,
                *(_local(t, mesh, coord, rows) for t in (mean, rstd)),
                _local(weight, mesh, coord, whole), _local(bias, mesh, coord, whole), mask)
    metas = global_meta(func, args, kwargs)
    summed = tuple(Partial("sum") if type(p) is Shard else Replicate() for p in rows)
    return tuple(
        None if o is None else wrap_out(o, m, mesh, rows if i == 0 else summed, coord)
        for i, (o, m) in enumerate(zip(outs, metas))
    )
