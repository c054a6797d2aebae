"""Matrix products: ``mm``, ``addmm``, ``bmm``, ``baddbmm`` (and so ``nn.Linear``, whose ``F.linear``
decomposes into ``t`` + ``addmm``, or ``view`` + ``mm`` for batched input).

Each product is described by index labels, ``mm`` as ``nk,km->nm``. Per mesh dim the
output placement follows from the operands':

====================  =====================  =====================
a                     b                      output
====================  =====================  =====================
Shard(n)              Replicate              Shard(n)
Replicate             Shard(m)               Shard(m)   (Colwise: weight rows)
Shard(k)              Shard(k)               Partial    (Rowwise: a reduction pending)
Shard(batch)          Shard(batch)           Shard(batch)
Partial               Replicate              Partial
Replicate             Partial                Partial
Replicate             Replicate              Replicate
====================  =====================  =====================

When the operands match no row, the cheapest row is chosen by the cost of moving them
(chunking a replicated operand is free, a gather moves the tensor once, an all-reduce twice,
weighted by size), as DTensor's strategy selection does. ``addmm``'s bias follows the
output: chunked to match a Shard, zero-masked to join a Partial.

The bias of ``addmm`` and ``baddbmm`` (beta != 0) enters the choice too, as one more operand
moved to the row's output placement, and then the row with the fewest collectives wins (then
the least volume): ``baddbmm`` of ``S(1), S(1), S(1)`` gathers ``batch2`` once and keeps the
rows sharded, where ``bmm`` alone would pick a ``Partial`` to reduce before the add.
When even the cheapest row would move ``self`` through a collective (or beta is 0, so
``self`` is ignored) it runs as torch's decomposition instead (``bmm``, then the pointwise
rules), which reduces the product straight into ``self``'s shard.
"""

from __future__ import annotations

import math

from ..placements import Partial, Replicate, Shard
from .._redistribute import cost
from ..tensor import ShardedTensor, placements_of, spec
from ._common import aligned, aten, global_meta, move, move_plain, fast_plan, on_locals, planned, spec_of, wrap_out
from .decompose import decomposed

__all__ = ["mm", "addmm", "bmm", "baddbmm", "strategy"]

_MM = (("n", "k"), ("k", "m"), ("n", "m"))
_BMM = (("b", "n", "k"), ("b", "k", "m"), ("b", "n", "m"))


def _rows(labels) -> list:
    a_lab, b_lab, o_lab = labels
    rows = [
        (Replicate(), Replicate(), Replicate()),
        (Partial("sum"), Replicate(), Partial("sum")),
        (Replicate(), Partial("sum"), Partial("sum")),
        (Partial("avg"), Replicate(), Partial("avg")),
        (Replicate(), Partial("avg"), Partial("avg")),
    ]
    for lab in dict.fromkeys(a_lab + b_lab):
        sa = Shard(a_lab.index(lab)) if lab in a_lab else Replicate()
        sb = Shard(b_lab.index(lab)) if lab in b_lab else Replicate()
        so = Shard(o_lab.index(lab)) if lab in o_lab else Partial("sum")
        rows.append((sa, sb, so))
    return rows


_ROWS = {_MM: _rows(_MM), _BMM: _rows(_BMM)}
# labels and the position of the first matrix operand, per op
_SHAPES = {aten.mm.default: (_MM, 0), aten.addmm.default: (_MM, 1), aten.bmm.default: (_BMM, 0),
           aten.baddbmm.default: (_BMM, 1)}


def _weight(t) -> float:
    n = math.prod(t.shape) if all(type(s) is int for s in t.shape) else None
    return float(n) if n else 1.0


def _placements(x, m: int) -> tuple:
    return placements_of(x) if type(x) is ShardedTensor else (Replicate(),) * m


def _bias_target(bias_pl, bias_shape, out_shape, so):
    # The bias follows the output's placement; one already Partial alike stays.
    t = aligned(bias_shape, out_shape, (so,))[0]
    return bias_pl if bias_pl.is_partial() and bias_pl == t else t


