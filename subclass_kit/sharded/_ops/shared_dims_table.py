"""The table of the ``shared_dims`` family: per op, the dims its operands share, as the
subscripts of an einsum.

Each op is one entry of ``RULES``, a ``_Rule``: a function of the arguments giving its
shared dims, each an :class:`Along` -- where the dim sits in each operand that carries it,
and in each result: a dim there, ``SUMMED`` when the op sums over it, or ``SAME`` for a
result computed from the operands used whole alone (``embedding_bag``'s bag sizes) -- plus
what the plan needs beyond that: the arguments the op is linear in, a loss's ``'mean'``
reduction, per-sample int lists, the results' metadata where torch has no meta kernel, a
result padded to the global size, a layout tried first. ``shared_dims`` turns an entry into
a plan and runs it (see its docstring for the rule per mesh dim).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from .._layout import contiguous_strides
from .embedding import embedding_bag_vocab
from ._common import TensorMeta, aten

__all__ = ["Along", "SUMMED", "SAME", "RULES"]

_NONE, _MEAN, _SUM = 0, 1, 2

#: A result's entry for a dim the op sums over.
SUMMED = "summed"
#: A result's entry when it does not depend on the operands that carry the dim: the same on
#: every rank.
SAME = "same"


class Along(NamedTuple):
    """One shared dim: ``{argument position: its dim there}`` (a position in a list argument
    is ``(position, index)``), and per result its dim, ``SUMMED`` or ``SAME``."""

    args: dict
    results: tuple


class _Rule(NamedTuple):
    dims: Callable  # (args, kwargs) -> tuple of Along (empty: every operand whole)
    linear: tuple = ()  # positions of arguments the op is linear in, each with the others fixed
    # (position of the reduction argument, results scaled): a loss whose 'mean' averages over
    # the first shared dim
    mean: tuple | None = None
    # positions of int lists with one entry per sample of the first shared dim (ctc's
    # lengths): each rank passes its samples' entries
    lists: tuple = ()
    # (args, kwargs) -> the results' global metadata, for an op torch has no meta kernel for
    meta: Callable | None = None
    # {result: fill}: a result sized by this rank's data (ctc's log_alpha, by its longest
    # target) padded to the global size
    pad: dict = {}
    # (func, args, kwargs) -> the result, or None: a layout no shared dim expresses, tried
    # first (a vocab-parallel embedding_bag table)
    first: Callable | None = None


# ---- the shared dims, as functions of the arguments -------------------------------------------
def _per_sample(at: tuple, results: int, grad: int | None = None, reduction: int | None = None):
    """A loss on ``(N, ...)`` operands at positions ``at``, each sample alone: the batch dim 0.
    Its first result is per sample or, reduced, summed over the batch; further results are
    per sample. A backward's incoming gradient (``grad``) is per sample when unreduced."""

    def split(args, kwargs):
        x = args[at[0]]
        if x.dim() < 2:
            return ()  # one sample
        red = _reduction(args, kwargs, reduction) if reduction is not None else _NONE
        carried = dict.fromkeys(at, 0)
        if grad is not None and red == _NONE:
            carried[grad] = 0
        first = 0 if red == _NONE or grad is not None else SUMMED
        return (Along(carried, (first,) + (0,) * (results - 1)),)

    return split


def _reduction(args, kwargs, at: int) -> int:
    return args[at] if len(args) > at else kwargs.get("reduction", _MEAN)


def _ctc(grad: bool):
    """``_ctc_loss`` and its backward on padded targets: the batch is ``log_probs``' dim 1
    and dim 0 of the other tensors and of the lengths. Concatenated (1-D) targets are read at
    offsets summed over the whole batch: used whole."""
    at = {0: 0, 1: 1, 2: 0, 5: 0, 6: 0} if grad else {0: 1, 1: 0}

    def split(args, kwargs):
        lp, targets = (args[1], args[2]) if grad else (args[0], args[1])
        if lp.dim() != 3 or targets.dim() != 2:
            return ()
        return (Along(at, (1,) if grad else (0, 0)),)

    return split


