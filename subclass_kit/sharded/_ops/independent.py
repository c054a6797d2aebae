"""Ops that act independently along some dims of their operands: pooling, interpolation,
padding, fft, batched linear algebra, pixel and channel shuffles, grid sampling, im2col.

Each op's entry in ``independent_table.RULES`` gives its *independent* dims -- dims it
never mixes (pooling's N and C, an fft's untransformed dims, the batch dims of a matrix op)
-- and the positions of the tensor arguments that carry them. Independent dims are counted
from the left and are the same dims, of the same size, in every carrying operand and in
every result (pooling's output keeps N and C, ``det`` keeps the batch). This module turns an
entry into a plan and runs it. Per mesh dim the rule is:

- a shard of an independent dim stays, with no communication: every carrying operand is
  laid out the same way and each rank runs the op on its locals (the shard most operands
  have decides, the first operand's on a tie; a plain or Replicate operand is cut locally);
- a shard of any other dim is gathered first (that operand, that mesh dim), a Partial is
  reduced first -- unless the op is linear in that argument, the others fixed (pooling by
  averages, interpolation, padding, fft, a backward in its incoming gradient): then a
  ``Partial('sum')`` or ``Partial('avg')`` passes through to the result, unreduced; the other
  tensor arguments (a shared matrix of a batched solve) are used whole.

A shard stays only when every rank gets a non-empty chunk (torch's kernels refuse some empty
inputs); a result that does not carry an independent dim is Replicate (an empty ``U`` of an
``svd`` without vectors). Ops that report failures in an ``info`` tensor run with
``check_errors=False`` and check the gathered ``info`` on every rank (see ``linalg_errors``).
"""

from __future__ import annotations

import torch

from ... import _compat
from .._layout import chunk_size
from ..placements import Replicate
from ..tensor import ShardedTensor, placements_of
from .generic import computed_whole
from .independent_table import RULES
from .linalg_errors import CHECKED, check_info, checked_cholesky
from ._common import TensorMeta, aten, fast_plan, global_meta, move, move_args, on_locals, planned, spec_of, wrap_out

__all__ = ["independent"]

_SEQ = (list, tuple)


# ---- the plan -----------------------------------------------------------------------------------
def _results(meta) -> tuple:
    return tuple(meta) if type(meta) in _SEQ else (meta,)


def _carried(d: int, operands, metas, k: int) -> bool:
    """Whether dim ``d`` can stay sharded over ``k`` ranks: every carrying operand has it at
    one size, every rank's chunk of it is non-empty, and every result has it too (or is
    empty, then Replicate)."""
    sizes = {a.shape[d] if a.dim() > d else None for a in operands}
    if len(sizes) != 1 or None in sizes:
        return False
    n = next(iter(sizes))
    if chunk_size(n, k, k - 1) <= 0:  # the chunks shrink towards the last rank
        return False
    return all(_has(m, d, operands[0].shape) or 0 in m.shape for m in metas if type(m) is TensorMeta)


def _linear_partial(p) -> bool:
    return p.is_partial() and getattr(p, "op", None) in ("sum", "avg")


def _has(m: TensorMeta, d: int, shape) -> bool:
    return len(m.shape) > d and m.shape[d] == shape[d]


def _shape_target(a, layout: tuple) -> tuple:
    """``layout`` for an argument read for its shape only, keeping a Partial of it where the
    layout is whole: no all-reduce of values nobody reads."""
    if type(a) is not ShardedTensor:
        return layout
    return tuple(c if c.is_partial() and p.is_replicate() else p for c, p in zip(placements_of(a), layout))


