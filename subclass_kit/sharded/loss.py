"""``loss_parallel()``: cross entropy on logits sharded on the class dim, without gathering them.

The output projection of a tensor-parallel language model (``ColwiseParallel`` with
``output_layouts=Shard(-1), use_local_output=False``) leaves every rank with a slice of the
vocabulary. Inside ``with loss_parallel():``, ``F.cross_entropy`` (and ``nn.CrossEntropyLoss``)
on such a ShardedTensor computes the loss from the slices: one all-reduce of the row maxima
(no gradient), one of the softmax denominators and one of the target logits, each a few
numbers per row instead of the ``(tokens, vocab)`` logits. The loss is a plain tensor, the
same on every rank; its backward is local: the gradient of the logits arrives sharded like
them. As torch's ``torch.distributed.tensor.parallel.loss_parallel``: class weights
(``weight=``) and meshes of more than one dim (the class dim sharded on one mesh dim, the
batch or sequence sharded or replicated on the others) included.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from .. import collectives as _coll
from .. import _compat
from ..ctx import ctx_of
from ._comm import waited
from .convert import redistribute, to_local
from .tensor import from_local_shape
from .errors import PlacementError
from ._layout import chunk_size, chunk_start
from .placements import Partial, Placement, Replicate, Shard, render
from .tensor import ShardedTensor

__all__ = ["loss_parallel", "vocab_parallel_cross_entropy"]

_ORIGINAL = F.cross_entropy
_DEPTH = [0]


class _SumOfReplicas(torch.autograd.Function):
    """All-reduce (sum) of per-rank operands whose result every rank uses alike: the gradient
    of each operand is the result's gradient itself (no communication)."""

    @staticmethod
    def forward(ctx, t, group: str):
        return waited(_coll.all_reduce(t.contiguous(), "sum", group))

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def vocab_parallel_cross_entropy(
    input: ShardedTensor, target: torch.Tensor, weight: torch.Tensor | None = None, *, ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross entropy of logits sharded on the class dim (dim 1, or 0 for 1-D logits); what
    ``F.cross_entropy`` runs inside :func:`loss_parallel`.

    Exactly one mesh dim (the TP dim, at any position) shards the class dim; on a 2-D or
    larger mesh every other mesh dim is ``Shard`` of another dim (batch, sequence) or
    ``Replicate``, as torch's ``loss_parallel``.

    Args:
        input: the logits, a ShardedTensor.
        target: class indices. On a 1-D mesh (or when every other mesh dim is Replicate) a
            plain tensor, the same on every rank, or a ShardedTensor; where another mesh dim
            shards the batch, a ShardedTensor laid out like the logits without the class dim
            (a plain tensor would be ambiguous: whole or this rank's part).
        weight: per-class weights (plain, the same on every rank, or a ShardedTensor).
        ignore_index, reduction: as ``F.cross_entropy``; ``"mean"`` on a 1-D mesh only.

    Returns:
        ``"none"``: a ShardedTensor laid out as the target (``Replicate()`` on a 1-D mesh), as
        torch's. ``"mean"``/``"sum"``: a plain tensor when it is the same on every rank (always
        on a 1-D mesh); otherwise a ShardedTensor with torch's placements (``"sum"``:
        ``Partial('sum')`` on the mesh dims that shard the batch).

    Raises:
        PlacementError: (a ValueError) the class dim is not sharded on exactly one mesh
            dim, another mesh dim is Partial, or a plain target where it would be ambiguous.
        NotImplementedError: ``reduction="mean"`` on a mesh of more than one dim.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, Shard, MeshRef
        >>> logits = torch.randn(4, 10)
        >>> target = torch.tensor([1, 0, 9, 3])
        >>> x = distribute(logits, MeshRef.local(), [Shard(1)])
        >>> loss = vocab_parallel_cross_entropy(x, target)
        >>> torch.allclose(loss, torch.nn.functional.cross_entropy(logits, target))
        True
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"loss_parallel cross_entropy: reduction={reduction!r}; use 'mean', 'sum' or 'none'.")
    return _vocab_ce(input, target, weight, ignore_index, reduction)


def _layout(input: ShardedTensor, cdim: int) -> tuple:
    """``(tp mesh dim, target placements, summed-loss placements)`` of class-sharded logits,
    or PlacementError."""
    where = "loss_parallel cross_entropy"
    c = ctx_of(input)
    pl = c.placements
    tp = [i for i, p in enumerate(pl) if p == Shard(cdim)]
    if len(tp) != 1:
        fix = (f"(Shard({cdim}),) on a 1-D mesh" if c.mesh.ndim == 1 else
               f"Shard({cdim}) on exactly one mesh dim, Shard of another dim or Replicate() on the others")
        raise PlacementError(
            f"{where}: logits of shape {tuple(input.shape)} with placements {render(pl)} on {c.mesh}; "
            f"loss_parallel needs them sharded on the class dim {cdim} by exactly one mesh dim "
            f"({len(tp)} do), placements {fix}. Produce them with ColwiseParallel(output_layouts=Shard(-1), "
            "use_local_output=False), or redistribute."
        )
    target_pl: list[Placement] = []
    sum_pl: list[Placement] = []
    for i, p in enumerate(pl):
        if i == tp[0] or type(p) is Replicate:
            target_pl.append(Replicate())
            sum_pl.append(Replicate())
        elif type(p) is Shard:
            # The class dim is gone from the target: dims after it move down by one.
            target_pl.append(Shard(p.dim - 1 if p.dim > cdim else p.dim))
            sum_pl.append(Partial("sum"))
        else:
            raise PlacementError(
                f"{where}: logits placements {render(pl)}: loss_parallel expects the mesh dims other "
                f"than the class-sharding one ({tp[0]}) to be Shard or Replicate, got {p!r} at mesh dim "
                f"{i}; redistribute the logits (e.g. reduce the Partial) first."
            )
    return tp[0], tuple(target_pl), tuple(sum_pl)


