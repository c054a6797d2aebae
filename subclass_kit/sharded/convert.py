"""Conversions between plain tensors and ShardedTensors, differentiable and compilable.

Each public function is a thin wrapper that turns the DeviceMesh into its ``MeshRef`` (a
constant while tracing) and calls a graph function registered with dynamo's
``allow_in_graph``: torch.compile records one call node for it (like torch's
``DTensor.from_local``) instead of tracing into the ``autograd.Function`` that builds the
wrapper, and AOTAutograd then traces that function's forward and backward, collectives
included, into the joint graph. All argument checking runs inside, so eager and compiled
calls raise the same errors.
"""

from __future__ import annotations

import torch

from .. import collectives as _coll
from ..compiling import is_compiling
from .. import _compat
from .comm import waited
from .errors import MeshError, PlacementError, ShardShapeError
from .layout import contiguous_strides, even_global_shape, local_shape
from .mesh import MeshRef, mesh_ref
from .placements import Partial, Replicate, Shard, normalize_placements, render
from .redistribute import redistribute_local
from .tensor import ShardedTensor, relayout, wrap

__all__ = ["from_local", "to_local", "redistribute", "distribute"]


def _fmt(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _strides_like(shape, local: torch.Tensor) -> tuple:
    # Keep a transposed local's layout in the global strides (as DTensor does); with
    # symbolic strides, contiguous (comparing them would add guards).
    st = local.stride()
    if local.dim() < 2 or not all(type(s) is int for s in st) or local.is_contiguous():
        return contiguous_strides(shape)
    order = sorted(range(local.dim()), key=lambda d: -st[d])
    out = [0] * local.dim()
    acc = 1
    for d in reversed(order):
        out[d] = acc
        acc = acc * shape[d]
    return tuple(out)


def _check_local_shape(local, shape, pl, ref: MeshRef, coord) -> None:
    expected = local_shape(shape, pl, ref.shape, coord)
    for d, (e, g) in enumerate(zip(expected, local.shape)):
        if type(e) is int and type(g) is int:
            if e == g:
                continue
            why = ""
            for i, p in enumerate(pl):
                if type(p) is Shard and p.dim == d:
                    why = (
                        f" dim {d} (size {shape[d]}) is split over {ref.shape[i]} ranks of mesh dim {i} "
                        f"as torch.chunk does, so coordinate {coord[i]} holds {e}, not {g}."
                    )
            if not why:
                why = f" dim {d} is not sharded, so the local size must be the global {shape[d]}, not {g}."
            raise ShardShapeError(
                f"ShardedTensor.from_local: the local tensor (shape {_fmt(local.shape)}) is not "
                f"this rank's shard of a global tensor of shape {_fmt(shape)} with placements "
                f"{render(pl)} at mesh coordinate {coord} of a {_fmt(ref.shape)} mesh: expected "
                f"local shape {_fmt(expected)};{why} Pass shape= with the true global shape (the "
                "same on every rank), or fix the local tensor."
            )
        else:
            _compat.sym_check(g == e, lambda d=d, e=e, g=g: f"ShardedTensor.from_local: local dim {d} is {g}, expected {e}")


def _run_check(local, ref: MeshRef, pl, coord, shape) -> None:
    for i, name in enumerate(ref.group_names):
        k = ref.shape[i]
        if k == 1:
            continue
        sizes = torch.tensor([int(s) for s in local.shape], dtype=torch.int64)
        got = waited(_coll.all_gather_tensor(sizes, 0, name)).reshape(k, -1).tolist()
        for c in range(k):
            other = coord[:i] + (c,) + coord[i + 1:]
            want = list(local_shape(shape, pl, ref.shape, other))
            if got[c] != want:
                raise ShardShapeError(
                    f"ShardedTensor.from_local(run_check=True): the rank at coordinate {other} holds "
                    f"a local tensor of shape {tuple(got[c])}, but its shard of the global shape "
                    f"{_fmt(shape)} under {render(pl)} has shape {tuple(want)}. Every rank must "
                    "pass its own shard and the same shape=."
                )
        if type(pl[i]) is Replicate:
            first = waited(_coll.broadcast(local.detach(), 0, name))
            if not torch.equal(first, local.detach()):
                raise ShardShapeError(
                    f"ShardedTensor.from_local(run_check=True): placements[{i}] is Replicate() but "
                    f"the local tensor at coordinate {coord} differs from the one at coordinate 0 of "
                    f"mesh dim {i}. Pass equal replicas (e.g. broadcast first), or use Partial() if "
                    "the locals are operands of a sum."
                )


# ---- autograd functions -------------------------------------------------------------------
class _FromLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, mesh, placements, coord, shape, stride):
        ctx.spec = (mesh, placements, coord)
        # A view: the ShardedTensor shares the caller's storage, as DTensor.from_local does.
        return wrap(local.view_as(local), mesh, placements, coord, shape, stride)

    @staticmethod
    def backward(ctx, grad):
        mesh, placements, coord = ctx.spec
        # A gradient of a Partial input is the gradient of the sum: the same for every operand.
        target = tuple(Replicate() if type(p) is Partial else p for p in placements)
        if isinstance(grad, ShardedTensor):
            g = grad._kit_ctx
            return redistribute_local(grad.local, mesh, coord, g.placements, target, grad.shape), None, None, None, None, None
        # A plain (global) gradient: keep this rank's part of it.
        full = (Replicate(),) * len(placements)
        return redistribute_local(grad, mesh, coord, full, target, grad.shape), None, None, None, None, None


