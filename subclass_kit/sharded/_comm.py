"""The collective steps of redistribution, on one mesh dimension, returning waited locals.

Each step goes through ``subclass_kit.collectives`` (torch's native ``_c10d_functional``
ops underneath) by group name, and waits at once: a ShardedTensor's local is a plain tensor (unless
``redistribute(..., async_op=True)`` asked for a pending one). Under torch.compile the kit's collectives return ``wait_tensor(op(...))`` and both
nodes land in the graph. A mesh dimension of one rank is the identity and issues nothing.

Uneven shards (torch.chunk sizes) are padded to the full chunk before a gather or a
reduce-scatter and cut back after, so every rank sends equal sizes as the ops require.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from .. import collectives as _coll
from ._layout import chunk_size, strided_pieces
from .mesh import MeshRef

__all__ = ["waited", "async_op", "gather_shards", "gather_strided", "reduce_partial", "reduce_scatter_partial",
           "take_chunk", "take_strided", "identity_unless_first"]


_ASYNC = contextvars.ContextVar("subclass_kit_sharded_async_op", default=False)


@contextlib.contextmanager
def async_op():
    """Within this context ``waited`` leaves eager results pending (``redistribute(...,
    async_op=True)``): compute ops on them wait at first use, views keep them pending."""
    token = _ASYNC.set(True)
    try:
        yield
    finally:
        _ASYNC.reset(token)


def waited(t: torch.Tensor) -> torch.Tensor:
    # Eager results are pending AsyncCollectiveTensors: wait now, a local is plain (unless
    # async_op asked for the pending result). While tracing the kit already returned
    # wait_tensor(op(...)); waiting again would add a second wait node.
    if type(t) is _coll.AsyncCollectiveTensor and not _ASYNC.get():
        return t.trigger_wait()
    return t


def _static_zero(x) -> bool:
    return type(x) is int and x == 0


def _pad(local: torch.Tensor, dim: int, amount) -> torch.Tensor:
    if _static_zero(amount):
        return local
    pad = [0, 0] * (local.dim() - dim - 1) + [0, amount]
    return torch.constant_pad_nd(local, pad, 0)


def gather_shards(local: torch.Tensor, mesh: MeshRef, mesh_dim: int, dim: int, n) -> torch.Tensor:
    """All-gather the shards of tensor dim ``dim`` (global size ``n``) along mesh dim ``mesh_dim``."""
    k = mesh.shape[mesh_dim]
    if k == 1:
        return local
    full = chunk_size(n, k, 0)
    padded = _pad(local, dim, full - local.size(dim)).contiguous()
    out = waited(_coll.all_gather_tensor(padded, dim, mesh.group_names[mesh_dim]))
    if type(n) is int and type(full) is int and n == full * k:
        return out
    # A fresh buffer either way: keep it compact so views of it stay possible.
    return out.narrow(dim, 0, n).contiguous()


def reduce_partial(local: torch.Tensor, mesh: MeshRef, mesh_dim: int, op: str) -> torch.Tensor:
    """All-reduce a Partial(op) operand over mesh dim ``mesh_dim`` (``avg`` = sum / ranks)."""
    k = mesh.shape[mesh_dim]
    if k == 1:
        return local
    name = mesh.group_names[mesh_dim]
    if op == "avg":
        # gloo has no AVG; sum then divide gives the same value on every backend.
        return waited(_coll.all_reduce(local.contiguous(), "sum", name)) / k
    return waited(_coll.all_reduce(local.contiguous(), op, name))


def reduce_scatter_partial(local: torch.Tensor, mesh: MeshRef, mesh_dim: int, op: str, dim: int, coord: int) -> torch.Tensor:
    """Reduce a Partial(op) operand and keep this rank's chunk of ``dim`` (one collective)."""
    k = mesh.shape[mesh_dim]
    if k == 1:
        return local
    n = local.size(dim)
    full = chunk_size(n, k, 0)
    padded = _pad(local, dim, full * k - n).contiguous()
    wire_op = "sum" if op == "avg" else op
    out = waited(_coll.reduce_scatter_tensor(padded, wire_op, dim, mesh.group_names[mesh_dim]))
    if op == "avg":
        out = out / k
    mine = chunk_size(n, k, coord)
    if type(mine) is int and type(full) is int and mine == full:
        return out
    return out.narrow(dim, 0, mine)


def take_chunk(local: torch.Tensor, k: int, coord: int, dim: int) -> torch.Tensor:
    """This rank's chunk of a replicated tensor along ``dim`` (no communication; a view)."""
    if k == 1:
        return local
    from ._layout import chunk_start

    n = local.size(dim)
    return local.narrow(dim, chunk_start(n, k, coord), chunk_size(n, k, coord))


def identity_unless_first(local: torch.Tensor, coord: int, op: str = "sum") -> torch.Tensor:
    """Replicate -> Partial('sum') (or ``'product'``): the first rank keeps the value, the
    others hold zeros (ones)."""
    if coord == 0:
        return local
    return torch.ones_like(local) if op == "product" else torch.zeros_like(local)


def _cat(parts: list, dim: int, like: torch.Tensor) -> torch.Tensor:
    parts = [p for p in parts if not _static_zero(p.size(dim))] or parts[:1]
    if not parts:
        return like.narrow(dim, 0, 0)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def take_strided(local: torch.Tensor, k: int, coord: int, dim: int, sf: int) -> torch.Tensor:
    """This rank's part of a replicated tensor under ``_StridedShard(dim, sf)`` over ``k``
    ranks: chunk ``coord`` of each of the ``sf`` chunks of ``dim``, concatenated."""
    if k == 1:
        return local
    n = local.size(dim)
    return _cat([local.narrow(dim, s, m) for s, m in strided_pieces(n, k, coord, sf)], dim, local)


def gather_strided(local: torch.Tensor, mesh: MeshRef, mesh_dim: int, dim: int, n, sf: int) -> torch.Tensor:
    """All-gather a ``_StridedShard(dim, sf)`` of a dim of size ``n`` along ``mesh_dim`` and
    put the pieces back in order (one all-gather; the reorder is local narrows and a cat)."""
    k = mesh.shape[mesh_dim]
    if k == 1:
        return local
    held = [strided_pieces(n, k, c, sf) for c in range(k)]
    full = 0
    for _, m in held[0]:
        full = full + m  # coordinate 0 holds the most
    padded = _pad(local, dim, full - local.size(dim)).contiguous()
    out = waited(_coll.all_gather_tensor(padded, dim, mesh.group_names[mesh_dim]))
    # Piece j of coordinate c sits after c full blocks and c's pieces before j.
    parts = []
    for j in range(sf):
        for c in range(k):
            before = 0
            for _, m in held[c][:j]:
                before = before + m
            parts.append(out.narrow(dim, c * full + before, held[c][j][1]))
    return _cat(parts, dim, out).contiguous()