def _decide(func, args, kwargs):
    rule = RULES[func]
    mesh, coord = spec_of(func, args, kwargs)
    dims, at = rule.split(args, kwargs)
    meta = global_meta(func, args, kwargs) if rule.meta is None else rule.meta(args, kwargs)
    if meta is None:
        return None
    whole_results = {r for r, i in rule.follows if i not in at}
    metas = tuple(None if r in whole_results else m for r, m in enumerate(_results(meta)))
    operands = [args[i] for i in at if isinstance(args[i], torch.Tensor)]
    lay: list = []
    for m in range(mesh.ndim):
        # The shard of an independent dim that most carrying operands already have decides
        # this mesh dim (the fewest moves: a backward's incoming gradient laid out otherwise
        # than its input and indices); on a tie, the first operand's.
        votes: dict = {}
        for p in (placements_of(a)[m] for a in operands if type(a) is ShardedTensor):
            if p in votes:
                votes[p] += 1
            elif (p.shard_dim() in dims and not any(q.shard_dim() == p.shard_dim() for q in lay)
                  and _carried(p.shard_dim(), operands, metas, mesh.shape[m])):
                votes[p] = 1
        lay.append(max(votes, key=votes.__getitem__) if votes else Replicate())
    layout = tuple(lay)
    whole = (Replicate(),) * mesh.ndim
    # Where no shard stays, a pending sum of the argument the op is linear in stays pending.
    lin = args[rule.linear] if rule.linear is not None else None
    passes = tuple(
        type(lin) is ShardedTensor and p.is_replicate() and _linear_partial(placements_of(lin)[m])
        for m, p in enumerate(layout)
    )
    lin_target = tuple(placements_of(lin)[m] if passes[m] else p for m, p in enumerate(layout)) if any(passes) else None
    moves = tuple(
        (i, lin_target if i == rule.linear and lin_target is not None else
         _shape_target(a, layout) if i in rule.shape_only else layout if i in at else whole)
        for i, a in enumerate(args) if isinstance(a, torch.Tensor)
    )
    # A result that does not have a kept dim is empty (checked by _carried), or computed
    # from whole arguments alone: Replicate.
    outs = tuple(
        whole if m is None else
        tuple(placements_of(lin)[d] if passes[d] else
              p if p.is_replicate() or _has(m, p.shard_dim(), operands[0].shape) else Replicate()
              for d, p in enumerate(layout))
        for m in metas
    )
    kept = tuple(p.shard_dim() for p in layout if p.is_shard())
    fast = _fast_path(func, args, kwargs, meta, moves, outs, mesh, coord, rule.fix is not None and bool(kept))
    return meta, moves, outs, mesh, coord, kept, fast


def _fast_path(func, args, kwargs, meta, moves, outs, mesh, coord, fixes: bool):
    """``run(args)`` when nothing moves (the common case: the operands already on the rule's
    layout): the op's C++ callable on the locals, each result built from what the plan knows;
    else None."""
    if fixes or kwargs:
        return None
    for i, target in moves:
        a = args[i]
        if (placements_of(a) != target) if type(a) is ShardedTensor else not all(p.is_replicate() for p in target):
            return None
    if any(type(a) in _SEQ and any(type(b) is ShardedTensor for b in a) for a in args):
        return None
    makes = []
    for m, pl in zip(_results(meta), outs):
        fp = fast_plan(func, m, mesh, pl, coord) if type(m) is TensorMeta else None
        if type(m) is TensorMeta and fp is None:
            return None  # symbolic sizes
        makes.append(None if fp is None else fp[1])
    op = _compat.fast_op(func)
    if type(meta) is TensorMeta:
        return on_locals(op, makes[0], args)
    mk = tuple(makes)

    def run(args):
        res = op(*[a.local if type(a) is ShardedTensor else a for a in args])
        return type(res)(r if f is None else f(r) for r, f in zip(res, mk))

    return run


_plan = planned(_decide)


@ShardedTensor.implements(*RULES)
def independent(func, types, args, kwargs):
    """Run the op on each rank's locals along its independent dims; see the module docstring."""
    if func is aten.cholesky.default:
        # Its kernel checks the factorization itself, per rank: factor, then check the info
        # of every rank's matrices together.
        return checked_cholesky(args, kwargs)
    checking = kwargs.get("check_errors", False) and func in CHECKED
    if checking:
        kwargs = {**kwargs, "check_errors": False}
    plan = _plan(func, args, kwargs)
    if plan is None:  # shapes that depend on the values: computed on whole operands
        return computed_whole(func, types, args, kwargs)
    meta, moves, outs, mesh, coord, kept, fast = plan
    if fast is not None and not checking:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    whole = (Replicate(),) * mesh.ndim
    for i, a in enumerate(new):
        if type(a) in _SEQ and any(type(b) is ShardedTensor for b in a):  # index tensors
            new[i] = [move(b, whole) if type(b) is ShardedTensor else b for b in a]
    if kwargs:
        kwargs = {k: move(v, whole) if type(v) is ShardedTensor else v for k, v in kwargs.items()}
    rule = RULES[func]
    if rule.fix is not None and kept:
        new = rule.fix(new, kept)
    res = func(*new, **kwargs)
    if type(res) in _SEQ:
        out = type(res)(
            wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r
            for r, m, pl in zip(res, meta, outs)
        )
    else:
        out = wrap_out(res, meta, mesh, outs[0], coord)
    if checking:
        check_info(func, args, out[-1])
    return out