class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_placements):
        c = x._kit_ctx
        ctx.spec = (c.mesh, grad_placements or c.placements, c.coord, x.shape, x.stride(), x.dtype)
        return x.local.view_as(x.local)

    @staticmethod
    def backward(ctx, grad):
        mesh, placements, coord, shape, stride, dtype = ctx.spec
        if isinstance(grad, ShardedTensor):
            raise TypeError("ShardedTensor.to_local: the gradient of a local tensor must be a plain tensor")
        return wrap(grad, mesh, placements, coord, shape, stride, dtype), None


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, placements, async_op=False):
        c = x._kit_ctx
        ctx.src = c.placements
        ctx.where = (c.mesh, c.coord, x.shape, x.stride())
        if async_op:
            from .comm import async_op as pending

            with pending():
                return relayout(x, placements)
        return relayout(x, placements)

    @staticmethod
    def backward(ctx, grad):
        target = tuple(Replicate() if type(p) is Partial else p for p in ctx.src)
        if not isinstance(grad, ShardedTensor):
            # A plain gradient is the whole global gradient: this rank keeps its part.
            mesh, coord, shape, stride = ctx.where
            return wrap(redistribute_local(grad, mesh, coord, (Replicate(),) * len(target), target, shape),
                        mesh, target, coord, shape, stride, grad.dtype), None, None
        if grad._kit_ctx.placements == target:
            return grad, None, None
        # The forward's global shape, not the tangent's: under dynamic shapes the tangent's
        # outer sizes are fresh symbols the backward graph has no input for (a gather's
        # narrow to them made AOTAutograd recurse forever), the forward's are traced values.
        _, _, shape, stride = ctx.where
        return relayout(grad, target, shape, stride), None, None


# ---- graph functions (one call node each under torch.compile) ------------------------------
@_compat.allow_in_graph
def _from_local(local, ref, placements, shape, stride, run_check):
    if not isinstance(local, torch.Tensor) or isinstance(local, ShardedTensor):
        raise TypeError(
            f"ShardedTensor.from_local takes this rank's shard as a plain torch.Tensor, got "
            f"{type(local).__name__}. To change the placements of a ShardedTensor use "
            ".redistribute(mesh, placements)."
        )
    if shape is not None and len(shape) != local.dim():
        raise ShardShapeError(
            f"ShardedTensor.from_local: shape={_fmt(shape)} has {len(shape)} dims but the local "
            f"tensor has {local.dim()} (shape {_fmt(local.shape)}). Pass the global shape of the "
            "tensor the shards make up; it has as many dims as each shard."
        )
    ndim = local.dim()
    pl = normalize_placements(placements, ref.ndim, ndim, what="ShardedTensor.from_local")
    coord = ref.coordinate()
    if shape is None:
        if stride is not None:
            raise ShardShapeError("ShardedTensor.from_local: stride= needs shape= (the global shape it belongs to).")
        shape = even_global_shape(local.shape, pl, ref.shape)
    else:
        shape = tuple(shape)
        _check_local_shape(local, shape, pl, ref, coord)
    stride = _strides_like(shape, local) if stride is None else tuple(stride)
    if run_check and not is_compiling():
        _run_check(local, ref, pl, coord, shape)
    return _FromLocal.apply(local, ref, pl, coord, tuple(shape), stride)


