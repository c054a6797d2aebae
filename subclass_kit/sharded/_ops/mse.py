"""``mse_loss`` and its backward as one local op where nothing moves (the operands, and the
per-element gradient, on the same placements, none Partial): each rank runs the loss on its
shards; a reduced loss over shards split between ranks is the local sum (over the global count
for ``'mean'``), a ``Partial('sum')``; where every element is on each rank the local loss is the loss. Any other layout runs torch's decomposition step by step
(``decompose``), which redistributes as each step's rule says.
"""

from __future__ import annotations

import math

import torch

from ... import _compat
from ..placements import Partial
from ..tensor import ShardedTensor, placements_of
from ._common import TensorMeta, aten, fast_plan, global_meta, planned, spec_of

__all__ = ["mse_loss"]

_NONE, _MEAN, _SUM = 0, 1, 2


def _decide(func, args, kwargs):
    backward = func is aten.mse_loss_backward.default
    g = args[0] if backward else None
    x, y = (args[1], args[2]) if backward else (args[0], args[1])
    reduction = (args[3] if len(args) > 3 else kwargs.get("reduction", _MEAN)) if backward else (
        args[2] if len(args) > 2 else kwargs.get("reduction", _MEAN))
    if kwargs or type(x) is not ShardedTensor or type(y) is not ShardedTensor or x.shape != y.shape:
        return None
    pl = placements_of(x)
    if placements_of(y) != pl or any(p.is_partial() for p in pl):
        return None
    if backward:
        # The incoming gradient: per element on the operands' placements, or a whole scalar.
        gpl = placements_of(g) if type(g) is ShardedTensor else None
        if reduction == _NONE and gpl != pl:
            return None
        if reduction != _NONE and not (gpl is None or all(q.is_replicate() for q in gpl)):
            return None
    mesh, coord = spec_of(func, args, kwargs)
    meta = global_meta(func, args, kwargs)
    if type(meta) is not TensorMeta:
        return None
    out_pl = pl if backward or reduction == _NONE else tuple(Partial("sum") if p.is_shard() else p for p in pl)
    fp = fast_plan(func, meta, mesh, out_pl, coord)
    if fp is None:
        return None
    if any(p.is_shard() and mesh.shape[i] > 1 for i, p in enumerate(pl)):
        local_red = _NONE if reduction == _NONE else _SUM
        scale = 1.0 / math.prod(x.shape) if reduction == _MEAN else None
    else:
        # Every element is on this rank (Replicate, or shards of one rank): the local loss
        # is the loss, in the op's own reduction.
        local_red, scale = reduction, None
    return _compat.fast_op(func), fp[1], local_red, scale, backward


_plan = planned(_decide)


@ShardedTensor.implements(aten.mse_loss.default, aten.mse_loss_backward.default)
def mse_loss(func, types, args, kwargs):
    """The loss on each rank's shards; see the module docstring for the rule."""
    p = _plan(func, args, kwargs)
    if p is None:
        return _compat.decomposition(func)(*args, **kwargs)
    op, make, red, scale, backward = p
    if backward:
        g = args[0]
        r = op(g.local if type(g) is ShardedTensor else g, args[1].local, args[2].local, red)
    else:
        r = op(args[0].local, args[1].local, red)
    return make(r if scale is None else r * scale)
