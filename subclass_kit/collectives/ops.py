"""The collectives, on torch's native ``_c10d_functional`` ops.

In eager each returns as soon as the collective is issued, as an
:class:`~subclass_kit.collectives.AsyncCollectiveTensor` that waits at first use. While
compiling or exporting, each returns ``wait_tensor(op(...))`` directly: the compiler sees
the collective and its wait as two graph nodes and may move compute between them.

Gradients follow torch 2.13's functional collectives (whose native ops carry autograd):
when the input requires grad (and grad mode is on), ``all_reduce``, ``all_gather_tensor``,
``reduce_scatter_tensor`` and ``all_to_all_single`` are their ``*_autograd`` variants from
:mod:`subclass_kit.collectives.autograd`, whose backward is the adjoint collective (for
``all_reduce`` sum: ``all_reduce(grad, sum)``, as torch's). Where torch raises in the
backward (``all_reduce`` with ``avg``/``max``/``min``) the kit gives the adjoint.
``broadcast`` has no gradient in torch (it warns and passes the local gradient through);
here an input that requires grad is an error naming the fix.

Reduce ops are named by strings as in torch's functional collectives: ``"sum"``,
``"avg"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``, ``"bxor"``
(any case; a ``torch.distributed.ReduceOp`` member works too).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ._common import (
    REDUCE_OPS, _all_gather, _all_reduce, _all_to_all, _broadcast, _check_dim, _chunk_cat, _issue,
    _nograd, _reduce_op, _reduce_scatter, _splits, _tracing, _wait_op, _wants_grad,
)
from .act import AsyncCollectiveTensor
from .autograd import all_gather_tensor_autograd, all_reduce_autograd, all_to_all_single_autograd, reduce_scatter_tensor_autograd
from .errors import CollectiveArgumentError
from .groups import GroupLike, ReduceOpLike, resolve_group

__all__ = [
    "all_reduce",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "wait_tensor",
    "REDUCE_OPS",
]

def all_reduce(t: torch.Tensor, op: ReduceOpLike, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """Reduce ``t`` over the ranks of ``group``; every rank gets the result.

    Args:
        t: this rank's contribution (left unmodified).
        op: reduce op name (``"sum"``, ``"avg"``, ``"max"``, ...).
        group: None for the default world group, a ProcessGroup, a DeviceMesh (with
            ``mesh_dim`` unless 1-D), a group name, or a list of ranks.

    Returns:
        An AsyncCollectiveTensor in eager; a plain tensor while compiling.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_reduce
        >>> all_reduce(torch.ones(2), "sum")
        AsyncCollectiveTensor(tensor([2., 2.]))
    """
    if _wants_grad(t):
        return all_reduce_autograd(t, op, group, mesh_dim=mesh_dim)
    g = resolve_group(group, mesh_dim, where="all_reduce")
    name = _reduce_op(op, "all_reduce")
    return _issue("all_reduce", g, _all_reduce, _nograd(t), name, g.name)


def all_gather_tensor(t: torch.Tensor, gather_dim: int, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``gather_dim`` (rank order).

    For ``gather_dim == 0`` the result is an AsyncCollectiveTensor in eager. For any other
    dim the native op still gathers along dim 0, and rearranging the chunks needs the data:
    this waits at once and returns a plain tensor.

    Example (rank 0 of a 2-rank process group):
        >>> import torch, torch.distributed as dist
        >>> from subclass_kit.collectives import all_gather_tensor
        >>> x = torch.full((1, 2), float(dist.get_rank()))
        >>> all_gather_tensor(x, 0)
        AsyncCollectiveTensor(tensor([[0., 0.],
                [1., 1.]]))
        >>> all_gather_tensor(x, 1)                     # not dim 0: waited, plain
        tensor([[0., 0., 1., 1.]])
    """
    if _wants_grad(t):
        return all_gather_tensor_autograd(t, gather_dim, group, mesh_dim=mesh_dim)
    g = resolve_group(group, mesh_dim, where="all_gather_tensor")
    gather_dim = _check_dim(t, gather_dim, "all_gather_tensor", "gather_dim")
    res = _issue("all_gather_tensor", g, _all_gather, _nograd(t).contiguous(), g.size, g.name)
    if gather_dim == 0:
        return res
    if isinstance(res, AsyncCollectiveTensor):
        res = res.trigger_wait()
    return _chunk_cat(res, g.size, gather_dim)