def _local_target(target, mesh, placements: tuple, shape: tuple):
    """This rank's part of ``target``, laid out ``placements`` (derived from the logits)."""
    if isinstance(target, ShardedTensor):
        return to_local(redistribute(target, mesh, placements))
    if any(type(p) is Shard for p in placements):
        raise PlacementError(
            f"loss_parallel cross_entropy: on {mesh} the target must be laid out {render(placements)}, "
            f"which shards it, so loss_parallel requires a ShardedTensor target (a plain tensor of shape "
            f"{tuple(target.shape)} could be the whole target or this rank's part). Wrap it with "
            "ShardedTensor.from_local(local, mesh, placements) or distribute(target, mesh, placements)."
        )
    return target


@_compat.allow_in_graph
def _vocab_ce(input, target, weight, ignore_index: int, reduction: str):
    # One call node under torch.compile (AOTAutograd traces into it), so the logits'
    # placements are read here, on the traced tensor, not by dynamo.
    where = "loss_parallel cross_entropy"
    if not isinstance(input, ShardedTensor):
        raise TypeError(f"{where}: the logits must be a ShardedTensor, got {type(input).__name__}.")
    c = ctx_of(input)
    cdim = 1 if input.dim() >= 2 else 0
    tp, target_pl, sum_pl = _layout(input, cdim)
    if reduction == "mean" and c.mesh.ndim > 1:
        raise NotImplementedError(
            f"{where}: reduction='mean' is only supported on a one-dimensional mesh, the logits live "
            f"on {c.mesh}: each rank's mean would divide by its own count. Use reduction='sum' (or "
            "'none') and divide by the global count."
        )
    target_shape = tuple(input.shape[:cdim]) + tuple(input.shape[cdim + 1:])
    target = _local_target(target, c.mesh, target_pl, target_shape)
    if isinstance(weight, ShardedTensor):
        weight = weight.full_tensor()
    k, rank = c.mesh.size(tp), c.coord[tp]
    group = c.mesh.group_names[tp]
    x = to_local(input)
    n_cls = input.shape[cdim]
    start, n = chunk_start(n_cls, k, rank), chunk_size(n_cls, k, rank)
    m = x.detach().amax(cdim, keepdim=True)
    if k > 1:
        m = waited(_coll.all_reduce(m.contiguous(), "max", group))
    z = x - m
    denom = z.exp().sum(cdim)
    shifted = target - start
    inside = (shifted >= 0) & (shifted < n)
    picked = z.gather(cdim, shifted.masked_fill(~inside, 0).unsqueeze(cdim)).squeeze(cdim)
    picked = picked.masked_fill(~inside, 0.0)
    if k > 1:
        denom = _SumOfReplicas.apply(denom, group)
        picked = _SumOfReplicas.apply(picked, group)
    loss = denom.log() - picked
    valid = target != ignore_index
    # The weight is whole on every rank: each token's class weight is a local lookup.
    w = valid.to(loss.dtype) if weight is None else weight[target.masked_fill(~valid, 0)] * valid
    loss = loss * w
    if reduction == "none":
        # Per-token losses: a ShardedTensor laid out as the target, Replicate ones included
        # (as torch's loss_parallel; the caller reduces it further).
        return from_local_shape(loss, c.mesh, target_pl, target_shape)
    if reduction == "sum":
        out, placements, shape = loss.sum(), sum_pl, ()
    else:
        return loss.sum() / w.sum()
    if all(type(p) is Replicate for p in placements):
        return out  # the same on every rank: a plain tensor
    return from_local_shape(out, c.mesh, placements, shape)


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if not isinstance(input, ShardedTensor):
        return _ORIGINAL(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    if label_smoothing != 0.0 or size_average is not None or reduce is not None:
        raise NotImplementedError(
            "loss_parallel cross_entropy: label_smoothing=, size_average= and reduce= are not "
            "supported on sharded logits; use weight=, ignore_index= and reduction=, or full_tensor() "
            "the logits outside loss_parallel."
        )
    return vocab_parallel_cross_entropy(input, target, weight, ignore_index=ignore_index, reduction=reduction)


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """Within the block, ``F.cross_entropy`` on class-sharded ShardedTensor logits computes the
    loss without gathering them (:func:`vocab_parallel_cross_entropy`); other inputs are
    unaffected. Run the backward inside the block too, as with torch's ``loss_parallel``
    (here it needs no context, but code written for torch keeps working).

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, Shard, MeshRef, loss_parallel
        >>> logits = torch.randn(3, 5, requires_grad=True)
        >>> x = distribute(logits, MeshRef.local(), [Shard(1)])
        >>> with loss_parallel():
        ...     loss = torch.nn.functional.cross_entropy(x, torch.tensor([0, 4, 2]))
        >>> type(loss).__name__, loss.shape
        ('Tensor', torch.Size([]))
    """
    if _DEPTH[0] == 0:
        F.cross_entropy = _cross_entropy
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if _DEPTH[0] == 0:
            F.cross_entropy = _ORIGINAL
