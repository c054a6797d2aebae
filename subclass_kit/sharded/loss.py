"""``loss_parallel()``: cross entropy on logits sharded on the class dim, without gathering them.

The output projection of a tensor-parallel language model (``ColwiseParallel`` with
``output_layouts=Shard(-1), use_local_output=False``) leaves every rank with a slice of the
vocabulary. Inside ``with loss_parallel():``, ``F.cross_entropy`` (and ``nn.CrossEntropyLoss``)
on such a ShardedTensor computes the loss from the slices: one all-reduce of the row maxima
(no gradient), one of the softmax denominators and one of the target logits, each a few
numbers per row instead of the ``(tokens, vocab)`` logits. The loss is a plain tensor, the
same on every rank; its backward is local: the gradient of the logits arrives sharded like
them. As torch's ``torch.distributed.tensor.parallel.loss_parallel``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .. import collectives as _coll
from .. import _compat
from ._comm import waited
from .convert import redistribute, to_local
from .errors import PlacementError
from ._layout import chunk_size, chunk_start
from .placements import Replicate, Shard, render
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
    input: ShardedTensor, target, *, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """Cross entropy of logits sharded on the class dim (``Shard(1)``, or ``Shard(0)`` for 1-D
    logits); what ``F.cross_entropy`` runs inside :func:`loss_parallel`.

    Args:
        input: the logits, a ShardedTensor on a 1-D mesh sharded on the class dim.
        target: class indices, a plain tensor (the same on every rank) or a replicated
            ShardedTensor.
        ignore_index, reduction: as ``F.cross_entropy``.

    Returns:
        The loss as a plain tensor, equal on every rank.

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
    return _vocab_ce(input, target, ignore_index, reduction)


@_compat.allow_in_graph
def _vocab_ce(input, target, ignore_index: int, reduction: str):
    # One call node under torch.compile (AOTAutograd traces into it), so the logits'
    # placements are read here, on the traced tensor, not by dynamo.
    where = "loss_parallel cross_entropy"
    if not isinstance(input, ShardedTensor):
        raise TypeError(f"{where}: the logits must be a ShardedTensor, got {type(input).__name__}.")
    c = input._kit_ctx
    cdim = 1 if input.dim() >= 2 else 0
    if c.mesh.ndim != 1 or c.placements != (Shard(cdim),):
        raise PlacementError(
            f"{where}: logits of shape {tuple(input.shape)} with placements {render(c.placements)} "
            f"on {c.mesh}; loss_parallel needs them sharded on the class dim, placements "
            f"(Shard({cdim}),) on a 1-D mesh. Produce them with ColwiseParallel(output_layouts=Shard(-1), "
            "use_local_output=False), or redistribute."
        )
    if isinstance(target, ShardedTensor):
        target = to_local(redistribute(target, c.mesh, [Replicate()]))
    k, rank = c.mesh.size(), c.coord[0]
    group = c.mesh.group_names[0]
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
    loss = loss.masked_fill(~valid, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().to(loss.dtype)


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if not isinstance(input, ShardedTensor):
        return _ORIGINAL(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    if weight is not None or label_smoothing != 0.0 or size_average is not None or reduce is not None:
        raise NotImplementedError(
            "loss_parallel cross_entropy: weight=, label_smoothing=, size_average= and reduce= are "
            "not supported on sharded logits; use ignore_index= and reduction=, or full_tensor() "
            "the logits outside loss_parallel."
        )
    return vocab_parallel_cross_entropy(input, target, ignore_index=ignore_index, reduction=reduction)


@contextlib.contextmanager
def loss_parallel():
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