def _contiguous(shape: tuple, dtype) -> TensorMeta:
    return TensorMeta(tuple(shape), contiguous_strides(shape), dtype, 0)


def _ctc_meta(args, kwargs):
    # No meta kernel: log_alpha's last dim follows the longest target. CPU results are
    # contiguous.
    lp, target_lengths = args[0], args[3]
    longest = max(target_lengths, default=0)
    return (_contiguous((lp.shape[1],), lp.dtype),
            _contiguous((lp.shape[1], lp.shape[0], 2 * longest + 1), lp.dtype))


def _ctc_grad_meta(args, kwargs):
    return _contiguous(tuple(args[1].shape), args[1].dtype)


def _cdist(grad: bool):
    """``_cdist_forward(x1 (*, P, M), x2 (*, R, M))`` -> ``(*, P, R)``: the batch dims, x1's
    rows, x2's rows. Its backward, the gradient of x1 ``(*, P, M)`` from ``(grad, x1, x2, cdist)``:
    the batch, x1's rows; x2's rows are summed over."""

    def split(args, kwargs):
        x1, x2 = (args[1], args[2]) if grad else (args[0], args[1])
        nd = x1.dim()
        if x2.dim() != nd or tuple(x1.shape[:-2]) != tuple(x2.shape[:-2]):
            return ()  # a broadcast batch
        if grad:
            batch = [Along({0: b, 1: b, 2: b, 4: b}, (b,)) for b in range(nd - 2)]
            return (*batch, Along({0: nd - 2, 1: nd - 2, 4: nd - 2}, (nd - 2,)),
                    Along({0: nd - 1, 2: nd - 2, 4: nd - 1}, (SUMMED,)))
        batch = [Along({0: b, 1: b}, (b,)) for b in range(nd - 2)]
        return (*batch, Along({0: nd - 2}, (nd - 2,)), Along({1: nd - 2}, (nd - 1,)))

    return split


def _trilinear(args, kwargs):
    """``_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)``: each operand unsqueezed
    at its ``expand`` dims to one rank, multiplied, summed over ``sumdim``. Each dim of that
    space is shared by the operands not expanded there; the result keeps it or sums it."""
    ops, expands, sumdim = args[:3], args[3:6], set(args[6])
    total = ops[0].dim() + len(expands[0])
    out = []
    for e in range(total):
        carried = {i: e - sum(x < e for x in expands[i]) for i in range(3) if e not in expands[i]}
        sizes = {ops[i].shape[d] for i, d in carried.items()}
        if len(sizes) != 1:
            continue  # a broadcast dim
        out.append(Along(carried, (SUMMED if e in sumdim else e - sum(x < e for x in sumdim),)))
    return tuple(out)


def _scaled_mm(args, kwargs):
    """float8 ``_scaled_mm(a (M, K), b (K, N), scale_a, scale_b, bias)``: a's rows (with a
    row-wise scale's) and b's columns (with a column-wise scale's and the bias). The
    contraction is not kept: partial products rounded to a float8 or bf16 result do not sum
    to the rounded whole."""
    a, b, sa, sb = args[:4]
    bias = args[4] if len(args) > 4 else None
    rows, cols = {0: 0}, {1: 1}
    if sa.dim() == 2 and sa.numel() > 1:
        rows[2] = 0
    if sb.dim() == 2 and sb.numel() > 1:
        cols[3] = 1
    if isinstance(bias, torch.Tensor):
        cols[4] = bias.dim() - 1
    return (Along(rows, (0,)), Along(cols, (1,)))