@_compat.allow_in_graph
def _to_local(x, grad_placements):
    if not isinstance(x, ShardedTensor):
        raise TypeError(f"to_local() needs a ShardedTensor, got {type(x).__name__}.")
    if grad_placements is not None:
        grad_placements = normalize_placements(
            grad_placements, x._kit_ctx.mesh.ndim, x.dim(), what="ShardedTensor.to_local(grad_placements=)"
        )
    return _ToLocal.apply(x, grad_placements)


@_compat.allow_in_graph
def _redistribute(x, ref, placements, async_op=False):
    c = x._kit_ctx
    if ref is not None and ref != c.mesh:
        raise MeshError(
            f"ShardedTensor.redistribute: the tensor lives on {c.mesh} but mesh={ref} was given; "
            "moving between meshes is not supported. Pass the tensor's own mesh (or None)."
        )
    pl = c.placements if placements is None else normalize_placements(
        placements, c.mesh.ndim, x.dim(), what="ShardedTensor.redistribute"
    )
    if pl == c.placements:
        return x
    return _Redistribute.apply(x, pl, bool(async_op))


@_compat.allow_in_graph
def _distribute(t, ref, placements, src_data_rank):
    if not isinstance(t, torch.Tensor) or isinstance(t, ShardedTensor):
        raise TypeError(f"distribute takes a plain torch.Tensor, got {type(t).__name__}.")
    pl = normalize_placements(placements, ref.ndim, t.dim(), what="distribute")
    for i, p in enumerate(pl):
        if type(p) is Partial:
            raise PlacementError(
                f"distribute: placements[{i}] is {p!r}; a whole tensor cannot be split into "
                "operands. Distribute it Replicate()/Shard(d), then redistribute if needed."
            )
    coord = ref.coordinate()
    local = t.detach()
    if src_data_rank is not None:
        for i, name in enumerate(ref.group_names):
            if ref.shape[i] > 1:
                local = waited(_coll.broadcast(local.contiguous(), src_data_rank, name))
    full = (Replicate(),) * ref.ndim
    local = redistribute_local(local, ref, coord, full, pl, t.shape)
    # A fresh, compact copy: a parameter's shard must not alias the dense tensor it came from.
    local = local.clone(memory_format=torch.contiguous_format)
    out = wrap(local, ref, pl, coord, t.shape, contiguous_strides(t.shape), t.dtype)
    if t.requires_grad:
        out.requires_grad_(True)
    return out


# ---- public -------------------------------------------------------------------------------
def from_local(local, mesh, placements, *, shape=None, stride=None, run_check=False) -> ShardedTensor:
    """See :meth:`ShardedTensor.from_local`."""
    return _from_local(local, mesh_ref(mesh), list(placements) if isinstance(placements, (list, tuple)) else placements,
                       None if shape is None else tuple(shape), None if stride is None else tuple(stride), run_check)


def to_local(x, grad_placements=None) -> torch.Tensor:
    """See :meth:`ShardedTensor.to_local`."""
    return _to_local(x, None if grad_placements is None else list(grad_placements))


def redistribute(x, mesh=None, placements=None, *, async_op: bool = False) -> ShardedTensor:
    """See :meth:`ShardedTensor.redistribute`."""
    return _redistribute(x, None if mesh is None else mesh_ref(mesh), None if placements is None else list(placements),
                         async_op)


def distribute(t: torch.Tensor, mesh, placements, *, src_data_rank: int | None = 0) -> ShardedTensor:
    """Lay a whole tensor out over ``mesh``: each rank keeps its part (a new leaf tensor).

    Like torch's ``distribute_tensor``: the values of the rank at coordinate
    ``src_data_rank`` of each mesh dimension are used (one broadcast per mesh dim of more
    than one rank); ``src_data_rank=None`` uses each rank's own ``t`` without communication.

    Args:
        t: the whole tensor (same shape on every rank).
        mesh: a torch ``DeviceMesh`` (or a ``MeshRef``).
        placements: ``Shard(d)`` or ``Replicate()`` per mesh dim.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, Shard, MeshRef
        >>> x = distribute(torch.arange(6.).reshape(3, 2), MeshRef.local(), [Shard(0)])
        >>> x.placements, x.to_local().shape
        ((Shard(0),), torch.Size([3, 2]))
    """
    return _distribute(t, mesh_ref(mesh), list(placements) if isinstance(placements, (list, tuple)) else placements, src_data_rank)
