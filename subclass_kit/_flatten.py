"""The PT2 subclass protocol, derived from the class spec.

The round-trip law every traceable wrapper subclass must satisfy, stated once:

    names, ctx = t.__tensor_flatten__()
    u = type(t).__tensor_unflatten__({n: getattr(t, n) for n in names}, ctx, size, stride)
    => type(u) is type(t), u.__tensor_flatten__()[1] == ctx,
       u.shape == size and u.stride() == stride for ANY size/stride torch passes
       (real, fake, meta or symbolic), and getattr(u, n) is the tensor given for n.

Dynamo re-creates inputs this way with fake inner tensors and symbolic outer sizes;
AOTAutograd re-creates outputs and tangents this way at runtime. Everything here honours
the outer size and stride it is given instead of re-deriving them from inner tensors.
"""

from __future__ import annotations

import copy

import torch

from symbolic import FREE
from symbolic.shape_relations import inner_shapes_of, multiple_of

from . import _compat
from ._construct import check_parts, contiguous_strides
from .errors import CheckpointError, SubclassKitError
from .ctx import _PRESENT, SubclassCtx

_SymInt = torch.SymInt
_Tensor = torch.Tensor

__all__ = [
    "tensor_flatten",
    "tensor_unflatten",
    "graph_rebuild",
    "stable_hash",
    "rebuild",
    "reduce_ex",
    "deepcopy",
    "wrapper_repr",
]

def tensor_flatten(self):
    # Dynamo's guard on a wrapped input calls this on every call of the compiled function:
    # the present names by the ctx's own index, not its property (a Python call, ~150 ns).
    ctx = self._kit_ctx
    return list(ctx[_PRESENT]), ctx


def tensor_unflatten(cls, inner_tensors, ctx, outer_size, outer_stride):
    kit = cls.__kit__
    inners = tuple([inner_tensors.get(n) for n in kit.inner_names])
    if torch.compiler.is_dynamo_compiling():
        # Dynamo traces this call: user code that dynamo compiles (the parametrization of
        # unwrap_tensor_subclass_parameters under strict export), or this function compiled
        # as a frame of its own (AOTAutograd's runtime calls it while a compiled function
        # runs ``backward()`` after a graph break). Dynamo cannot trace the wrapper's
        # construction; it records one call of the same trusted rebuild (see graph_rebuild).
        size = None if outer_size is None else tuple(outer_size)
        stride = None if outer_stride is None else tuple(outer_stride)
        return kit.graph_rebuild(inners, ctx.owner, ctx.fields, ctx.dtype, ctx.present, size, stride)
    return _unflatten(cls, inners, ctx, outer_size, outer_stride)


def _unflatten(cls, inners, ctx, outer_size, outer_stride):
    """The trusted rebuild (the class's ``make``), honouring the outer size and stride it is given."""
    primary = inners[0]
    if outer_size is None:
        outer_size = primary.shape
        outer_stride = primary.stride() if outer_stride is None else outer_stride
    elif outer_stride is None:
        outer_stride = contiguous_strides(outer_size)
    offset = primary.storage_offset() if primary.dim() == len(outer_size) else 0
    # Symbolic sizes come only with traced (fake, functional) inner tensors: a plain primary
    # (AOTAutograd rebuilding a compiled function's output at run time) skips the scan.
    if type(primary) is not _Tensor and any(type(s) is _SymInt for s in outer_size):
        _record_relations(cls, inners, ctx, outer_size)
    return cls.__kit__.make(inners, ctx, outer_size, outer_stride, offset)


# Every class's graph_rebuild function, alive for the process: dynamo's allow_in_graph
# recognises a function by its id, which must not be reused by another object.
_GRAPH_REBUILDS: list = []


def graph_rebuild(cls):
    """``cls``'s trusted rebuild as one function dynamo records as a single graph node.

    Its arguments are what a graph can hold: tensors, sizes, and the ctx taken apart into
    constants (a class cannot be a graph argument, hence one function per class, made when
    the class is). It rebuilds exactly as ``__tensor_unflatten__`` does outside dynamo;
    the user-facing constructor (``__new__``, whose signature a class may change) is not
    involved.
    """

    def rebuild(inners, owner, fields, dtype, present, size, stride):
        ctx = SubclassCtx.make(owner, tuple([n for n, _ in fields]), tuple([v for _, v in fields]), dtype, present)
        return _unflatten(cls, inners, ctx, size, stride)

    rebuild.__name__ = "graph_rebuild"
    rebuild.__qualname__ = f"{cls.__qualname__}.graph_rebuild"
    _GRAPH_REBUILDS.append(rebuild)
    return _compat.allow_in_graph(rebuild)


