"""Differentiable collectives: the ``*_autograd`` variants.

Each forward is the plain collective (an AsyncCollectiveTensor in eager); each backward is
its adjoint collective, waited inside the backward, so the gradient handed to autograd is
complete. The adjoints, for a total loss ``L = sum over ranks of L_rank``:

- ``all_reduce`` sum: ``all_reduce(grad, sum)``; avg: ``all_reduce(grad, avg)``;
  max/min: the summed gradient goes to the ranks (and positions) that hold the extreme,
  split evenly among ties (torch's ``amax`` convention);
- ``all_gather_tensor`` along ``d``: ``reduce_scatter_tensor(grad, sum, d)``;
- ``reduce_scatter_tensor`` sum along ``d``: ``all_gather_tensor(grad, d)`` (avg: divided by
  the group size);
- ``all_to_all_single``: ``all_to_all_single`` with input and output splits swapped.

All are plain ``torch.autograd.Function``s, so they trace under torch.compile (forward and
backward graphs each carry their collective and its wait).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _compat
from .act import AsyncCollectiveTensor
from .errors import CollectiveArgumentError
from .groups import GroupLike, ReduceOpLike, GroupRef, resolve_group
from ._common import _check_dim, _chunk_cat, _issue, _reduce_op, _splits

__all__ = [
    "all_reduce_autograd",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor_autograd",
    "all_to_all_single_autograd",
]

_ops = _compat.funcol_ops
_wait = _compat.wait_op


def _ar(x, op, g: GroupRef):
    return _wait(_ops.all_reduce.default(x.contiguous(), op, g.name))


def _ag(x, dim: int, g: GroupRef):
    out = _wait(_ops.all_gather_into_tensor.default(x.contiguous(), g.size, g.name))
    return out if dim == 0 else _chunk_cat(out, g.size, dim)


def _rs(x, op, dim: int, g: GroupRef):
    if dim != 0:
        x = torch.cat(torch.chunk(x, g.size, dim=dim), dim=0)
    return _wait(_ops.reduce_scatter_tensor.default(x.contiguous(), op, g.size, g.name))


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op: str, g: GroupRef):
        ctx.op = op
        ctx.g = g
        y = _issue("all_reduce_autograd", g, _ops.all_reduce.default, x.contiguous(), op, g.name)
        if op in ("max", "min"):
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        op, g = ctx.op, ctx.g
        if op == "sum" or op == "avg":
            return _ar(grad, op, g), None, None
        x, y = ctx.saved_tensors
        hit = (x == y).to(grad.dtype)
        ties = _ar(hit, "sum", g)
        return hit * _ar(grad, "sum", g) / ties, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim: int, g: GroupRef):
        ctx.dim = dim
        ctx.g = g
        res = _issue("all_gather_tensor_autograd", g, _ops.all_gather_into_tensor.default, x.contiguous(), g.size, g.name)
        if dim == 0:
            return res
        if isinstance(res, AsyncCollectiveTensor):
            res = res.trigger_wait()
        return _chunk_cat(res, g.size, dim)

    @staticmethod
    def backward(ctx, grad):
        return _rs(grad, "sum", ctx.dim, ctx.g), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op: str, dim: int, g: GroupRef):
        ctx.op = op
        ctx.dim = dim
        ctx.g = g
        if dim != 0:
            x = torch.cat(torch.chunk(x, g.size, dim=dim), dim=0)
        return _issue("reduce_scatter_tensor_autograd", g, _ops.reduce_scatter_tensor.default, x.contiguous(), op, g.size, g.name)

    @staticmethod
    def backward(ctx, grad):
        out = _ag(grad, ctx.dim, ctx.g)
        if ctx.op == "avg":
            out = out / ctx.g.size
        return out, None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_s, in_s, g: GroupRef):
        ctx.out_s = out_s
        ctx.in_s = in_s
        ctx.g = g
        return _issue("all_to_all_single_autograd", g, _ops.all_to_all_single.default, x.contiguous(), out_s, in_s, g.name)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.g
        out = _wait(_ops.all_to_all_single.default(grad.contiguous(), ctx.in_s, ctx.out_s, g.name))
        return out, None, None, None


def all_reduce_autograd(t: torch.Tensor, op: ReduceOpLike, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """:func:`~subclass_kit.collectives.all_reduce` with a gradient (op: sum, avg, max, min).

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_reduce_autograd
        >>> x = torch.ones(2, requires_grad=True)
        >>> all_reduce_autograd(x, "sum").sum().backward()   # both ranks' losses count
        >>> x.grad
        tensor([2., 2.])
    """
    where = "all_reduce_autograd"
    g = resolve_group(group, mesh_dim, where=where)
    name = _reduce_op(op, where)
    if name not in ("sum", "avg", "max", "min"):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: no gradient is defined here for reduce op "
            f"{name!r}; use 'sum', 'avg', 'max' or 'min', or the non-differentiable all_reduce."
        )
    return _AllReduce.apply(t, name, g)


def all_gather_tensor_autograd(t: torch.Tensor, gather_dim: int, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """:func:`~subclass_kit.collectives.all_gather_tensor` with a gradient (a reduce-scatter).

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_gather_tensor_autograd
        >>> x = torch.ones(2, requires_grad=True)
        >>> all_gather_tensor_autograd(x, 0).sum().backward()
        >>> x.grad
        tensor([2., 2.])
    """
    where = "all_gather_tensor_autograd"
    g = resolve_group(group, mesh_dim, where=where)
    dim = _check_dim(t, gather_dim, where, "gather_dim")
    return _AllGather.apply(t, dim, g)


def reduce_scatter_tensor_autograd(t: torch.Tensor, op: ReduceOpLike, scatter_dim: int, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """:func:`~subclass_kit.collectives.reduce_scatter_tensor` with a gradient (an all-gather).

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import reduce_scatter_tensor_autograd
        >>> x = torch.ones(4, requires_grad=True)
        >>> reduce_scatter_tensor_autograd(x, "sum", 0).sum().backward()
        >>> x.grad                      # each element lands in exactly one rank's output
        tensor([1., 1., 1., 1.])
    """
    where = "reduce_scatter_tensor_autograd"
    g = resolve_group(group, mesh_dim, where=where)
    name = _reduce_op(op, where)
    if name not in ("sum", "avg"):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: no gradient is defined here for reduce op "
            f"{name!r}; use 'sum' or 'avg', or the non-differentiable reduce_scatter_tensor."
        )
    dim = _check_dim(t, scatter_dim, where, "scatter_dim")
    if t.dim() == 0 or t.size(dim) % g.size != 0:
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: dim {dim} of the input (shape "
            f"{tuple(t.shape)}) must be divisible by the group size {g.size}."
        )
    return _ReduceScatter.apply(t, name, dim, g)


def all_to_all_single_autograd(t: torch.Tensor, output_split_sizes: Sequence[int] | None, input_split_sizes: Sequence[int] | None, group: GroupLike = None, *, mesh_dim: int | str | None = None) -> torch.Tensor:
    """:func:`~subclass_kit.collectives.all_to_all_single` with a gradient (the reverse exchange).

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_to_all_single_autograd
        >>> x = torch.ones(4, requires_grad=True)
        >>> all_to_all_single_autograd(x, None, None).sum().backward()
        >>> x.grad
        tensor([1., 1., 1., 1.])
    """
    where = "all_to_all_single_autograd"
    g = resolve_group(group, mesh_dim, where=where)
    out_s, in_s = _splits(t, output_split_sizes, input_split_sizes, g, where)
    return _AllToAll.apply(t, out_s, in_s, g)
