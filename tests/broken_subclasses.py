"""Deliberately broken wrapper subclasses: the proof that ``check_subclass`` finds bugs.

``GoodPair`` is a correct wrapper subclass written on torch's raw protocol (no kit base
class): two inner tensors run every op side by side (TwoTensor style), a ``tag`` meta value
rides in the ctx, ``to_plain()`` is the first inner tensor. Every other class here is a
``GoodPair`` with exactly one bug of a kind authors really make; ``BUGS`` lists each with
the check that must flag it and words its message must contain.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing

aten = torch.ops.aten

__all__ = ["GoodPair", "BUGS", "Bug"]


class GoodPair(torch.Tensor):
    """A correct raw-protocol wrapper: inner ``a`` and ``b`` of the outer shape, meta ``tag``."""

    # Per-class hooks the broken variants use: op -> handler, and ops to refuse.
    _overrides: dict = {}
    _missing: frozenset = frozenset()

    @staticmethod
    def __new__(cls, a, b, tag="pair", outer_size=None, outer_stride=None):
        if outer_size is None:
            outer_size, outer_stride = a.shape, a.stride()
        elif outer_stride is None:
            outer_stride = torch._prims_common.make_contiguous_strides_for(outer_size)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            outer_size,
            strides=outer_stride,
            storage_offset=a.storage_offset() if a.dim() == len(outer_size) else 0,
            dtype=a.dtype,
            device=a.device,
            requires_grad=a.requires_grad,
        )

    def __init__(self, a, b, tag="pair", outer_size=None, outer_stride=None):
        self.a, self.b, self.tag = a, b, tag

    __torch_function__ = torch._C._disabled_torch_function_impl

    # ---- protocol ------------------------------------------------------------------------
    def _ctx(self):
        return ("pair", self.tag)

    @classmethod
    def _tag_from(cls, ctx):
        return ctx[1]

    def __tensor_flatten__(self):
        return ["a", "b"], self._ctx()

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["a"], inner["b"], cls._tag_from(ctx), outer_size, outer_stride)

    def _stable_hash_for_caching(self) -> str:
        payload = [type(self).__qualname__, self.tag, [str(s) for s in self.shape], bool(self.requires_grad)]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()

    def to_plain(self):
        return self.a

    def __repr__(self):
        return f"{type(self).__name__}(a={self.a!r}, b={self.b!r}, tag={self.tag!r})"

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
        c, d = torch.randn(8, 3, generator=g), torch.randn(8, 3, generator=g)
        return [cls(a, b, "pair"), cls(c, d, "pair"), cls(a.clone(), b.clone(), "other")]

    # ---- ops -----------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = next(t for t in types if issubclass(t, GoodPair))
        if func in owner._missing:
            raise NotImplementedError(f"{owner.__name__} does not support {func}")
        handler = owner._overrides.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        return _map_both(func, args, kwargs)


def _map_both(func, args, kwargs, tag=None):
    pairs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, GoodPair)]
    cls = type(pairs[0])
    tag = pairs[0].tag if tag is None else tag
    args_a, kwargs_a = pytree.tree_map_only(GoodPair, lambda x: x.a, (args, kwargs))
    args_b, kwargs_b = pytree.tree_map_only(GoodPair, lambda x: x.b, (args, kwargs))
    out_a = func(*args_a, **kwargs_a)
    out_b = func(*args_b, **kwargs_b)
    flat_a, spec = pytree.tree_flatten(out_a)
    flat_b = pytree.tree_leaves(out_b)
    out = pytree.tree_unflatten(
        [cls(x, y, tag) if isinstance(x, torch.Tensor) else x for x, y in zip(flat_a, flat_b)], spec
    )
    return return_and_correct_aliasing(func, args, kwargs, out)


# ---- 1. unflatten ignores outer_size / outer_stride ----------------------------------------
class IgnoresOuterSize(GoodPair):
    """Bug: __tensor_unflatten__ rebuilds the outer size and stride from the inner tensors."""

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["a"], inner["b"], ctx[1])


# ---- 2. unhashable ctx ---------------------------------------------------------------------
class UnhashableCtx(GoodPair):
    """Not a bug for torch: the ctx is a list (dynamo compares it with ==, never hashes it)."""

    def _ctx(self):
        return ["pair", self.tag]


# ---- 3. mutable ctx ------------------------------------------------------------------------
class PairMeta:
    """A ctx object with value equality and a hash, but reassignable attributes."""

    def __init__(self, tag):
        self.tag = tag

    def __eq__(self, other):
        return isinstance(other, PairMeta) and other.tag == self.tag

    def __hash__(self):
        return hash(("PairMeta", self.tag))

    def __repr__(self):
        return f"PairMeta({self.tag!r})"


class MutableCtx(GoodPair):
    """Not a bug for torch: the ctx is a mutable object (dynamo guards on a deepcopy)."""

    def _ctx(self):
        return PairMeta(self.tag)

    @classmethod
    def _tag_from(cls, ctx):
        return ctx.tag


# ---- 4. stable hash that differs across processes -------------------------------------------
class UnstableHash(GoodPair):
    """Bug: _stable_hash_for_caching uses hash(), which depends on PYTHONHASHSEED."""

    def _stable_hash_for_caching(self) -> str:
        return str(hash((type(self).__qualname__, self.tag)))


# ---- 5. a view op handled without aliasing ---------------------------------------------------
def _copying_view(func, args, kwargs):
    x = args[0]
    return type(x)(func(x.a, *args[1:]).contiguous(), func(x.b, *args[1:]).contiguous(), x.tag)


class ViewCopies(GoodPair):
    """Bug: t/transpose return contiguous copies instead of views of the inner tensors."""

    _overrides = {aten.t.default: _copying_view, aten.transpose.int: _copying_view}


# ---- 6. an in-place op that updates one inner tensor only ------------------------------------
def _add_inplace_first_only(func, args, kwargs):
    x, other = args[0], args[1]
    x.a.add_(other.a if isinstance(other, GoodPair) else other)
    return x


class InplaceOneInner(GoodPair):
    """Bug: add_ updates inner ``a`` and forgets ``b``."""

    _overrides = {aten.add_.Tensor: _add_inplace_first_only}


# ---- 7. a missing op -------------------------------------------------------------------------
class MissingClone(GoodPair):
    """Bug: aten.clone is not supported (deepcopy, compile and autograd need it)."""

    _missing = frozenset({aten.clone.default})


# ---- 8. data-dependent Python branching in an op ---------------------------------------------
def _mul_with_branch(func, args, kwargs):
    x = args[0]
    if bool((x.a.abs() > 1e6).any()):  # a Python branch on tensor values: a graph break
        raise OverflowError("values too large")
    return _map_both(func, args, kwargs)


class DataDependentBranch(GoodPair):
    """Bug: the mul handler branches in Python on the tensor's values."""

    _overrides = {aten.mul.Tensor: _mul_with_branch}