def strategy(labels, a, b, mesh_ndim: int, bias=None, out_shape=()):
    """Per mesh dim, the cheapest ``(a, b, out)`` placement row for ``a @ b`` (counting the
    move of ``bias``, added to the product of shape ``out_shape``, when given).

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, Shard, Replicate, MeshRef
        >>> m = MeshRef.local()
        >>> x, w = distribute(torch.ones(2, 3), m, [Shard(1)]), distribute(torch.ones(3, 4), m, [Shard(0)])
        >>> strategy(_MM, x, w, 1)
        ((Shard(1),), (Shard(0),), (Partial('sum'),))
    """
    pa, pb = _placements(a, mesh_ndim), _placements(b, mesh_ndim)
    wa, wb = _weight(a), _weight(b)
    if bias is not None:
        pc, wc, bias_shape = _placements(bias, mesh_ndim), _weight(bias), tuple(bias.shape)
    ta, tb, to = [], [], []
    # One tensor dim is sharded by one mesh dim only: a row that shards a dim of an operand
    # or of the output an earlier mesh dim already shards is skipped (else a contraction
    # label picked on two mesh dims would shard k twice: wrong values).
    taken: tuple = (set(), set(), set())
    for i in range(mesh_ndim):
        best = None
        for sa, sb, so in _ROWS[labels]:
            if any(p.is_shard() and p.dim in t for p, t in zip((sa, sb, so), taken)):
                continue
            moves = [(cost(pa[i], sa), wa), (cost(pb[i], sb), wb)]
            if bias is not None:
                moves.append((cost(pc[i], _bias_target(pc[i], bias_shape, out_shape, so)), wc))
            volume, n = sum(m * w for m, w in moves), sum(m >= 1 for m, _ in moves)
            # Counting the bias, the fewest collectives first (each is a launch and a sync:
            # one gather of the bias beats two smaller moves of the operands), then volume.
            c = (n, volume) if bias is not None else (volume,)
            if best is None or c < best[0]:
                best = (c, sa, sb, so)
        assert best is not None  # the all-Replicate row is never skipped
        _, sa, sb, so = best
        for p, t in zip((sa, sb, so), taken):
            if p.is_shard():
                t.add(p.dim)
        ta.append(sa)
        tb.append(sb)
        to.append(so)
    return tuple(ta), tuple(tb), tuple(to)


def _operand(x, mesh, coord, target):
    return move(x, target) if type(x) is ShardedTensor else move_plain(x, mesh, coord, target)


def _plan(func, args, kwargs):
    labels, a_idx = _SHAPES[func]
    mesh, coord = spec_of(func, args, kwargs)
    meta = global_meta(func, args, kwargs)
    beta_zero = a_idx == 1 and kwargs.get("beta", 1) == 0  # the bias is ignored
    if beta_zero and func is aten.baddbmm.default:
        return _DECOMPOSE
    with_bias = a_idx == 1 and not beta_zero
    ta, tb, out_pl = strategy(labels, args[a_idx], args[a_idx + 1], mesh.ndim,
                              args[0] if with_bias else None, tuple(meta.shape))
    tbias = None
    if a_idx == 1:
        bias = args[0]
        tbias = aligned(tuple(bias.shape), meta.shape, out_pl)
        if type(bias) is ShardedTensor:
            # A bias already Partial alike stays; any other joins a Partial as a masked term.
            cur = placements_of(bias)
            tbias = tuple(c if p.is_partial() and c == p else p for p, c in zip(tbias, cur))
            if func is aten.baddbmm.default and any(cost(c, p) >= 1 for c, p in zip(cur, tbias)):
                return _DECOMPOSE
    fast = None
    if tbias is None and not kwargs and _stays(args[a_idx], ta) and _stays(args[a_idx + 1], tb):
        fast = fast_plan(func, meta, mesh, out_pl, coord, args)
        if fast is not None:
            fast = on_locals(*fast, args)
    return fast, ta, tb, tbias, out_pl, meta, mesh, coord


# baddbmm's plan when its own would move self through a collective: torch's decomposition.
_DECOMPOSE = ("decompose",)


def _stays(x, target) -> bool:
    """True when ``x`` is used as it is under ``target`` (no communication, no copy)."""
    if type(x) is ShardedTensor:
        return placements_of(x) == target
    return all(p.is_replicate() for p in target)


_planned = planned(_plan)


def _product(func, args, kwargs):
    plan = _planned(func, args, kwargs)
    if plan is _DECOMPOSE:
        return decomposed(func, (), args, kwargs)
    if plan[0] is not None:
        return plan[0](args)
    _, ta, tb, tbias, out_pl, meta, mesh, coord = plan
    a_idx = _SHAPES[func][1]
    new = list(args)
    new[a_idx] = _operand(args[a_idx], mesh, coord, ta)
    new[a_idx + 1] = _operand(args[a_idx + 1], mesh, coord, tb)
    if tbias is not None:
        new[0] = _operand(args[0], mesh, coord, tbias)
    return wrap_out(func(*new, **kwargs), meta, mesh, out_pl, coord)


@ShardedTensor.implements(aten.mm.default)
def mm(func, types, args, kwargs):
    """``a @ b`` on shards (see the table in the module docstring)."""
    return _product(func, args, kwargs)


@ShardedTensor.implements(aten.addmm.default)
def addmm(func, types, args, kwargs):
    """``beta * bias + alpha * (a @ b)``; the bias follows the product's placements."""
    return _product(func, args, kwargs)


@ShardedTensor.implements(aten.bmm.default)
def bmm(func, types, args, kwargs):
    """Batched ``a @ b``; a shared batch shard stays sharded."""
    return _product(func, args, kwargs)


@ShardedTensor.implements(aten.baddbmm.default)
def baddbmm(func, types, args, kwargs):
    """``beta * self + alpha * bmm(batch1, batch2)``; the plan counts moving ``self``."""
    return _product(func, args, kwargs)
