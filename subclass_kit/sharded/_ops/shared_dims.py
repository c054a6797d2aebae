"""Ops whose operands share dims, as the subscripts of an einsum: a per-sample loss's batch
(the margin losses, ``ctc_loss``), the rows of ``cdist``'s two point sets, the features of
``bilinear``'s ``_trilinear``, a float8 ``_scaled_mm``'s rows and columns, the columns of an
``embedding_bag`` table.

Each op's entry in ``shared_dims_table.RULES`` gives its shared dims, each an ``Along``:
where the dim sits in each operand that carries it and in each result. This module turns an
entry into a plan and runs it. Per mesh dim the rule is:

- when a carrying operand is sharded on a shared dim (the first such dim decides; each dim
  on one mesh dim at most), every carrying operand is laid out the same way (a plain or
  Replicate operand cut locally), the others are used whole on that mesh dim, and each rank
  runs the op on its locals: a result that has the dim keeps the shard, a result summed over
  it is a ``Partial('sum')``, a result that does not see it is Replicate;
- otherwise, when the op is linear in one argument, the others fixed (a backward in its
  incoming gradient, ``_trilinear`` in each operand), a ``Partial('sum'/'avg')`` of that
  argument passes through to the result, unreduced;
- otherwise every operand is made whole on that mesh dim (shards gathered, Partials
  reduced) and the result is Replicate.

A loss whose ``reduction='mean'`` averages over the batch (the first shared dim) runs with
``'sum'`` on each rank's samples, scaled by the global count: a ``Partial('sum')`` of the
mean, exact for uneven shards; its backward, run the same way, gives each sample's gradient.
"""

from __future__ import annotations

import torch

from .._layout import chunk_size, chunk_start, local_shape
from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from .shared_dims_table import RULES, SAME, SUMMED, Along, _MEAN, _SUM, _reduction
from ._common import TensorMeta, aten, global_meta, move, move_plain, planned, spec_of, unsupported, wrap_out

__all__ = ["shared_dims"]

_SEQ = (list, tuple)


# ---- the plan ---------------------------------------------------------------------------------
def _at(args, key):
    return args[key[0]][key[1]] if type(key) is tuple else args[key]


def _tensor_keys(args) -> list:
    keys: list = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            keys.append(i)
        elif type(a) in _SEQ:
            keys += [(i, j) for j, b in enumerate(a) if isinstance(b, torch.Tensor)]
    return keys


def _moved(args, moves, mesh, coord) -> list:
    """``args`` with each ``(key, target)`` of ``moves`` moved (a list argument copied)."""
    new = list(args)
    for key, target in moves:
        a = _at(args, key)
        local = move(a, target) if type(a) is ShardedTensor else move_plain(a, mesh, coord, target)
        if type(key) is tuple:
            i, j = key
            if type(new[i]) is not list or new[i] is args[i]:
                new[i] = list(new[i])
            new[i][j] = local
        else:
            new[key] = local
    return new


def _fits(along: Along, args, k: int) -> bool:
    """Whether every carrying operand has the dim at one size that every one of ``k`` ranks
    gets a non-empty chunk of (torch's kernels refuse some empty inputs)."""
    sizes = {_at(args, i).shape[d] for i, d in along.args.items() if isinstance(_at(args, i), torch.Tensor)}
    if len(sizes) != 1:
        return False
    return chunk_size(next(iter(sizes)), k, k - 1) > 0


def _linear_partial(p) -> bool:
    return p.is_partial() and getattr(p, "op", None) in ("sum", "avg")