# ---- 9. a tangent whose metadata differs from the forward output -----------------------------
def _ones_like_resets_tag(func, args, kwargs):
    return _map_both(func, args, kwargs, tag="pair")


class TangentMetadata(GoodPair):
    """Bug: ones_like (which makes tangents) resets the tag, so a tangent's ctx differs from
    the forward output's, and the class has no __coerce_same_metadata_as_tangent__."""

    _overrides = {aten.ones_like.default: _ones_like_resets_tag}

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(1)
        return [cls(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), "scaled")]


# ---- 10. inner tensors on different devices ---------------------------------------------------
class MixedDevices(GoodPair):
    """Bug: inner ``b`` lives on another device than ``a`` (and the outer tensor)."""

    @classmethod
    def __samples__(cls):
        a = torch.randn(4, 6)
        return [cls(a, torch.empty(4, 6, device="meta"))]


# ---- 11. a ctx holding a tensor -----------------------------------------------------------------
class TensorInCtx(GoodPair):
    """Bug: a calibration tensor (amax) is kept in the ctx instead of as an inner tensor."""

    @staticmethod
    def __new__(cls, a, b, tag="pair", outer_size=None, outer_stride=None, amax=None):
        return GoodPair.__new__(cls, a, b, tag, outer_size, outer_stride)

    def __init__(self, a, b, tag="pair", outer_size=None, outer_stride=None, amax=None):
        super().__init__(a, b, tag, outer_size, outer_stride)
        self.amax = a.detach().abs().amax() if amax is None else amax

    def _ctx(self):
        return ("pair", self.tag, self.amax)

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["a"], inner["b"], ctx[1], outer_size, outer_stride, amax=ctx[2])


# ---- 12. a class defined inside a function ------------------------------------------------------
def make_local_pair():
    """A GoodPair subclass defined in a function: not importable by its qualified name."""

    class LocalPair(GoodPair):
        pass

    return LocalPair


# ---- 13. a ctx whose == ignores the meta value ---------------------------------------------------
@dataclass(frozen=True, eq=False)
class LooseMeta:
    """Compares equal to any other LooseMeta: the guard cannot see a tag change."""

    tag: str

    def __eq__(self, other):
        return isinstance(other, LooseMeta)

    def __hash__(self):
        return hash("LooseMeta")


class CtxEqIgnoresTag(GoodPair):
    """Bug: the ctx's == ignores the tag, so dynamo reuses a graph compiled for another tag."""

    def _ctx(self):
        return LooseMeta(self.tag)

    @classmethod
    def _tag_from(cls, ctx):
        return ctx.tag


# ---- the table the tests read --------------------------------------------------------------------
@dataclass(frozen=True)
class Bug:
    """One broken class, the row that must fail, and words its message must contain."""

    cls: object  # a class, or a zero-argument function returning one
    check: str
    words: tuple

    def resolve(self):
        return self.cls() if not isinstance(self.cls, type) else self.cls


BUGS = [
    Bug(IgnoresOuterSize, "protocol.round_trip_outer_stride", ("outer_stride", "ignored")),
    Bug(UnstableHash, "identity.stable_hash", ("_stable_hash_for_caching", "differs across processes", "Fix:")),
    Bug(ViewCopies, "eager[aten.t.default(x)]", ("view op", "does not share storage", "Fix:")),
    Bug(InplaceOneInner, "eager[aten.add_.Tensor(x.clone(), x)]", ("inner 'b'", "in-place", "Fix:")),
    Bug(MissingClone, "eager[aten.clone.default(x)]", ("does not support", "aten.clone.default", "Fix:")),
    Bug(DataDependentBranch, "compile[eager]", ("aten.mul.Tensor", "data-dependent", "_mul_with_branch", "Fix:")),
    Bug(TangentMetadata, "backward.compiled[aot_eager]", ("tangent", "ctx", "__coerce_same_metadata_as_tangent__")),
    Bug(MixedDevices, "protocol.inner_devices", ("inner 'b'", "meta", "cpu", "Fix:")),
    Bug(TensorInCtx, "ctx.tensor_free", ("holds a tensor", "ctx[2]", "inner", "Fix:")),
    Bug(make_local_pair, "identity.importable", ("defined inside a function", "module level")),
    Bug(CtxEqIgnoresTag, "compile.meta_change[aot_eager]", ("did not recompile", "equal", "Fix:")),
]
