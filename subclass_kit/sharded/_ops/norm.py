"""Normalizations over trailing dims (``layer_norm``, ``rms_norm``) and their backward, and
``group_norm`` (per-sample statistics) with its backward.

Each op is one entry of ``_NORMS``: which arguments are activations (the input's shape),
statistics (the input's shape with the normalized dims kept as 1), parameters (the
normalized shape), and what each result is. Per mesh dim, the rule is DTensor's:

- a shard on a dim that is not normalized (batch, sequence) stays -- the statistics are per
  row, so each rank normalizes its rows alone (SequenceParallel's LayerNorm);
- a shard on a normalized dim is gathered first, a Partial reduced first;
- parameters are used whole; their gradients are sums over the rows, so where the rows are
  sharded a parameter's gradient is ``Partial('sum')``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of, spec
from ._common import TensorMeta, aten, global_meta, move_args, planned, runner, spec_of, stays, wrap_out

__all__ = ["normalize", "group_normalize"]


class _Norm(NamedTuple):
    ns: int  # position of normalized_shape
    act: tuple  # positions of activation-shaped arguments (the first decides the layout)
    stat: tuple  # positions of per-row statistics
    param: tuple  # positions of parameters (normalized-shaped)
    outs: tuple  # per result: "act", "stat" or "grad" (a parameter's gradient)


_NORMS = {
    aten.native_layer_norm.default: _Norm(1, (0,), (), (2, 3), ("act", "stat", "stat")),
    aten.native_layer_norm_backward.default: _Norm(2, (1, 0), (3, 4), (5, 6), ("act", "grad", "grad")),
    aten._fused_rms_norm.default: _Norm(1, (0,), (), (2,), ("act", "stat")),
    aten._fused_rms_norm_backward.default: _Norm(2, (1, 0), (3,), (4,), ("act", "grad")),
}


def _decide(func, args, kwargs):
    rule = _NORMS[func]
    mesh, coord = spec_of(func, args, kwargs)
    x = args[rule.act[0]]
    nd = x.dim()
    first = nd - len(args[rule.ns])
    cur = placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * mesh.ndim
    rows = tuple(p if p.is_shard() and p.dim < first else Replicate() for p in cur)
    whole = (Replicate(),) * mesh.ndim
    grads = tuple(Partial("sum") if p.is_shard() else Replicate() for p in rows)
    moves = [(i, rows) for i in (*rule.act, *rule.stat)] + [(i, whole) for i in rule.param]
    outs = tuple({"act": rows, "stat": rows, "grad": grads}[k] for k in rule.outs)
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and all(stays(args[i], t) for i, t in moves):
        # Nothing moves: the op on the locals, each result built from what the plan knows.
        fast = runner(func, meta, mesh, outs, coord, args)
    return meta, tuple(moves), outs, mesh, coord, fast


_plan = planned(_decide)


@ShardedTensor.implements(*_NORMS)
def normalize(func, types, args, kwargs):
    """Normalize each rank's rows; see the module docstring for the rule."""
    meta, moves, outs, mesh, coord, fast = _plan(func, args, kwargs)
    if fast is not None:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    res = func(*new, **kwargs)
    return tuple(
        None if r is None else wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r
        for r, m, pl in zip(res, meta, outs)
    )


# ---- group_norm: statistics per sample and group, so a batch shard needs no communication ---
_GROUP = {
    # op: (activation positions, statistic positions, parameter positions, N position, results)
    aten.native_group_norm.default: ((0,), (), (1, 2), 3, ("act", "stat", "stat")),
    aten.native_group_norm_backward.default: ((0, 1), (2, 3), (4,), 5, ("act", "grad", "grad")),
}


def _decide_group(func, args, kwargs):
    acts, stats, params, _, kinds = _GROUP[func]
    mesh, coord = spec_of(func, args, kwargs)
    x = args[acts[-1]]
    cur = placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * mesh.ndim
    rows = tuple(p if p.is_shard(0) else Replicate() for p in cur)
    whole = (Replicate(),) * mesh.ndim
    grads = tuple(Partial("sum") if p.is_shard() else Replicate() for p in rows)
    moves = tuple((i, rows) for i in (*acts, *stats)) + tuple((i, whole) for i in params)
    outs = tuple({"act": rows, "stat": rows, "grad": grads}[k] for k in kinds)
    return global_meta(func, args, kwargs), moves, outs, mesh, coord


_group_plan = planned(_decide_group)


@ShardedTensor.implements(*_GROUP)
def group_normalize(func, types, args, kwargs):
    """Group norm of each rank's samples (a shard of the batch stays, no communication); a
    shard of another dim is gathered first; the weight and bias gradients are
    ``Partial('sum')`` over the mesh dims that shard the batch."""
    meta, moves, outs, mesh, coord = _group_plan(func, args, kwargs)
    new = move_args(args, moves, mesh, coord)
    n_at = _GROUP[func][3]
    new[n_at] = new[_GROUP[func][0][-1]].shape[0]  # N: this rank's samples
    res = func(*new, **kwargs)
    return tuple(
        None if r is None else wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r
        for r, m, pl in zip(res, meta, outs)
    )
