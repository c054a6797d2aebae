"""torch's chunked ``F.linear_cross_entropy`` (the custom op that computes the loss and, in
the same pass, its gradients) with the rows sharded: no gather.

Per mesh dim where the input's rows (dim 0) are sharded, each rank runs the op on its rows
and their targets, the projection, its bias and the class weights whole:

- ``reduction='sum'``: the loss and the projection's (and bias's) gradients are
  ``Partial('sum')``, the input's gradient keeps the rows' shard;
- ``'mean'``: the same sums, each divided by the total weight of the targets (the class
  weight of every target not ignored, summed over the whole batch: one scalar all-reduce), as
  the dense op divides them.

Elsewhere (a shard of the features, a Partial input) the operands are made whole first. The
op's backward scales the gradients it returned by the incoming gradient: pointwise rules.
"""

from __future__ import annotations

import torch

from ... import _compat
from .._redistribute import redistribute_local
from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from ._common import global_meta, move_args, planned, spec_of, wrap_out

__all__ = ["chunked_linear_cross_entropy"]

_OP = _compat.chunked_linear_cross_entropy()


def _decide(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    x = args[0]
    cur = placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * mesh.ndim
    rows = tuple(p if p.is_shard(0) else Replicate() for p in cur)
    whole = (Replicate(),) * mesh.ndim
    summed = tuple(Partial("sum") if p.is_shard() else Replicate() for p in rows)
    moves = tuple((i, rows if i in (0, 2) else whole) for i in range(5) if isinstance(args[i], torch.Tensor))
    meta = global_meta(func, args, kwargs)
    # (loss, grad of input, grad of the projection, grad of its bias); an uncomputed
    # gradient is an empty placeholder: Replicate.
    outs = tuple(
        whole if 0 in m.shape and m.shape else pl
        for m, pl in zip(meta, (summed, rows, summed, summed))
    )
    sharded = any(p.is_shard() for p in rows)
    return meta, moves, outs, mesh, coord, sharded, summed


_plan = planned(_decide)


def _total_weight(target, weight, ignore_index: int):
    valid = target != ignore_index
    if weight is None:
        return valid.sum().to(torch.float64)
    return torch.where(valid, weight[target.clamp(0, weight.shape[0] - 1)], 0).sum().to(torch.float64)


def chunked_linear_cross_entropy(func, types, args, kwargs):
    """The op on each rank's rows; see the module docstring."""
    meta, moves, outs, mesh, coord, sharded, summed = _plan(func, args, kwargs)
    new = move_args(args, moves, mesh, coord)
    mean = sharded and new[5] == "mean"
    if mean:
        new[5] = "sum"
    res = list(func(*new, **kwargs))
    if mean:
        # One scalar all-reduce: the total weight of the whole batch's targets.
        local = _total_weight(new[2], new[4], new[6])
        total = redistribute_local(local, mesh, coord, summed, (Replicate(),) * mesh.ndim, ())
        res = [r if r.numel() == 0 else r / total.to(r.dtype) for r in res]
    return tuple(wrap_out(r, m, mesh, pl, coord) for r, m, pl in zip(res, meta, outs))


if _OP is not None:
    ShardedTensor.implements(_OP)(chunked_linear_cross_entropy)
