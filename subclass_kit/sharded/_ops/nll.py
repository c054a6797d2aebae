"""``nll_loss`` (``nll_loss2d`` too, and so ``cross_entropy``, which is ``log_softmax`` then ``nll_loss``) and its
backward, with the batch dim (or ``nll_loss2d``'s spatial dims) sharded: no gather (DTensor's rule).

Per mesh dim where the input's batch dim (dim 0), or a spatial dim of ``nll_loss2d``'s
``(N, C, H, W)``, is sharded, each rank runs the loss on its rows with its targets (moved to
the same shard: the target's dim is one less), the class weight whole:

- ``reduction='none'``: the per-row losses keep the shard;
- ``'sum'``: the local sum is a ``Partial('sum')``, as is the total weight;
- ``'mean'``: the local sum over the all-reduced total weight (one scalar all-reduce) is a
  ``Partial('sum')`` of the mean; the total weight is Replicate.

A shard of the class dim is gathered first and a Partial input reduced first (the loss is not
linear in a log-probability row's placement of its target); the backward is row-local in the
same way, given the forward's total weight.
"""

from __future__ import annotations

import torch

from ..placements import Partial, Replicate, Shard
from .._redistribute import redistribute_local
from ..tensor import ShardedTensor, placements_of
from ._common import (TensorMeta, aten, fast_plan, global_meta, move, move_args, on_locals, planned, runner,
                      spec_of, stays, wrap_out)

__all__ = ["nll_loss"]

_NONE, _MEAN, _SUM = 0, 1, 2


def _decide(func, args, kwargs):
    backward = func in _BACKWARD
    mesh, coord = spec_of(func, args, kwargs)
    x = args[1] if backward else args[0]
    reduction = args[4] if backward else args[3]
    cur = placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * mesh.ndim
    batched = x.dim() >= 2  # (N, C) or nll_loss2d's (N, C, H, W): dim 0 is the batch
    rows = tuple(p if batched and p.is_shard() and (p.dim == 0 or (type(p) is Shard and p.dim >= 2)) else Replicate()
                 for p in cur)
    whole = (Replicate(),) * mesh.ndim
    # the target (and a per-element loss) is (N, H, W): the input's shard, past the class dim
    target_rows = tuple(Shard(p.dim - 1) if type(p) is Shard and p.dim >= 2 else p for p in rows)
    split = tuple(Partial("sum") if p.is_shard() else Replicate() for p in rows)
    per_row = reduction == _NONE and batched
    meta = global_meta(func, args, kwargs)
    if backward:
        # grad_output, self, target, weight, reduction, ignore_index, total_weight
        moves = ((0, target_rows if per_row else whole), (1, rows), (2, target_rows), (3, whole), (6, whole))
        outs = (rows,)
    else:
        moves = ((0, rows), (1, target_rows), (2, whole))
        out_pl = target_rows if reduction == _NONE else split
        outs = (out_pl, whole if reduction == _MEAN else split)
    # Rows split over more than one rank: a mean needs the global total weight. A mesh dim
    # of one rank holds every row, so its local mean is the mean (no all-reduce, no division).
    sharded = any(p.is_shard() and mesh.shape[i] > 1 for i, p in enumerate(rows))
    fast = None
    if not kwargs and all(stays(args[i], t) for i, t in moves):
        # Nothing moves: the op on the locals, the results built from what the plan knows.
        if backward:
            fp = fast_plan(func, meta, mesh, outs[0], coord, args)
            fast = None if fp is None else on_locals(*fp, args)
        elif sharded and reduction == _MEAN:
            fast = _mean_of_shards(func, meta, mesh, outs, coord)
        else:
            fast = runner(func, meta, mesh, outs, coord, args)
    return meta, moves, outs, mesh, coord, sharded, fast


def _mean_of_shards(func, meta, mesh, outs, coord):
    """The sharded mean's fast path: each rank's sum, one scalar all-reduce of the total
    weight, each rank's share of the mean (as the handler's general path)."""
    fps = [fast_plan(func, m, mesh, pl, coord) for m, pl in zip(meta, outs)]
    if any(fp is None for fp in fps):
        return None
    op, make_loss, make_total = fps[0][0], fps[0][1], fps[1][1]
    split, whole = outs

    def run(args):
        local = [a.local if type(a) is ShardedTensor else a for a in args]
        local[3] = _SUM
        total_sum, total = op(*local)
        total_all = redistribute_local(total, mesh, coord, split, whole, ())
        return make_loss(total_sum / total_all), make_total(total_all)

    return run


_plan = planned(_decide)
_FORWARD = {aten.nll_loss_forward.default, aten.nll_loss2d_forward.default}
_BACKWARD = {aten.nll_loss_backward.default, aten.nll_loss2d_backward.default}


@ShardedTensor.implements(*_FORWARD, *_BACKWARD)
def nll_loss(func, types, args, kwargs):
    """The loss on each rank's rows; see the module docstring for the rule."""
    meta, moves, outs, mesh, coord, sharded, fast = _plan(func, args, kwargs)
    if fast is not None:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    if func in _FORWARD and sharded and args[3] == _MEAN:
        total_sum, total = func(new[0], new[1], new[2], _SUM, *new[4:])
        # One scalar all-reduce: the global total weight, then each rank's share of the mean.
        total_pl = outs[0]
        total_all = move(wrap_out(total, meta[1], mesh, total_pl, coord), outs[1])
        res: tuple = (total_sum / total_all, total_all)
    elif func in _FORWARD:
        res = func(*new, **kwargs)
    else:
        res = (func(*new, **kwargs),)
    out = tuple(wrap_out(r, m, mesh, pl, coord) for r, m, pl in zip(res, meta if type(meta) is tuple else (meta,), outs))
    return out if func in _FORWARD else out[0]
