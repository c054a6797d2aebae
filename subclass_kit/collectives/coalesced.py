"""Coalesced collectives: one collective call over a list of tensors, on torch's native
``_c10d_functional`` ``*_coalesced`` ops (one issue, one wait per result).

As the single-tensor ops: in eager each result is an
:class:`~subclass_kit.collectives.AsyncCollectiveTensor` that waits at first use; while
compiling, each result is ``wait_tensor`` of the op's output. Gathers concatenate along
dim 0 and reduce-scatters split dim 0 unless ``scatter_dims`` says otherwise.

They are not differentiable: an input that requires grad (with grad mode on) is an error
naming the per-tensor ``*_autograd`` variant to use instead.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _compat
from .errors import CollectiveArgumentError
from .groups import GroupLike, ReduceOpLike, resolve_group
from ._common import _check_dim, _issue_many, _reduce_op

__all__ = ["all_reduce_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"]

_ops = _compat.funcol_ops


def _inputs(tensors, where: str, alternative: str) -> list:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: takes a list of tensors, got "
            f"{type(tensors).__name__}; wrap a single tensor in a list, or call {alternative.replace('_autograd', '')}."
        )
    out = []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise CollectiveArgumentError(f"subclass_kit.collectives.{where}: tensors[{i}] is a {type(t).__name__}, not a tensor.")
        if t.requires_grad and torch.is_grad_enabled():
            raise CollectiveArgumentError(
                f"subclass_kit.collectives.{where}: tensors[{i}] requires grad, and the coalesced "
                f"collectives are not differentiable. Call {alternative} on each tensor, or pass "
                "detached tensors."
            )
        out.append(t.contiguous())
    return out


def all_reduce_coalesced(tensors: Sequence[torch.Tensor], op: ReduceOpLike, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> list:
    """Reduce every tensor of ``tensors`` over the ranks of ``group`` in one collective call.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_reduce_coalesced
        >>> [t.tolist() for t in all_reduce_coalesced([torch.ones(2), torch.ones(1)], "sum")]
        [[2.0, 2.0], [2.0]]
    """
    where = "all_reduce_coalesced"
    xs = _inputs(tensors, where, "all_reduce_autograd")
    g = resolve_group(group, mesh_dim, where=where)
    name = _reduce_op(op, where)
    return _issue_many(where, g, _ops.all_reduce_coalesced.default, xs, name, g.name)


def all_gather_into_tensor_coalesced(tensors: Sequence[torch.Tensor], group: GroupLike = None, *, mesh_dim: int | str | None = None) -> list:
    """Concatenate every rank's copy of each tensor along dim 0 (rank order), in one call.

    Example (rank 0 of a 2-rank process group):
        >>> import torch, torch.distributed as dist
        >>> from subclass_kit.collectives import all_gather_into_tensor_coalesced
        >>> r = float(dist.get_rank())
        >>> [t.tolist() for t in all_gather_into_tensor_coalesced([torch.full((1,), r), torch.full((1, 2), r)])]
        [[0.0, 1.0], [[0.0, 0.0], [1.0, 1.0]]]
    """
    where = "all_gather_into_tensor_coalesced"
    xs = _inputs(tensors, where, "all_gather_tensor_autograd")
    g = resolve_group(group, mesh_dim, where=where)
    return _issue_many(where, g, _ops.all_gather_into_tensor_coalesced.default, xs, g.size, g.name)


def reduce_scatter_tensor_coalesced(
    tensors: Sequence[torch.Tensor], op: ReduceOpLike, scatter_dims: Sequence[int] | None = None, group: GroupLike = None, *, mesh_dim: int | str | None = None
) -> list:
    """Reduce each tensor over the ranks, then give rank ``i`` its ``i``-th chunk along
    ``scatter_dims[j]`` (default 0) of tensor ``j``, in one collective call.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import reduce_scatter_tensor_coalesced
        >>> [t.tolist() for t in reduce_scatter_tensor_coalesced([torch.arange(4.0), torch.ones(2, 2)], "sum", [0, 1])]
        [[0.0, 2.0], [[2.0], [2.0]]]
    """
    where = "reduce_scatter_tensor_coalesced"
    xs = _inputs(tensors, where, "reduce_scatter_tensor_autograd")
    g = resolve_group(group, mesh_dim, where=where)
    name = _reduce_op(op, where)
    dims = [0] * len(xs) if scatter_dims is None else list(scatter_dims)
    if len(dims) != len(xs):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: {len(dims)} scatter_dims for {len(xs)} tensors; "
            "pass one dim per tensor (or None for dim 0 everywhere)."
        )
    moved = []
    for i, (x, d) in enumerate(zip(xs, dims)):
        d = _check_dim(x, d, where, f"scatter_dims[{i}]")
        if x.dim() == 0 or x.size(d) % g.size != 0:
            raise CollectiveArgumentError(
                f"subclass_kit.collectives.{where}: dim {d} of tensors[{i}] (shape {tuple(x.shape)}) "
                f"must be divisible by the group size {g.size}; pad it or pick another scatter dim."
            )
        if d != 0:
            x = torch.cat(torch.chunk(x, g.size, dim=d), dim=0).contiguous()
        moved.append(x)
    return _issue_many(where, g, _ops.reduce_scatter_tensor_coalesced.default, moved, name, g.size, g.name)
