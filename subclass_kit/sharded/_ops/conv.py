"""Convolutions (``convolution``, 1d/2d/3d, transposed, grouped) and their backward.

Per mesh dim the rule is one of three layouts, chosen from the arguments' placements:

- ``batch``: the input is batched (it has the weight's ndim) and sharded on dim 0 (for the
  backward: the input or the incoming gradient is) -- each rank convolves its samples with
  the whole weight and bias, no communication; the output and the input's gradient are
  ``Shard(0)``, the weight's and bias's gradients ``Partial('sum')`` (sums over samples);
- ``out``: the input is not batch-sharded there, and the weight is sharded on its
  out-channels (dim 0, dim 1 of a transposed weight) with ``groups == 1`` -- each rank
  computes its output channels from the whole input, no communication for a Replicate
  input; the output is sharded on the channel dim, the bias is cut to match (a Replicate or
  plain bias locally), the input's gradient is ``Partial('sum')`` (a sum over the
  out-channels), the weight's and bias's gradients keep the weight's shard;
- otherwise everything is used whole (a shard of a channel or spatial dim of the input is
  gathered, a Partial reduced): a spatial shard would need halos and a channel shard a
  reduction of partial outputs, so correctness first. In the backward, a
  ``Partial('sum')``/``Partial('avg')`` incoming gradient passes through unreduced to every
  result (the backward is linear in it).

A layout keeps a shard only when every rank's chunk is non-empty where torch's kernels
refuse an empty one (out-channels; an empty batch chunk is fine).
"""

from __future__ import annotations

import torch

from .._layout import chunk_size
from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from ._common import (
    TensorMeta, aten, fast_plan, global_meta, move_args, on_locals, planned, runner, spec_of, stays, wrap_out,
)

__all__ = ["convolution", "convolution_backward"]

_R = Replicate()
_SUM = Partial("sum")


def _pl(a, mesh) -> tuple:
    return placements_of(a) if type(a) is ShardedTensor else (_R,) * mesh.ndim


def _layouts(mesh, x, w, transposed: bool, groups: int, extra=()) -> tuple:
    """Per mesh dim ``"batch"``, ``"out"`` or None. ``extra`` holds ``(tensor, dim)`` pairs
    whose shard also asks for a layout (the backward's incoming gradient)."""
    batched = x.dim() == w.dim()
    wdim = 1 if transposed else 0
    n_out = w.shape[wdim]
    px, pw = _pl(x, mesh), _pl(w, mesh)
    extra_pl = [(_pl(t, mesh), d) for t, d in extra]
    # One mesh dim at most shards the batch (a tensor dim is sharded by one mesh dim): the
    # input's, else the first extra operand's batch shard.
    batch_at = None
    if batched:
        batch_at = next((m for m in range(mesh.ndim) if px[m].is_shard(0)), None)
        if batch_at is None:
            batch_at = next((m for m in range(mesh.ndim)
                             if any(p[m].is_shard(0) for p, d in extra_pl if d == "batch")), None)
    res: list[str | None] = []
    for m in range(mesh.ndim):
        k = mesh.shape[m]
        if m == batch_at:
            res.append("batch")
        elif (groups == 1 and pw[m].is_shard(wdim) and chunk_size(n_out, k, k - 1) > 0
              and "out" not in res):
            res.append("out")
        else:
            res.append(None)
    return tuple(res)


def _decide_forward(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    x, w, bias = args[0], args[1], args[2]
    transposed, groups = args[6], args[8]
    lay = _layouts(mesh, x, w, transposed, groups)
    wdim = 1 if transposed else 0
    cdim = 1 if x.dim() == w.dim() else 0
    xt = tuple(Shard(0) if L == "batch" else _R for L in lay)
    wt = tuple(Shard(wdim) if L == "out" else _R for L in lay)
    bt = tuple(Shard(0) if L == "out" else _R for L in lay)
    out = tuple(Shard(0) if L == "batch" else Shard(cdim) if L == "out" else _R for L in lay)
    moves = ((0, xt), (1, wt)) + (((2, bt),) if isinstance(bias, torch.Tensor) else ())
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and all(stays(args[i], t) for i, t in moves):
        # Nothing moves (the batch-sharded input, whole weight): the op on the locals.
        fp = fast_plan(func, meta, mesh, out, coord, args)
        fast = None if fp is None else on_locals(*fp, args)
    return meta, moves, out, mesh, coord, fast


_plan_forward = planned(_decide_forward)


@ShardedTensor.implements(aten.convolution.default)
def convolution(func, types, args, kwargs):
    """Convolve each rank's samples (batch shard) or output channels (weight shard); see
    the module docstring for the rule."""
    meta, moves, out, mesh, coord, fast = _plan_forward(func, args, kwargs)
    if fast is not None:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    return wrap_out(func(*new, **kwargs), meta, mesh, out, coord)


def _linear_partial(p) -> bool:
    return p.is_partial() and getattr(p, "op", None) in ("sum", "avg")


def _decide_backward(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    go, x, w = args[0], args[1], args[2]
    transposed, groups = args[7], args[9]
    wdim = 1 if transposed else 0
    cdim = 1 if x.dim() == w.dim() else 0
    pgo = _pl(go, mesh)
    # "out" moves the incoming gradient to the channel shard: a local cut of a Replicate
    # one, at most what gathering it would cost otherwise, and the weight stays put.
    lay = _layouts(mesh, x, w, transposed, groups, extra=((go, "batch"),))
    passes = [L is None and _linear_partial(pgo[m]) for m, L in enumerate(lay)]
    got = tuple(Shard(0) if L == "batch" else Shard(cdim) if L == "out" else pgo[m] if passes[m] else _R
                for m, L in enumerate(lay))
    xt = tuple(Shard(0) if L == "batch" else _R for L in lay)
    wt = tuple(Shard(wdim) if L == "out" else _R for L in lay)
    gx = tuple(Shard(0) if L == "batch" else _SUM if L == "out" else pgo[m] if passes[m] else _R
               for m, L in enumerate(lay))
    gw = tuple(_SUM if L == "batch" else Shard(wdim) if L == "out" else pgo[m] if passes[m] else _R
               for m, L in enumerate(lay))
    gb = tuple(_SUM if L == "batch" else Shard(0) if L == "out" else pgo[m] if passes[m] else _R
               for m, L in enumerate(lay))
    moves = ((0, got), (1, xt), (2, wt))
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and "out" not in lay and all(stays(args[i], t) for i, t in moves):
        fast = runner(func, meta, mesh, (gx, gw, gb), coord, args)
    return meta, moves, (gx, gw, gb), mesh, coord, fast, "out" in lay


_plan_backward = planned(_decide_backward)


@ShardedTensor.implements(aten.convolution_backward.default)
def convolution_backward(func, types, args, kwargs):
    """The gradients of a convolution under the forward's layouts: per sample (batch shard:
    weight and bias gradients pending sums), per output channel (weight shard: the input's
    gradient a pending sum), or whole; see the module docstring."""
    meta, moves, outs, mesh, coord, fast, out_sharded = _plan_backward(func, args, kwargs)
    if fast is not None:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    if out_sharded and new[3] is not None:
        # bias_sizes is global; the local bias gradient has this rank's out-channels.
        new[3] = [new[2].shape[1 if args[7] else 0]]
    res = func(*new, **kwargs)
    return tuple(
        None if r is None else wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r
        for r, m, pl in zip(res, meta, outs)
    )
