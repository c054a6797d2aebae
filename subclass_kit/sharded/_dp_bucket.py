"""One collective for a group of data-parallel parameters (FSDP2's copy-in / copy-out).

A per-parameter gather costs one synchronization of every rank per parameter, in the
forward and again in the backward; on a loaded or many-rank machine that latency, not the
bytes, is the step. :func:`gather_bucket` takes the stored parameters of one unit (a
transformer block: its LayerNorm and both Linears) and moves them in one collective:
each rank's shards, padded to the first rank's chunk and flattened, are concatenated and
all-gathered once, then cut back into the parameters. Its backward concatenates the
gradients (each rank's addend of the batch mean) the same way and reduce-scatters them once
(FSDP), all-reduces them once (DDP), or both, the all-reduce on the scattered buffer (HSDP:
half the bytes of all-reducing the full gradients first, as DTensor does). The average's
division is one op on the bucket. The bytes on the wire are the per-parameter ones.

Each parameter's data-parallel layout is ``Shard(0)`` over the mesh dim ``shard_dim`` of a
tensor of shape ``Member.shape`` (the parameter itself, or its TP shard for FSDP over TP),
or ``Replicate()`` over every mesh dim (DDP). The gradients return as ShardedTensors in
each parameter's stored layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _compat
from .. import collectives as _coll
from ._comm import waited
from ._layout import chunk_size
from .mesh import MeshRef
from .tensor import ShardedTensor, spec, wrap

__all__ = ["Bucket", "gather_bucket"]


@dataclass(frozen=True)
class Bucket:
    """What one group's collective needs (a constant while tracing).

    ``shapes``: each member's data-parallel global shape; ``shard_dim``: the mesh dim that
    shards dim 0 (None: replicated, DDP); ``param_dtype`` / ``reduce_dtype`` as
    :class:`~subclass_kit.sharded.MixedPrecisionPolicy`."""

    mesh: MeshRef
    shapes: tuple
    shard_dim: int | None
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def __fx_repr__(self):
        mesh, env = self.mesh.__fx_repr__()
        return (f"Bucket({mesh}, {self.shapes!r}, {self.shard_dim!r}, {self.param_dtype}, {self.reduce_dtype})",
                {**env, "Bucket": Bucket, "torch": torch})


_compat.register_compile_constants({Bucket: ("__eq__", "__ne__", "__hash__", "__repr__")})


def _rows(shape: tuple, k: int) -> tuple[int, int]:
    """(rows of the first rank's chunk of dim 0, elements per row)."""
    return chunk_size(shape[0], k, 0), math.prod(shape[1:])


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.size(0) == rows:
        return t
    return torch.constant_pad_nd(t, [0, 0] * (t.dim() - 1) + [0, rows - t.size(0)], 0)


class _GatherBucket(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b: Bucket, *params):
        ctx.b = b
        ctx.specs = [(spec(p), p.shape, p.stride(), p.dtype) for p in params]
        # This rank's coordinate on the data-parallel mesh (a parameter may be stored on a
        # larger one: FSDP over TP stores it on the (dp, tp) mesh).
        ctx.coord = b.mesh.coordinate()
        pd = b.param_dtype
        if b.shard_dim is None:  # replicated: nothing moves (a view, so autograd owns the output)
            return tuple(p.local.view_as(p.local) if pd in (None, p.dtype) else p.local.to(pd) for p in params)
        k = b.mesh.shape[b.shard_dim]
        sizes = [_rows(s, k) for s in b.shapes]
        flat = torch.cat([_pad_rows(p.local, r).reshape(-1) for p, (r, _) in zip(params, sizes)])
        if pd is not None and flat.dtype != pd:
            flat = flat.to(pd)
        if k > 1:
            flat = waited(_coll.all_gather_tensor(flat, 0, b.mesh.group_names[b.shard_dim]))
        out = flat.view(k, -1)
        fulls, off = [], 0
        for shape, (r, e) in zip(b.shapes, sizes):
            full = out[:, off:off + r * e].reshape(k * r, *shape[1:])
            fulls.append(full if k * r == shape[0] else full[:shape[0]])
            off += r * e
        return tuple(fulls)

    @staticmethod
    def backward(ctx, *grads):
        b: Bucket = ctx.b
        k = 1 if b.shard_dim is None else b.mesh.shape[b.shard_dim]
        sizes = [_rows(s, k) for s in b.shapes]
        flat = torch.cat([_pad_rows(g, k * r).reshape(k, r * e) for g, (r, e) in zip(grads, sizes)], 1)
        rd = b.reduce_dtype or ctx.specs[0][3]
        if flat.dtype != rd:
            flat = flat.to(rd)
        ranks = 1
        if k > 1:
            flat = waited(_coll.reduce_scatter_tensor(flat, "sum", 0, b.mesh.group_names[b.shard_dim]))
            ranks = k
        for i, name in enumerate(b.mesh.group_names):
            if i != b.shard_dim and b.mesh.shape[i] > 1:
                flat = waited(_coll.all_reduce(flat, "sum", name))
                ranks *= b.mesh.shape[i]
        flat = (flat / ranks).view(-1)
        out, off = [], 0
        for shape, (r, e), ((mesh, placements, coord), gshape, gstride, dtype) in zip(b.shapes, sizes, ctx.specs):
            mine = r if b.shard_dim is None else chunk_size(shape[0], k, ctx.coord[b.shard_dim])
            g = flat[off:off + r * e].view(r, *shape[1:]) if b.shard_dim is not None else flat[off:off + r * e].view(shape)
            if b.shard_dim is not None and mine != r:
                g = g[:mine]
            out.append(wrap(g.to(dtype), mesh, placements, coord, gshape, gstride, dtype))
            off += r * e
        return (None, *out)


@_compat.allow_in_graph
def _gather(b: Bucket, *params):
    return _GatherBucket.apply(b, *params)


def gather_bucket(b: Bucket, params: list) -> tuple:
    """Every parameter of ``params`` (stored ShardedTensors) gathered for compute, as plain
    tensors, in one collective (none for DDP); differentiable (see the module docstring).

    Example (a one-rank mesh moves nothing):
        >>> import torch
        >>> from subclass_kit.sharded import MeshRef, Shard, distribute
        >>> m = MeshRef.local()
        >>> w = distribute(torch.ones(3, 2), m, [Shard(0)]).requires_grad_()
        >>> [t.shape for t in gather_bucket(Bucket(m, ((3, 2),), 0), [w])]
        [torch.Size([3, 2])]
    """
    if not all(isinstance(p, ShardedTensor) for p in params):
        raise TypeError(f"gather_bucket: every parameter must be a ShardedTensor, got {[type(p).__name__ for p in params]}")
    return _gather(b, *params)
