"""``ShardedTensor``: a DTensor-like global tensor held as one local shard per rank."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import torch

from .. import _compat
from .. import collectives as _coll
from ..base import WrapperTensor
from ..compiling import is_compiling
from ..ctx import SubclassCtx, ctx_of
from ..fields import inner, meta, state
from ._comm import waited
from .errors import MeshError, ShapeStrideError, ShardMetadataError, ShardShapeError
from ._layout import contiguous_strides, even_global_shape, local_shape
from .mesh import LAYOUTS_SEEN, MeshLike, MeshRef, mesh_ref
from .placements import Partial, Placement, Replicate, Shard, _StridedShard, is_simple, normalize_placements, render
from ._redistribute import redistribute_local

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["ShardedTensor", "wrap", "wrap_out_spec", "out_spec", "Out", "spec", "placements_of", "from_local", "to_local",
           "redistribute", "from_local_shape", "ambient_mesh"]


class ShardedTensor(WrapperTensor):
    """A global tensor laid out over a DeviceMesh: this rank holds ``local``.

    The outer tensor has the global shape, stride and dtype; ``placements`` (one per mesh
    dim: ``Shard(d)``, ``Replicate()``, ``Partial(op)``) say how ``local`` relates to it, and
    ``__inner_shapes__`` states the local shape as arithmetic of the global one (torch.chunk
    sizes, ``ceil(n / k)`` on the first rank), so ``symbolic.relations`` ties them under
    dynamic shapes. Ops run on the local shards with sharding propagation (see
    ``subclass_kit.sharded._ops``); ops without a rule raise ``UnsupportedOpError``.

    Exercises: meta fields that are frozen value objects (a mesh descriptor, placements), an
    inner shape that depends on meta values, a per-rank ctx (``coord``), collectives inside
    ``__torch_dispatch__`` (traced into compiled graphs), tangent coercion (a Partial
    output's tangent arrives Replicate), and an op table organized by op family.

    Make instances with :meth:`from_local` or :func:`distribute`; direct construction
    ``ShardedTensor(local, mesh, placements, size=...)`` is the validated, non-differentiable
    equivalent.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import ShardedTensor, Shard, MeshRef
        >>> x = ShardedTensor.from_local(torch.arange(6.).reshape(3, 2), MeshRef.local(), [Shard(0)])
        >>> x.shape, x.placements, (x * 2).to_local().sum().item()
        (torch.Size([3, 2]), (Shard(0),), 30.0)
    """

    local: torch.Tensor = inner(doc="this rank's shard")
    mesh: MeshRef = meta(doc="the device mesh (a MeshRef; .device_mesh is torch's DeviceMesh)")
    placements: tuple = meta(doc="one Shard/Replicate/Partial per mesh dim")
    coord: tuple = meta(doc="this rank's coordinate on the mesh")
    # Per-instance state (not ctx): the metadata signature number for the op caches, and
    # the view op that gathered this view's shard (so its local is a copy, not a view).
    _sig: Any = state(default=None, doc="signature number of (ctx, shape, stride), see sig_of")
    _gathered_view: Any = state(default=None, doc="the view op that gathered the shard, or None")

    # The ctx's value types, for serialization.allow (torch.load(weights_only=True)).
    __safe_globals__ = (MeshRef, Shard, _StridedShard, Replicate, Partial)
    # The op rules (sharded/_ops) return what each op's schema says, tested op by op: their
    # results are not checked again on every call.
    __check_handlers__ = False

    def __new__(cls, local, mesh, placements, coord=None, *, size=None, stride=None, requires_grad=None):
        # Takes a DeviceMesh and any placements sequence, normalized here, so the ctx only
        # ever holds a MeshRef and normalized placements.
        ref = mesh_ref(mesh)
        ndim = local.dim() if size is None else len(size)
        pl = normalize_placements(placements, ref.ndim, ndim, what=cls.__name__)
        coord = ref.coordinate() if coord is None else tuple(coord)
        kwargs: dict[str, Any] = {"requires_grad": requires_grad}
        if size is not None:
            kwargs["size"] = size
            kwargs["stride"] = stride
        return super().__new__(cls, local, ref, pl, coord, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # WrapperTensor's, plus one test: once a layout the op rules do not handle exists
        # (a tensor dim sharded by two mesh dims, a strided shard), ops go by ``_ops.layouts``.
        if LAYOUTS_SEEN[0] and _any_odd(args, kwargs):
            out = LAYOUT_HOOK[0](func, args, kwargs or {})
            if out is not NotImplemented:
                return out
        return _BASE_DISPATCH(cls, func, types, args, kwargs)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        if not ctx.coord:  # a rank outside the mesh holds an empty local, as torch's
            return {"local": (0,)}
        return {"local": local_shape(outer_size, ctx.placements, ctx.mesh.shape, ctx.coord)}

    # ---- conversions (implemented at the end of this module) ---------------------------
    @classmethod
    def from_local(
        cls, local: torch.Tensor, mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None, *,
        shape: Sequence[int] | None = None, stride: Sequence[int] | None = None, run_check: bool = False,
    ) -> "ShardedTensor":
        """Make a ShardedTensor from this rank's shard (differentiable; no communication).

        Args:
            local: this rank's shard.
            mesh: a torch ``DeviceMesh`` (or a ``MeshRef``); None: the mesh of the innermost
                ``with mesh:`` block, as torch's.
            placements: one ``Shard(d)``/``_StridedShard(d, split_factor=)``/``Replicate()``/
                ``Partial(op)`` per mesh dim (default: Replicate on every mesh dim; two mesh
                dims may shard one tensor dim: see docs/sharded.md, "Layouts").
            shape, stride: the global shape and stride, both or neither (as torch); by default
                every shard is assumed to have ``local``'s shape (even sharding). Pass them for
                uneven shards. On a rank outside the mesh the local is replaced by an empty
                one, as torch's.
            run_check: check with collectives that the shards fit together (shapes, dtypes and
                requires_grad agree, replicas are equal); eager only.

        Raises:
            PlacementError, ShardShapeError: placements or shapes that do not fit.
            ShapeStrideError: ``shape=`` without ``stride=`` or the reverse (a RuntimeError too).
            ShardMetadataError: ``run_check``: another rank's shard has another dtype or
                requires_grad (or, without ``shape=``, other strides).
            MeshError: no mesh given outside a ``with mesh:`` block.

        Example:
            >>> import torch
            >>> from subclass_kit.sharded import ShardedTensor, Replicate, MeshRef
            >>> ShardedTensor.from_local(torch.ones(2), MeshRef.local(), [Replicate()]).shape
            torch.Size([2])
        """
        return from_local(local, mesh, placements, shape=shape, stride=stride, run_check=run_check)

    def to_local(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """This rank's shard as a plain tensor (differentiable; a view, no communication).

        The gradient flowing back arrives with ``grad_placements`` (default: this tensor's).

        Example:
            >>> import torch
            >>> from subclass_kit.sharded import distribute, Shard, MeshRef
            >>> distribute(torch.ones(4, 2), MeshRef.local(), [Shard(0)]).to_local().shape
            torch.Size([4, 2])
        """
        return to_local(self, grad_placements)

    def redistribute(self, mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None, *,
                     async_op: bool = False, forward_dtype: torch.dtype | None = None,
                     backward_dtype: torch.dtype | None = None) -> "ShardedTensor":
        """The same global tensor with other placements (differentiable; collectives as needed).

        ``async_op=True`` (eager, as DTensor's): return as soon as the collectives are
        issued; the result's local is a pending ``AsyncCollectiveTensor`` that waits at first
        use (under torch.compile the graph schedules the waits, and this changes nothing).

        ``forward_dtype`` (as DTensor's): cast the local to it before the forward
        collectives; the result has that dtype. ``backward_dtype``: the gradient is cast to
        it before the backward collectives (default: this tensor's dtype) and back to this
        tensor's dtype after. Mixed-precision data parallelism all-gathers in bf16 and
        reduces gradients in fp32 this way.

        The backward always brings the gradient to this tensor's placements (a Partial
        gradient of a Replicate -> Replicate move is all-reduced there), as DTensor's does.

        Example:
            >>> import torch
            >>> from subclass_kit.sharded import distribute, Shard, Replicate, MeshRef
            >>> x = distribute(torch.ones(4, 2), MeshRef.local(), [Shard(0)])
            >>> x.redistribute(x.mesh, [Replicate()]).placements
            (Replicate(),)
            >>> x.redistribute(x.mesh, [Replicate()], forward_dtype=torch.bfloat16).dtype
            torch.bfloat16
        """
        return redistribute(self, mesh, placements, async_op=async_op, forward_dtype=forward_dtype,
                            backward_dtype=backward_dtype)

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """The whole global tensor on every rank, as a plain tensor (differentiable).

        ``grad_placements`` (as DTensor's): the placements the gradient of the result
        arrives with (default: Replicate), e.g. ``[Partial()]`` when each rank's gradient is
        only its addend of the total.

        Example:
            >>> import torch
            >>> from subclass_kit.sharded import distribute, Shard, MeshRef
            >>> distribute(torch.arange(4.), MeshRef.local(), [Shard(0)]).full_tensor()
            tensor([0., 1., 2., 3.])
        """
        full = redistribute(self, None, (Replicate(),) * self.mesh.ndim)
        return to_local(full, grad_placements)

    def to_plain(self) -> torch.Tensor:
        """The dense global tensor (``full_tensor()``; a collective on a multi-rank mesh)."""
        return self.full_tensor()

    @classmethod
    def from_plain(cls, t: torch.Tensor, mesh: MeshLike | None = None,
                   placements: Sequence[Placement] | None = None) -> "ShardedTensor":
        """The checker's OpInfo hook: ``t`` as a ShardedTensor on ``mesh`` (default: the
        one-rank ``MeshRef.local()``, which needs no process group) with ``placements``
        (default ``[Shard(0)]``, or ``[Replicate()]`` for a 0-d tensor). On a one-rank mesh
        the shard is ``t`` itself; on a larger mesh use ``distribute``.

        Raises:
            ValueError: a mesh of more than one rank (this rank holds only its shard).

        Example:
            >>> import torch
            >>> ShardedTensor.from_plain(torch.arange(4.)).to_plain()
            tensor([0., 1., 2., 3.])
        """
        ref = MeshRef.local() if mesh is None else mesh_ref(mesh)
        if len(ref.ranks) != 1:
            raise ValueError(
                f"ShardedTensor.from_plain: a mesh of {len(ref.ranks)} ranks; from_plain places the "
                "whole tensor on a one-rank mesh. Use distribute(t, mesh, placements) to shard it."
            )
        if placements is None:
            placements = [Shard(0)] if t.dim() else [Replicate()]
        return cls.from_local(t, ref, placements)

    @property
    def device_mesh(self) -> DeviceMesh:
        """torch's ``DeviceMesh`` for this tensor's mesh."""
        return self.mesh.device_mesh()

    # ---- tangents ------------------------------------------------------------------------
    def __coerce_tangent_metadata__(self):
        # A gradient is never a pending sum: AOTAutograd traces the tangent of a Partial
        # output as Replicate, and the runtime tangent is brought to it below.
        # Nor a view: a gradient arrives at offset 0, so a traced tangent is not given the
        # output's offset (which the flattened ctx would carry, see __tensor_flatten__).
        out = self
        if any(type(p) is Partial for p in self.placements):
            out = relayout(self, tuple(Replicate() if type(p) is Partial else p for p in self.placements))
        if out.storage_offset() != 0:
            out = _make((out.local,), ctx_of(out), out.shape, out.stride(), 0)
        return out

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        if expected_type is not None and expected_type is not type(self):
            return super().__coerce_same_metadata_as_tangent__(expected_metadata, expected_type)
        ctx = ctx_of(self)
        if expected_metadata == ctx:
            return self
        try:
            same = (expected_metadata.mesh, expected_metadata.coord, expected_metadata.dtype) == (
                ctx.mesh, ctx.coord, ctx.dtype)
        except AttributeError:
            return None
        return relayout(self, expected_metadata.placements) if same else None

    # ---- the outer storage offset through flatten ------------------------------------------
    # The global storage offset of a view (``x[1:3]`` of a Shard(1) tensor: 48) is not its
    # local's (24), and after a gathering view (``t[1:3, :, 2:7:2].select(2, 1)``) the local
    # is a copy whose offset (4) says nothing about the global one (52). torch's unflatten
    # passes only the outer size and stride, so the flattened ctx carries a nonzero outer
    # offset: AOTAutograd rebuilds a compiled output that views an input as
    # ``input.as_strided(size, stride, output.storage_offset())`` (and autograd's
    # AsStridedBackward records those numbers), which then name the right global elements.
    # A dynamo input guard compares it too (an input view at another offset recompiles, as
    # its traced views' offsets would differ). The instance's own ctx never holds it: the op
    # caches key on that ctx. A traced output's symbolic offset is carried as "local" when it
    # is its local's for every size (a view of a replicated tensor, or along unsharded dims
    # of a first-dim shard: dynamic shapes stay dynamic), else specialized (guarded), not lost.
    def __tensor_flatten__(self):
        off = self.storage_offset()
        if type(off) is not int:
            if _compat.known_equal(off, 0):
                return _base_flatten(self)
            off = _LOCAL if _compat.known_equal(off, self.local.storage_offset()) else int(off)
        elif off == 0:  # (dynamo's guard on every input calls this on every call)
            return _base_flatten(self)
        names, ctx = _base_flatten(self)
        fields = (*ctx.fields, (_OFFSET, off))
        return names, SubclassCtx.make(ctx.owner, *zip(*fields), ctx.dtype, ctx.present)

    @classmethod
    def __tensor_unflatten__(cls, inner_tensors, ctx, outer_size, outer_stride):
        off = 0
        fields = ctx.fields
        if fields and fields[-1][0] == _OFFSET:
            off = fields[-1][1]
            if off == _LOCAL:
                off = inner_tensors["local"].storage_offset()
            names, values = zip(*fields[:-1]) if len(fields) > 1 else ((), ())
            ctx = SubclassCtx.make(ctx.owner, names, values, ctx.dtype, ctx.present)
        out = super().__tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride)
        if torch.compiler.is_dynamo_compiling() or out.storage_offset() == off:
            # (dynamo records the rebuild as one graph call that takes no offset: such a
            # rebuild -- strict export's unwrap, a backward after a graph break -- keeps the
            # local's, as before)
            return out
        return _make((out.local,), ctx, out.shape, out.stride(), off)

    @classmethod
    def __samples__(cls):
        """Instances on a one-rank mesh that needs no process group."""
        g = torch.Generator().manual_seed(3)
        m = MeshRef.local()
        a = torch.randn(8, 4, generator=g)
        return [
            cls.from_local(a, m, [Shard(0)]),
            cls.from_local(a * 2, m, [Replicate()]),  # same shape, another ctx
            cls.from_local(torch.randn(6, 5, generator=g), m, [Shard(1)]),
        ]


_BASE_DISPATCH = WrapperTensor.__torch_dispatch__.__func__  # type: ignore[attr-defined]
_compat.never_compile_frames(ShardedTensor.__torch_dispatch__.__func__)  # type: ignore[attr-defined]

#: ``LAYOUT_HOOK[0](func, args, kwargs)``: the dispatch of ops on layouts the rules do not
#: handle (set by ``_ops.layouts``); NotImplemented hands the op to its rule.
LAYOUT_HOOK: list = [lambda func, args, kwargs: NotImplemented]

# id(ctx) -> (ctx, odd): whether a ctx's layout is one the rules do not handle (a tensor dim
# sharded by two mesh dims, a strided shard) or its mesh lacks this rank. Once such a layout
# exists (a flatten's _StridedShard) every op of the process asks; this answers for an
# operand in one identity-keyed lookup, where hashing its placements (dataclasses) and
# calling the hook cost microseconds per op.
_ODD: dict = {}


def _odd(c) -> bool:
    hit = _ODD.get(id(c))
    if hit is not None and hit[0] is c:
        return hit[1]
    odd = not c.coord or not is_simple(c.placements)
    if len(_ODD) > 4096:
        _ODD.clear()
    _ODD[id(c)] = (c, odd)
    return odd


def _any_odd(args, kwargs) -> bool:
    """True when an operand (or one in a list) has an odd layout: the op goes to the hook."""
    for a in args:
        t = type(a)
        if t is ShardedTensor:
            if _odd(ctx_of(a)):
                return True
        elif t is list or t is tuple:
            for b in a:
                if type(b) is ShardedTensor and _odd(ctx_of(b)):
                    return True
    if kwargs:
        for v in kwargs.values():
            if type(v) is ShardedTensor and _odd(ctx_of(v)):
                return True
    return False

#: ``mesh, placements, coord = spec(x)``: the meta values of a ShardedTensor, read by name
#: with the lookup done once (the op handlers read them on every call).
spec = ShardedTensor.ctx_reader("mesh", "placements", "coord")
#: ``placements_of(x)``: the placements of a ShardedTensor.
placements_of = ShardedTensor.ctx_reader("placements")

_CTXS: dict = {}


def _ctx(mesh, placements, coord, dtype) -> SubclassCtx:
    key = (mesh, placements, coord, dtype)
    c = _CTXS.get(key)
    if c is None:
        c = _CTXS[key] = ShardedTensor.make_ctx(dtype=dtype, mesh=mesh, placements=placements, coord=coord)
    return c


# The hot path: the same mesh, placements and coord objects come back op after op (they
# are the inputs' and the cached plans'), so an identity-keyed lookup finds the interned
# ctx without hashing the dataclasses. Each entry holds its objects, so their ids stay valid.
_CTX_BY_ID: dict = {}


def _ctx_fast(mesh, placements, coord, dtype) -> SubclassCtx:
    hit = _CTX_BY_ID.get((id(mesh), id(placements), id(coord), dtype))
    if hit is not None and hit[0] is mesh and hit[1] is placements and hit[2] is coord:
        return hit[3]
    c = _ctx(mesh, placements, coord, dtype)
    if len(_CTX_BY_ID) > 4096:
        _CTX_BY_ID.clear()
    _CTX_BY_ID[(id(mesh), id(placements), id(coord), dtype)] = (mesh, placements, coord, c)
    return c


# The instance's metadata signature for the op caches (see ops._common): one int per
# (ctx, global shape, global stride, global storage offset), so a cache key is a tuple of small ints. Numbers are
# never reused (the table may be cleared; instances keep the numbers they were given).
_SIGS: dict = {}
_next_sig = itertools.count(1).__next__


def sig_of(ctx: SubclassCtx, shape: tuple, stride: tuple, offset=0):
    """The signature number of ``(ctx, shape, stride, offset)``; None under symbolic sizes.

    ``ctx`` is interned (held by ``_CTXS`` for the process's life), so its id names it. The
    offset is part of it: a view of a view starts where its base does (``x[2:5][1:2]``).
    """
    key = (id(ctx), shape, stride, offset)
    try:
        s = _SIGS.get(key)
    except TypeError:  # SymInts are not hashable: such instances are never cached
        return None
    if s is None:
        if len(_SIGS) > 65536:
            _SIGS.clear()
        s = _SIGS[key] = _next_sig()
    return s


class Out(NamedTuple):
    """Everything a result needs beyond its local: computed once per cached plan."""

    ctx: SubclassCtx
    shape: tuple
    stride: tuple
    offset: Any
    sig: Any
    state: dict  # the declared state of such a result (its signature number)


def out_spec(mesh, placements, coord, shape, stride, dtype, offset=0) -> Out:
    """The :class:`Out` of a result with this global metadata."""
    shape = shape if type(shape) is tuple else tuple(shape)
    stride = stride if type(stride) is tuple else tuple(stride)
    ctx = _ctx_fast(mesh, placements, coord, dtype)
    sig = sig_of(ctx, shape, stride, offset)
    return Out(ctx, shape, stride, offset, sig, {"_sig": sig})


def wrap_out_spec(local, out: Out) -> ShardedTensor:
    """A result from its local and its precomputed :class:`Out` (the per-op path)."""
    return _make((local,), out.ctx, out.shape, out.stride, out.offset, state=out.state)


def wrap(local, mesh, placements, coord, shape, stride, dtype=None, offset=0, requires_grad=False) -> ShardedTensor:
    """Trusted construction (no checks): the dispatch and conversion paths use it."""
    o = out_spec(mesh, placements, coord, shape, stride, local.dtype if dtype is None else dtype, offset)
    return _make((local,), o.ctx, o.shape, o.stride, o.offset, requires_grad, state=o.state)


_make = ShardedTensor.make
_base_flatten = WrapperTensor.__tensor_flatten__
#: The flattened ctx's extra field: the outer storage offset (see ShardedTensor.__tensor_flatten__).
_OFFSET = "storage_offset"
#: Its value for "the local's offset" (a symbolic offset that is the local's for every size).
_LOCAL = "local"


def relayout(x: ShardedTensor, placements: tuple, shape=None, stride=None) -> ShardedTensor:
    """``x`` under other (normalized) placements, below autograd (no graph recorded).

    ``shape``/``stride``: ``x``'s global shape and stride when the caller knows them from
    the trace's inputs (a backward passes its forward's): under dynamic shapes a tangent's
    outer sizes are symbols the traced graph cannot compute, and a gather needs them.
    """
    mesh, current, coord = spec(x)
    shape = x.shape if shape is None else shape
    stride = x.stride() if stride is None else stride
    local = redistribute_local(x.local, mesh, coord, current, tuple(placements), shape)
    return wrap(local, mesh, tuple(placements), coord, shape, stride, x.dtype)


def describe(x: ShardedTensor) -> str:
    """``ShardedTensor(global (8, 4), local (4, 4), placements (Shard(0),))`` for messages."""
    return (
        f"ShardedTensor(global {tuple(x.shape)}, local {tuple(x.local.shape)}, placements "
        f"{render(x.placements)})"
    )


def _register_compile_constants() -> None:
    common = ("is_shard", "is_replicate", "is_partial", "__eq__", "__ne__", "__hash__", "__repr__")
    _compat.register_compile_constants({
        Shard: (*common, "dim"),
        _StridedShard: (*common, "dim", "split_factor"),
        Replicate: common,
        Partial: (*common, "op"),
        MeshRef: ("__eq__", "__ne__", "__hash__", "__repr__", "device_type", "shape", "ranks", "dim_names",
                  "group_names", "ndim", "size", "is_local", "outside", "coordinate", "device_mesh"),
    })


_register_compile_constants()


# ---- conversions: plain <-> ShardedTensor, differentiable and compilable ----------------------
# Each public function is a thin wrapper that turns the DeviceMesh into its ``MeshRef`` (a
# constant while tracing) and calls a graph function registered with dynamo's
# ``allow_in_graph``: torch.compile records one call node for it (like torch's
# ``DTensor.from_local``) instead of tracing into the ``autograd.Function`` that builds the
# wrapper, and AOTAutograd then traces that function's forward and backward, collectives
# included, into the joint graph. All argument checking runs inside, so eager and compiled
# calls raise the same errors.

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


#: A stable number per dtype (the same in every process), for run_check's metadata gather.
_DTYPES = sorted({str(v) for v in vars(torch).values() if isinstance(v, torch.dtype)})


def _run_check(local, ref: MeshRef, pl, coord, shape, check_stride: bool) -> None:
    # Without shape= every shard is taken to have this one's shape, so (as torch's) its
    # strides must agree too: a transposed shard would be read in another order.
    mine = [_DTYPES.index(str(local.dtype)), int(local.requires_grad)]
    if check_stride:
        mine += [int(s) for s in local.stride()]
    nmeta = len(mine)
    for i, name in enumerate(ref.group_names):
        k = ref.shape[i]
        if k == 1:
            continue
        sizes = torch.tensor([*mine, *(int(s) for s in local.shape)], dtype=torch.int64)
        got = waited(_coll.all_gather_tensor(sizes, 0, name)).reshape(k, -1).tolist()
        for c in range(k):
            other = coord[:i] + (c,) + coord[i + 1:]
            theirs, got[c] = got[c][:nmeta], got[c][nmeta:]
            if theirs[:2] != mine[:2]:
                _meta_error(other, coord, *(("dtype", _DTYPES[theirs[0]], local.dtype) if theirs[0] != mine[0]
                                            else ("requires_grad", bool(theirs[1]), local.requires_grad)))
            want = list(local_shape(shape, pl, ref.shape, other))
            if got[c] != want:
                raise ShardShapeError(
                    f"ShardedTensor.from_local(run_check=True): the rank at coordinate {other} holds "
                    f"a local tensor of shape {tuple(got[c])}, but its shard of the global shape "
                    f"{_fmt(shape)} under {render(pl)} has shape {tuple(want)}. Every rank must "
                    "pass its own shard and the same shape=."
                )
            if theirs != mine:
                _meta_error(other, coord, "stride", tuple(theirs[2:]), local.stride())
        if type(pl[i]) is Replicate:
            first = waited(_coll.broadcast(local.detach(), 0, name))
            if not torch.equal(first, local.detach()):
                raise ShardShapeError(
                    f"ShardedTensor.from_local(run_check=True): placements[{i}] is Replicate() but "
                    f"the local tensor at coordinate {coord} differs from the one at coordinate 0 of "
                    f"mesh dim {i}. Pass equal replicas (e.g. broadcast first), or use Partial() if "
                    "the locals are operands of a sum."
                )


def _meta_error(other, coord, field, theirs, ours):
    raise ShardMetadataError(
        f"ShardedTensor.from_local(run_check=True): the rank at coordinate {other} holds a "
        f"local tensor with {field}={theirs}, this rank's (coordinate {coord}) has "
        f"{field}={ours}. Every rank's shard must have the same dtype and requires_grad (and, "
        "without shape=/stride=, the same strides); convert them alike (e.g. .to(dtype), "
        ".requires_grad_(), .contiguous()) before from_local."
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
            return (redistribute_local(grad.local, mesh, coord, placements_of(grad), target, grad.shape),
                    None, None, None, None, None)
        # A plain (global) gradient: keep this rank's part of it.
        full = (Replicate(),) * len(placements)
        return redistribute_local(grad, mesh, coord, full, target, grad.shape), None, None, None, None, None


class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_placements):
        mesh, placements, coord = spec(x)
        ctx.spec = (mesh, grad_placements or placements, coord, x.shape, x.stride(), x.dtype)
        return x.local.view_as(x.local)

    @staticmethod
    def backward(ctx, grad):
        mesh, placements, coord, shape, stride, dtype = ctx.spec
        if isinstance(grad, ShardedTensor):
            raise TypeError("ShardedTensor.to_local: the gradient of a local tensor must be a plain tensor")
        return wrap(grad, mesh, placements, coord, shape, stride, dtype), None


def _cast(x: ShardedTensor, dtype) -> ShardedTensor:
    """``x`` with its local cast to ``dtype``, below autograd (no communication)."""
    if dtype is None or x.dtype == dtype:
        return x
    mesh, placements, coord = spec(x)
    return wrap(x.local.to(dtype), mesh, placements, coord, x.shape, x.stride(), dtype)


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, placements, async_op=False, forward_dtype=None, backward_dtype=None):
        mesh, ctx.src, coord = spec(x)
        ctx.where = (mesh, coord, x.shape, x.stride())
        # The backward collective runs in backward_dtype (default: the input's), and the
        # gradient returns in the input's dtype, as DTensor's.
        ctx.dtypes = (backward_dtype or x.dtype, x.dtype)
        x = _cast(x, forward_dtype)
        if async_op:
            from ._comm import async_op as pending

            with pending():
                return relayout(x, placements)
        return relayout(x, placements) if placements != ctx.src else wrap(
            x.local.view_as(x.local), mesh, placements, coord, x.shape, x.stride(), x.dtype)

    @staticmethod
    def backward(ctx, grad):
        # The gradient of a Partial input is the whole gradient: Replicate, or, when it
        # arrives as the same Partial, left pending (as DTensor's: no collective here).
        gpl = placements_of(grad) if isinstance(grad, ShardedTensor) else (None,) * len(ctx.src)
        target = tuple(Replicate() if type(p) is Partial and g != p else p for p, g in zip(ctx.src, gpl))
        op_dtype, out_dtype = ctx.dtypes
        if not isinstance(grad, ShardedTensor):
            # A plain gradient is the whole global gradient: this rank keeps its part.
            mesh, coord, shape, stride = ctx.where
            g = redistribute_local(grad.to(op_dtype), mesh, coord, (Replicate(),) * len(target), target, shape)
            return wrap(g.to(out_dtype), mesh, target, coord, shape, stride, out_dtype), None, None, None, None
        grad = _cast(grad, op_dtype)
        if placements_of(grad) != target:
            # The forward's global shape, not the tangent's: under dynamic shapes the tangent's
            # outer sizes are fresh symbols the backward graph has no input for (a gather's
            # narrow to them made AOTAutograd recurse forever), the forward's are traced values.
            _, _, shape, stride = ctx.where
            grad = relayout(grad, target, shape, stride)
        return _cast(grad, out_dtype), None, None, None, None


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
        if coord:
            _check_local_shape(local, shape, pl, ref, coord)
    if not coord:  # outside the mesh: the local is empty, as torch's
        stride = contiguous_strides(shape) if stride is None else stride
        local = local.new_empty(0).requires_grad_(local.requires_grad)
        run_check = False
    check_stride = stride is None
    stride = _strides_like(shape, local) if stride is None else tuple(stride)
    if run_check and not is_compiling():
        _run_check(local, ref, pl, coord, shape, check_stride)
    return _FromLocal.apply(local, ref, pl, coord, tuple(shape), stride)


@_compat.allow_in_graph
def _to_local(x, grad_placements):
    if not isinstance(x, ShardedTensor):
        raise TypeError(f"to_local() needs a ShardedTensor, got {type(x).__name__}.")
    if grad_placements is not None:
        grad_placements = normalize_placements(
            grad_placements, x.mesh.ndim, x.dim(), what="ShardedTensor.to_local(grad_placements=)"
        )
    return _ToLocal.apply(x, grad_placements)


@_compat.allow_in_graph
def _redistribute(x, ref, placements, async_op=False, forward_dtype=None, backward_dtype=None):
    mesh, current, _ = spec(x)
    if ref is not None and ref != mesh:
        raise MeshError(
            f"ShardedTensor.redistribute: the tensor lives on {mesh} but mesh={ref} was given; "
            "moving between meshes is not supported. Pass the tensor's own mesh (or None)."
        )
    pl = current if placements is None else normalize_placements(
        placements, mesh.ndim, x.dim(), what="ShardedTensor.redistribute"
    )
    if forward_dtype == x.dtype:
        forward_dtype = None
    if pl == current and forward_dtype is None and (backward_dtype is None or not x.requires_grad):
        # Nothing moves; but a gradient must still come back in this tensor's placements
        # (to_local(grad_placements=[Partial()]) of a Replicate one: the backward reduces it).
        if not (x.requires_grad and torch.is_grad_enabled()):
            return x
    return _Redistribute.apply(x, pl, bool(async_op), forward_dtype, backward_dtype)


# ---- public -------------------------------------------------------------------------------
def from_local(local, mesh, placements=None, *, shape=None, stride=None, run_check=False) -> ShardedTensor:
    """See :meth:`ShardedTensor.from_local`."""
    if (shape is None) != (stride is None):
        raise ShapeStrideError(
            f"ShardedTensor.from_local: got shape={shape} and stride={stride}; pass both shape= and "
            "stride= (the global tensor's, the same on every rank) or neither, as torch's "
            "DTensor.from_local requires."
        )
    ref = ambient_mesh(mesh, "ShardedTensor.from_local")
    if placements is None:
        placements = [Replicate()] * ref.ndim
    return from_local_shape(local, ref, placements, shape, stride, run_check)


def from_local_shape(local, mesh, placements, shape=None, stride=None, run_check=False) -> ShardedTensor:
    """``from_local`` for the kit's own callers: ``shape`` alone is allowed (the stride then
    follows the local's layout)."""
    return _from_local(local, mesh_ref(mesh), list(placements) if isinstance(placements, (list, tuple)) else placements,
                       None if shape is None else tuple(shape), None if stride is None else tuple(stride), run_check)


def ambient_mesh(mesh, where: str) -> MeshRef:
    """``mesh``'s MeshRef, or the innermost ``with mesh:`` block's when ``mesh`` is None."""
    if mesh is None:
        mesh = _compat.current_device_mesh()
        if mesh is None:
            raise MeshError(
                f"{where}: no mesh given and no `with mesh:` block is active; pass the DeviceMesh "
                "or call inside `with mesh:`."
            )
    return mesh_ref(mesh)


def to_local(x, grad_placements=None) -> torch.Tensor:
    """See :meth:`ShardedTensor.to_local`."""
    return _to_local(x, None if grad_placements is None else list(grad_placements))


def redistribute(x, mesh=None, placements=None, *, async_op: bool = False, forward_dtype=None,
                 backward_dtype=None) -> ShardedTensor:
    """See :meth:`ShardedTensor.redistribute`."""
    return _redistribute(x, None if mesh is None else mesh_ref(mesh), None if placements is None else list(placements),
                         async_op, forward_dtype, backward_dtype)
