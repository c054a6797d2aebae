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

import functools
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


# The copy-in and the copy-out as ops of their own, which inductor calls as they are (an
# extern kernel each) instead of decomposing: lowered, ``_chunk_cat`` is a pad and a copy per
# parameter and ``split_with_sizes_copy`` a copy per parameter, each a kernel inductor
# generates and compiles on the first step (a 4-block model's graphs had twice DTensor's
# kernels). Eager and aot_eager run the same aten ops.
@torch.library.custom_op("subclass_kit::dp_copy_in", mutates_args=())
def _copy_in(tensors: list[torch.Tensor], num_chunks: int) -> torch.Tensor:
    """``_chunk_cat(tensors, 0, num_chunks)``: rows of every tensor's chunk ``i`` flattened."""
    return _compat.chunk_cat(tensors, 0, num_chunks)


@_copy_in.register_fake
def _(tensors, num_chunks):
    return _compat.chunk_cat(tensors, 0, num_chunks)


@torch.library.custom_op("subclass_kit::dp_copy_out", mutates_args=())
def _copy_out(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """``split_with_sizes_copy(flat, sizes, dim=1)``: each piece a contiguous tensor of its own."""
    # (torch's stub types the out= form only: it returns the pieces)
    return list(torch.split_with_sizes_copy(flat, sizes, dim=1))  # type: ignore[func-returns-value, call-overload]


@_copy_out.register_fake
def _(flat, sizes):
    return [flat.new_empty((flat.size(0), n)) for n in sizes]


class _GatherBucket(torch.autograd.Function):
    # Each step is one op for the whole bucket where it can be (the compile traces every op
    # several times: dynamo's fake run, AOT's metadata pass and its joint trace): the copy-in
    # is one ``_chunk_cat``, the copy-out one ``split_with_sizes_copy``, the gradients' cut
    # one ``split``; a parameter adds a view at most (and a pad or slice if unevenly sharded).
    @staticmethod
    def forward(ctx, b: Bucket, *params):
        # Checked here, not in gather_bucket: torch.compile runs this on fake tensors instead
        # of interpreting it bytecode by bytecode.
        if not all(isinstance(p, ShardedTensor) for p in params):
            raise TypeError(f"gather_bucket: every parameter must be a ShardedTensor, got {[type(p).__name__ for p in params]}")
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
        # The wire dtype: the policy's, else the parameters' (promoted if they differ, as cat).
        wire = pd or functools.reduce(torch.promote_types, [p.dtype for p in params])
        same = all(p.dtype == params[0].dtype for p in params)
        locals_ = [_pad_rows(p.local if same else p.local.to(wire), r) for p, (r, _) in zip(params, sizes)]
        flat = _copy_in(locals_, 1)  # (1, this rank's padded shards flattened)
        if flat.dtype != wire:
            flat = flat.to(wire)
        if k > 1:
            flat = waited(_coll.all_gather_tensor(flat, 0, b.mesh.group_names[b.shard_dim]))
        # (k, total): rank i's row holds every parameter's i-th chunk; one op cuts each
        # parameter's columns out (contiguous), a view stacks its chunks back into dim 0.
        pieces = _copy_out(flat, [r * e for r, e in sizes])
        fulls = []
        for piece, p, shape, (r, _) in zip(pieces, params, b.shapes, sizes):
            full = piece.view(k * r, *shape[1:])
            full = full if k * r == shape[0] else full[:shape[0]]
            fulls.append(full if pd is not None or full.dtype == p.dtype else full.to(p.dtype))
        return tuple(fulls)

    @staticmethod
    def backward(ctx, *grads):
        b: Bucket = ctx.b
        k = 1 if b.shard_dim is None else b.mesh.shape[b.shard_dim]
        sizes = [_rows(s, k) for s in b.shapes]
        rd = b.reduce_dtype or ctx.specs[0][3]
        if any(g.dtype != grads[0].dtype for g in grads):
            grads = tuple(g.to(rd) for g in grads)
        # (k, total): each gradient's dim 0 padded to k chunks of the first rank's rows, its
        # chunk i flattened into row i, the layout the reduce-scatter hands out by row.
        flat = _copy_in(list(grads), k)
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
        dtypes = {d for *_, d in ctx.specs}
        if len(dtypes) == 1 and flat.dtype not in dtypes:
            flat = flat.to(next(iter(dtypes)))
        out = []
        pieces = torch.split(flat, [r * e for r, e in sizes])
        for g, shape, (r, _), ((mesh, placements, coord), gshape, gstride, dtype) in zip(pieces, b.shapes, sizes, ctx.specs):
            rows = shape[0] if b.shard_dim is None else r
            if len(shape) != 1:
                g = g.view(rows, *shape[1:])
            mine = rows if b.shard_dim is None else chunk_size(shape[0], k, ctx.coord[b.shard_dim])
            if mine != rows:
                g = g[:mine]
            out.append(wrap(g if g.dtype == dtype else g.to(dtype), mesh, placements, coord, gshape, gstride, dtype))
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
    return _gather(b, *params)