def _record_relations(cls, inners, ctx, outer_size) -> None:
    """Tell dynamo the declared relations between the symbolic outer size and the inner sizes.

    Dynamo fakeifies an input wrapper by giving its inner tensors symbols of their own and
    calling ``__tensor_unflatten__`` with a symbolic outer size. A class that recomputes its
    outer size from its inner tensors makes torch compare the two, which records the
    relation (``Eq(2*s50, s77)``); honouring ``outer_size`` as we do would leave dynamo with
    unrelated symbols. ``torch._check`` on each declared equality puts it in the shape
    environment, so dynamo's guards carry it and ``guards.build`` predicts the same.

    Only plain inner tensors: a nested wrapper's own sizes are related inside its own
    unflatten, and relating them here would pin the outer symbol to the size dynamo gives
    that wrapper.
    """
    outer = tuple(outer_size)
    shapes = cls.__inner_shapes__(outer, ctx)
    exprs = None
    for name, t in zip(cls.__kit__.inner_names, inners):
        if t is None or name not in shapes or hasattr(type(t), "__tensor_flatten__"):
            continue
        for j, (got, want) in enumerate(zip(t.shape, shapes[name])):
            if want is FREE or (type(got) is int and type(want) is int):
                continue  # both static: TENSOR_MATCH pins them
            if exprs is None:
                exprs = inner_shapes_of(cls, len(outer), ctx) or {}
            m = multiple_of(exprs[name][j]) if name in exprs else None
            if m is not None:
                k, a, sym = m
                s = outer[int(sym.name[1:])]
                hg, hs = _compat.size_hint(got), _compat.size_hint(s)
                if hg is not None and hs is not None and k * hg == a * hs:
                    # The outer size is a multiple of this inner size: say it as torch's own
                    # classes do (outer = k * inner), so dynamo's guards read Eq(2*s50, s77).
                    _compat.sym_check(k * got == a * s)
                    continue
            _compat.sym_check(got == want)


def stable_hash(self) -> str:
    """``guards.cache_key(self)``: canonical JSON + sha256 of class, ctx and every guarded
    property (dtype, device, requires_grad, static sizes and strides, dynamic dims by
    their marks). The same in every process (no ``hash()``, ids or addresses), equal
    exactly when the same compiled artifact may serve, and defined for the fake tensors
    with symbolic sizes AOTAutograd hashes (where pickling the sizes would fail)."""
    from guards import cache_key

    return cache_key(self)


def rebuild(cls, inners: dict, ctx, size, stride, requires_grad, is_param=False):
    """Inverse of ``reduce_ex``; also the function ``torch.load(weights_only=True)`` must allow.

    The parts come from a file, so they get construction's checks first (``check_parts``):
    a forged or corrupt checkpoint raises ``CheckpointError`` here, not later in an op.
    """
    spec = getattr(cls, "__dict__", {}).get("__kit_spec__") if isinstance(cls, type) else None
    if spec is None or not spec.inner:
        raise CheckpointError(
            f"rebuild() was asked to build {cls!r}, which is not a WrapperTensor subclass with "
            "inner tensors; the checkpoint is not one the kit wrote."
        )
    try:
        check_parts(cls, inners, ctx, size, stride)
    except SubclassKitError as e:
        raise CheckpointError(
            f"a saved {spec.qualname} fails the checks its construction applies: "
            f"{e} The checkpoint is corrupt or was not written by this class."
        ) from e
    return _rebuild(cls, inners, ctx, size, stride, requires_grad, is_param)


def _rebuild(cls, inners: dict, ctx, size, stride, requires_grad, is_param=False):
    out = tensor_unflatten(cls, inners, ctx, torch.Size(size), tuple(stride))
    if is_param:
        # nn.Parameter(wrapper) keeps the wrapper's type and sets _is_param; keep that too.
        return torch.nn.Parameter(out, requires_grad=requires_grad)
    if requires_grad:
        out.requires_grad_(True)
    return out


def reduce_ex(self, proto):
    d = self.__dict__
    inners = {n: d[n] for n in self._kit_ctx.present}
    return (
        rebuild,
        (
            type(self),
            inners,
            self._kit_ctx,
            tuple(self.shape),
            tuple(self.stride()),
            self.requires_grad,
            bool(getattr(self, "_is_param", False)),
        ),
    )


def deepcopy(self, memo):
    if id(self) in memo:
        return memo[id(self)]
    d = self.__dict__
    inners = {n: copy.deepcopy(d[n], memo) for n in self._kit_ctx.present}
    out = _rebuild(  # our own parts: no need to check them again
        type(self),
        inners,
        self._kit_ctx,
        self.shape,
        self.stride(),
        self.requires_grad,
        bool(getattr(self, "_is_param", False)),
    )
    memo[id(self)] = out
    return out


def wrapper_repr(self) -> str:
    cls = type(self)
    d = self.__dict__
    parts = [f"{n}={d[n]!r}" for n in self._kit_ctx.present]
    parts += [f"{n}={v!r}" for n, v in self._kit_ctx.fields]
    parts.append(f"size={tuple(self.shape)}")
    parts.append(f"dtype={self.dtype}")
    if self.requires_grad:
        parts.append("requires_grad=True")
    body = ",\n  ".join(p.replace("\n", "\n  ") for p in parts)
    return f"{cls.__name__}(\n  {body})"