def reduce_scatter_tensor(t: torch.Tensor, op: ReduceOpLike, scatter_dim: int, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """Reduce ``t`` over the ranks, then give rank ``i`` the ``i``-th chunk along ``scatter_dim``.

    ``t.size(scatter_dim)`` must be divisible by the group size.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import reduce_scatter_tensor
        >>> reduce_scatter_tensor(torch.arange(4.0), "sum", 0)
        AsyncCollectiveTensor(tensor([0., 2.]))
    """
    if _wants_grad(t):
        return reduce_scatter_tensor_autograd(t, op, scatter_dim, group, mesh_dim=mesh_dim)
    where = "reduce_scatter_tensor"
    g = resolve_group(group, mesh_dim, where=where)
    name = _reduce_op(op, where)
    scatter_dim = _check_dim(t, scatter_dim, where, "scatter_dim")
    if t.dim() == 0 or t.size(scatter_dim) % g.size != 0:
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: dim {scatter_dim} of the input (shape "
            f"{tuple(t.shape)}) must be divisible by the group size {g.size}; pad it or pick "
            "another scatter_dim."
        )
    x = _nograd(t)
    if scatter_dim != 0:
        # The native op scatters dim 0: bring rank i's chunk of scatter_dim to block i of dim 0.
        x = torch.cat(torch.chunk(x, g.size, dim=scatter_dim), dim=0)
    return _issue(where, g, _reduce_scatter, x.contiguous(), name, g.size, g.name)


def all_to_all_single(
    t: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    group: GroupLike = None,
    *,
    mesh_dim: int | str | None = None,
) -> torch.Tensor:
    """Split ``t`` along dim 0, send piece ``i`` to rank ``i``, concatenate what arrives.

    ``input_split_sizes[i]`` rows go to rank ``i``; ``output_split_sizes[i]`` rows come
    from rank ``i``. Both None means even splits.

    Example (rank 0 of a 2-rank process group; rank r sends r+1 rows to rank 0, one to rank 1):
        >>> import torch, torch.distributed as dist
        >>> from subclass_kit.collectives import all_to_all_single
        >>> r = dist.get_rank()
        >>> x = torch.arange(r + 2.0) + 10 * r
        >>> all_to_all_single(x, [1, 2 - r], [r + 1, 1])  # rank 0 receives 1 row, then 2
        AsyncCollectiveTensor(tensor([ 0., 10., 11.]))
    """
    if _wants_grad(t):
        return all_to_all_single_autograd(t, output_split_sizes, input_split_sizes, group, mesh_dim=mesh_dim)
    where = "all_to_all_single"
    g = resolve_group(group, mesh_dim, where=where)
    out_s, in_s = _splits(t, output_split_sizes, input_split_sizes, g, where)
    return _issue(where, g, _all_to_all, _nograd(t).contiguous(), out_s, in_s, g.name)


def broadcast(t: torch.Tensor, src: int, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """Every rank gets rank ``src``'s ``t`` (``src`` is the rank *within* ``group``).

    Example (rank 0 of a 2-rank process group):
        >>> import torch, torch.distributed as dist
        >>> from subclass_kit.collectives import broadcast
        >>> broadcast(torch.full((2,), float(dist.get_rank())), 1)
        AsyncCollectiveTensor(tensor([1., 1.]))
    """
    if _wants_grad(t):
        raise CollectiveArgumentError(
            "subclass_kit.collectives.broadcast: the input requires grad, but broadcast has no "
            "gradient (torch's functional broadcast has no autograd kernel either). Pass "
            "t.detach(), or call it under torch.no_grad(); to send a differentiable value from "
            "one rank, all_reduce(t * (rank == src), 'sum') is differentiable."
        )
    g = resolve_group(group, mesh_dim, where="broadcast")
    if not 0 <= src < g.size:
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.broadcast: src={src} is not a rank of the group "
            f"{g.name!r} (ranks 0..{g.size - 1} within the group)."
        )
    return _issue("broadcast", g, _broadcast, _nograd(t).contiguous(), src, g.name)


def wait_tensor(t: torch.Tensor) -> torch.Tensor:
    """Wait for a collective's result and return it as a plain tensor.

    Works on an AsyncCollectiveTensor (and its views) and on the raw output of a native
    ``_c10d_functional`` op; a tensor with nothing pending is returned as is.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_reduce, wait_tensor
        >>> wait_tensor(all_reduce(torch.ones(2), "sum"))
        tensor([2., 2.])
    """
    if isinstance(t, AsyncCollectiveTensor) and not _tracing():
        return t.trigger_wait()
    return _wait_op(t)