def _decide(func, args, kwargs):
    rule = RULES[func]
    mesh, coord = spec_of(func, args, kwargs)
    shared = rule.dims(args, kwargs)
    meta = global_meta(func, args, kwargs) if rule.meta is None else rule.meta(args, kwargs)
    metas = tuple(meta) if type(meta) in _SEQ else (meta,)
    tensors = _tensor_keys(args)
    whole = Replicate()
    targets = {i: [] for i in tensors}
    outs: list = [[] for _ in metas]
    used: list = []
    for m in range(mesh.ndim):
        pick = next(
            (j for j, s in enumerate(shared) if j not in used and _fits(s, args, mesh.shape[m])
             and any(type(_at(args, i)) is ShardedTensor and placements_of(_at(args, i))[m].is_shard(d)
                     for i, d in s.args.items())),
            None,
        )
        if pick is not None:
            used.append(pick)
            s = shared[pick]
            for i in tensors:
                targets[i].append(Shard(s.args[i]) if i in s.args else whole)
            for r, d in enumerate(s.results):
                outs[r].append(Partial("sum") if d == SUMMED else whole if d == SAME else Shard(d))
            continue
        # No shard stays: a pending sum of the one argument the op is linear in passes through.
        pending = [i for i in tensors
                   if type(_at(args, i)) is ShardedTensor and placements_of(_at(args, i))[m].is_partial()]
        p = placements_of(_at(args, pending[0]))[m] if len(pending) == 1 else None
        if len(metas) == 1 and pending and pending[0] in rule.linear and _linear_partial(p):
            for i in tensors:
                targets[i].append(p if i == pending[0] else whole)
            outs[0].append(p)
            continue
        for i in tensors:
            targets[i].append(whole)
        for o in outs:
            o.append(whole)
    moves = tuple((i, tuple(t)) for i, t in targets.items())
    cut = None
    if rule.lists and 0 in used:
        # This rank's samples: the batch is sharded on one mesh dim (each dim on one at most).
        m = used.index(0)
        n, k = len(args[rule.lists[0]]), mesh.shape[m]
        start = chunk_start(n, k, coord[m])
        cut = (rule.lists, start, start + chunk_size(n, k, coord[m]))
    scale = None
    if rule.mean is not None and 0 in used and _reduction(args, kwargs, rule.mean[0]) == _MEAN:
        # The batch is sharded: each rank sums its samples' losses; over the global count.
        i, d = next(iter(shared[0].args.items()))
        scale = (rule.mean[0], rule.mean[1], 1.0 / _at(args, i).shape[d])
    return meta, moves, tuple(tuple(o) for o in outs), mesh, coord, scale, cut


_plan = planned(_decide)


@ShardedTensor.implements(*RULES)
def shared_dims(func, types, args, kwargs):
    """Run the op on each rank's locals along the shared dims; see the module docstring."""
    first = RULES[func].first
    if first is not None:
        res = first(func, args, kwargs)
        if res is not None:
            return res
    meta, moves, outs, mesh, coord, scale, cut = _plan(func, args, kwargs)
    new = _moved(args, moves, mesh, coord)
    if cut is not None:
        at, start, stop = cut
        for i in at:
            new[i] = list(args[i][start:stop])
    if scale is not None:
        at, scaled, factor = scale
        if at < len(new):
            new[at] = _SUM
        else:
            kwargs = {**kwargs, "reduction": _SUM}
    if kwargs:
        kwargs = {k: move(v, (Replicate(),) * mesh.ndim) if type(v) is ShardedTensor else v for k, v in kwargs.items()}
    res = func(*new, **kwargs)
    many = type(res) in _SEQ
    res = list(res) if many else [res]
    if any(isinstance(r, torch.Tensor) and r.layout is not torch.strided for r in res):
        unsupported(func, args, kwargs, "its result is sparse, and a ShardedTensor holds dense strided shards;")
    if scale is not None:
        for r in scale[1]:
            res[r] = res[r] * scale[2]
    metas = meta if many else (meta,)
    for r, fill in RULES[func].pad.items():
        res[r] = _pad_to(res[r], metas[r], mesh, outs[r], coord, fill)
    out = [wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r for r, m, pl in zip(res, metas, outs)]
    return type(meta)(out) if many else out[0]


def _pad_to(local, meta: TensorMeta, mesh, placements, coord, fill) -> torch.Tensor:
    """``local`` grown (at the end of each short dim, with ``fill``) to this rank's part of
    the global ``meta``."""
    want = local_shape(meta.shape, placements, mesh.shape, coord)
    if tuple(local.shape) == tuple(want):
        return local
    out = local.new_full(want, fill)
    out[tuple(slice(0, n) for n in local.shape)] = local
    return out


# ---- lengths as tensors -----------------------------------------------------------------------
@ShardedTensor.implements(aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor)
def ctc_lengths(func, types, args, kwargs):
    """``_ctc_loss`` (and its backward) with the lengths as tensors: read (a ShardedTensor's
    whole, a few ints per sample) into the int-list overload, whose rule cuts them with the
    batch. (torch has no meta kernel for either: the shapes follow the lengths' values.)"""
    lengths = (2, 3) if func is aten._ctc_loss.Tensor else (3, 4)
    new = list(args)
    for i in lengths:
        t = new[i]
        if type(t) is ShardedTensor:
            t = move(t, (Replicate(),) * len(placements_of(t)))
        new[i] = t.tolist()
    op = aten._ctc_loss.default if func is aten._ctc_loss.Tensor else aten._ctc_loss_backward.default
    return op(*new, **kwargs)