def _scaled_mm_v2(args, kwargs):
    """``_scaled_mm_v2(a, b, [scale_a], recipe_a, swizzle_a, [scale_b], recipe_b, swizzle_b,
    bias, ...)``: as ``_scaled_mm`` with one unswizzled scale per operand, a single number or
    one per row of a (``(M, 1)``) or column of b (``(1, N)``); other recipes (blocks) are used
    whole."""
    a, b, sa, sb = args[0], args[1], args[2], args[5]
    bias = args[8] if len(args) > 8 else None
    if len(sa) != 1 or len(sb) != 1 or any(args[4]) or any(args[7]) or (len(args) > 10 and args[10]):
        return ()
    out = []
    m, n = a.shape[0], b.shape[1]
    if sa[0].numel() == 1 or tuple(sa[0].shape) == (m, 1):
        out.append(Along({0: 0, **({(2, 0): 0} if sa[0].numel() > 1 else {})}, (0,)))
    if sb[0].numel() == 1 or tuple(sb[0].shape) == (1, n):
        cols: dict = {1: 1, **({(5, 0): 1} if sb[0].numel() > 1 else {})}
        if isinstance(bias, torch.Tensor):
            cols[8] = bias.dim() - 1
        out.append(Along(cols, (1,)))
    return tuple(out)


def _bags(carriers: tuple, mode_at: int, results: int, maxima_at: int | None = None, summed: bool = False):
    """``embedding_bag``'s table (``(V, D)``) sharded on its columns: each rank looks up and
    pools its columns, the indices and offsets whole. The operands at ``carriers`` (the table,
    a backward's incoming gradient, ``(B, D)``) carry ``D``, and in ``'max'`` mode the argmax
    per column (``maxima_at``). The forward's first result carries ``D`` (and its argmax, the
    last, in ``'max'`` mode); the bag bookkeeping between is the same on every rank. The
    per-sample weights' gradient sums over ``D`` (``summed``)."""

    def split(args, kwargs):
        mode = args[mode_at] if len(args) > mode_at else 0
        if any(args[i].dim() != 2 for i in carriers):
            return ()
        carried = dict.fromkeys(carriers, 1)
        if maxima_at is not None and mode == _MAX_MODE:
            carried[maxima_at] = 1
        if results == 4:
            return (Along(carried, (1, SAME, SAME, 1 if mode == _MAX_MODE else SAME)),)
        return (Along(carried, (SUMMED if summed else 1,)),)

    return split


_MAX_MODE = 2


def _dense_bags(args, kwargs):
    if args[9]:  # sparse=True: a sparse gradient, which a ShardedTensor cannot hold
        return ()
    return _bags((0,), 8, 1, maxima_at=5)(args, kwargs)


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


RULES = {
    _overload(k): v for k, v in {
        "multi_margin_loss": _Rule(_per_sample((0, 1), 1, reduction=5), mean=(5, (0,))),
        "multi_margin_loss_backward": _Rule(_per_sample((1, 2), 1, grad=0, reduction=6), linear=(0,), mean=(6, (0,))),
        "multilabel_margin_loss_forward": _Rule(_per_sample((0, 1), 2, reduction=2), mean=(2, (0,))),
        "multilabel_margin_loss_backward": _Rule(_per_sample((1, 2, 4), 1, grad=0, reduction=3), linear=(0,),
                                                 mean=(3, (0,))),
        "_ctc_loss": _Rule(_ctc(False), lists=(2, 3), meta=_ctc_meta, pad={1: -math.inf}),
        "_ctc_loss_backward": _Rule(_ctc(True), linear=(0,), lists=(3, 4), meta=_ctc_grad_meta),
        "_cdist_forward": _Rule(_cdist(False)),
        "_cdist_backward": _Rule(_cdist(True), linear=(0,)),
        "_trilinear": _Rule(_trilinear, linear=(0, 1, 2)),
        "_scaled_mm": _Rule(_scaled_mm),
        "_scaled_mm_v2": _Rule(_scaled_mm_v2),
        "_embedding_bag": _Rule(_bags((0,), 4, 4), first=embedding_bag_vocab),
        "_embedding_bag_forward_only": _Rule(_bags((0,), 4, 4), first=embedding_bag_vocab),
        "_embedding_bag_backward": _Rule(_dense_bags, linear=(0,)),
        "_embedding_bag_dense_backward": _Rule(_bags((0,), 7, 1, maxima_at=4), linear=(0,)),
        # the per-sample weights' gradient: a dot product over D of the gradient and the rows
        "_embedding_bag_per_sample_weights_backward": _Rule(_bags((0, 1), 5, 1, summed=True), linear=(0,)),
    }.items()
}
