"""Walks a value the way dynamo wraps a frame's inputs and collects the guards it would install.

Order follows dynamo's ``VariableBuilder``: a container's type and length (or keys) before
its items; a wrapped tensor's type, ctx and inner names, its own TENSOR_MATCH and marks,
then its inner tensors; aliasing, ``__inner_shapes__`` relations and shape guards (duck
sizing, stride relations, ranges) after every input has been seen, as dynamo emits its
ShapeEnv guards last.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import _compat
from ._autodynamic import FrameState
from ._dims import DimKind, Marks, policy_marks, read_marks, split_policy
from ._kinds import (
    CtxMatch,
    Guard,
    InnerNames,
    KeysMatch,
    Layout,
    LenMatch,
    MarkMatch,
    NoAliasing,
    NotNan,
    Relation,
    ShapeEquality,
    ShapeRange,
    SpecMatch,
    TensorMatch,
    TypeMatch,
    ValueMatch,
)
from ._canonical import type_name
from ._shapes import ShapeSim
from ._sources import AttrSource, InnerSource, ItemSource, SizeSource, Source, rebase
from .errors import PolicyViolationError, UnhashableContextError, UnsupportedValueError

__all__ = ["Collected", "collect"]

# Leaves dynamo specializes on by value (EQUALS_MATCH / ID_MATCH).
_VALUE_LEAVES = (bool, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
                 torch.memory_format, enum.Enum, complex)


@dataclass
class Collected:
    """The guards for one frame of inputs, in dynamo's order, plus the tensors matched."""

    guards: list = field(default_factory=list)
    tensor_matches: list = field(default_factory=list)  # TensorMatch, in order
    sim: ShapeSim | None = None
    examples: list | None = None  # the matched tensors, only while compiling the check


class _Walker:
    def __init__(self, *, dynamic: bool | None, state: FrameState | None, render: Callable[[Source], str]):
        self.dynamic = dynamic
        self.state = state
        self.render = render
        self.sim = ShapeSim()
        self.out = Collected(sim=self.sim)
        self.tensors: list[tuple[Source, torch.Tensor]] = []
        self.wrappers: list[tuple[Source, torch.Tensor]] = []
        self.marks_of: dict = {}
        self._seen: dict[int, Source] = {}

    def add(self, g: Guard) -> None:
        self.out.guards.append(g)

    # -- containers and leaves ---------------------------------------------------------
    def visit(self, v: Any, src: Source, policy: Any, nested: bool = False) -> None:
        if isinstance(v, torch.Tensor):
            self.tensor(v, src, policy, nested)
        elif isinstance(v, (list, tuple)):
            self.add(TypeMatch(src, type(v)))
            self.add(LenMatch(src, len(v)))
            sub = policy if isinstance(policy, (list, tuple)) and len(policy) == len(v) else None
            for i, x in enumerate(v):
                self.visit(x, ItemSource(i, src), None if sub is None else sub[i])
        elif isinstance(v, dict):
            self.add(TypeMatch(src, type(v)))
            for k in v:
                if not isinstance(k, (str, int, bool, type(None), enum.Enum)):
                    raise UnsupportedValueError(
                        f"{self.render(src)} has a key {k!r} ({type(k).__name__}); only str, int, "
                        "bool, None and Enum keys can be guarded. Use a list or a str-keyed dict."
                    )
            self.add(KeysMatch(src, tuple(v)))
            sub = policy if isinstance(policy, dict) else {}
            for k, x in v.items():
                self.visit(x, ItemSource(k, src), sub.get(k))
        elif isinstance(v, _VALUE_LEAVES):
            self.add(ValueMatch(src, v))
        elif type(v) is int or type(v) is float:
            if self._scalar_dynamic(src, v):
                self.add(TypeMatch(src, type(v), structural=False))
                if type(v) is float:
                    self.add(NotNan(src))
            else:
                self.add(ValueMatch(src, v))
        else:
            # An arbitrary object: dynamo guards it by type plus whatever attributes the
            # traced code reads; only the type is modelled here.
            self.add(TypeMatch(src, type(v), structural=False))

    def _scalar_dynamic(self, src, v) -> bool:
        if self.dynamic is True:
            return True
        if self.state is None:
            return False
        return self.state.record_scalar(self.render(src), v)

    # -- tensors -----------------------------------------------------------------------
    def _marks(self, t, policy, nested) -> Marks:
        if policy is None:
            return read_marks(t)
        outer, _ = split_policy(policy)
        return policy_marks(outer, t.dim(), nested=nested)

    def _kinds(self, t, src, marks: Marks):
        """Per-dim ``(kind, lo, hi)`` and per-dim stride dynamism, dynamo's precedence."""
        entry = None
        if self.state is not None and not _compat.is_fake(t):
            strict = [i for i, d in marks.dims.items() if d.kind == "dynamic"]
            entry = self.state.record_tensor(self.render(src), tuple(t.size()), tuple(t.stride()), strict)
        kinds, stride_dyn = [], []
        for i in range(t.dim()):
            d = marks.dims.get(i)
            mk = d.kind if d is not None else None
            auto = entry is not None and entry.size_dynamic(i)
            if mk == "unbacked":
                kinds.append((DimKind.UNBACKED, None, None))
            elif mk == "dynamic":
                kinds.append((DimKind.DYNAMIC, d.min, d.max))
            elif mk == "auto" or (auto and mk != "static"):
                kinds.append((DimKind.DYNAMIC, None, None))
            elif self.dynamic is not True or mk == "static":
                kinds.append((DimKind.STATIC, None, None))
            else:
                kinds.append((DimKind.DUCK, None, None))
            stride_dyn.append(mk is None and entry is not None and entry.stride_dynamic(i))
        return kinds, stride_dyn

    def tensor(self, t: torch.Tensor, src: Source, policy: Any, nested: bool) -> None:
        first = self._seen.get(id(t))
        if first is not None:
            # The same tensor object again: dynamo guards it only by identity with the
            # first source (``L['y'] is L['x']``).
            self.tensors.append((src, t))
            return
        self._seen[id(t)] = src
        if _compat.is_dtensor(t):
            self.dtensor(t, src, policy)
            return
        wrapper = _compat.is_traceable_wrapper_subclass(t)
        cls = torch.Tensor if _compat.is_fake(t) else type(t)
        marks = self._marks(t, policy, nested and wrapper)
        self.marks_of[src] = marks
        if wrapper and nested and any(d.kind == "dynamic" for d in marks.dims.values()):
            raise PolicyViolationError(
                f"{self.render(src)} is a wrapper inside a wrapper marked with mark_dynamic on "
                f"dims {sorted(i for i, d in marks.dims.items() if d.kind == 'dynamic')}; dynamo "
                "fakeifies it from its concrete outer size and raises ConstraintViolationError. "
                "Mark it with torch._dynamo.maybe_mark_dynamic (symbolic.apply does this)."
            )
        if wrapper:
            self.add(TypeMatch(src, cls))
            names, ctx = t.__tensor_flatten__()
            # dynamo's TENSOR_SUBCLASS_METADATA_MATCH: a deepcopy compared with ``==`` (or the
            # class's __metadata_guard__); the ctx is never hashed, so dicts and lists are fine.
            try:
                snap = _compat.snapshot_ctx(ctx)
            except Exception as e:
                raise UnhashableContextError(
                    f"{type_name(type(t), short=True)}.__tensor_flatten__() returned a ctx {ctx!r} for "
                    f"{self.render(src)} that cannot be deep-copied ({type(e).__name__}: {e}); dynamo "
                    "deep-copies it to guard on it. Return plain values (tuples, dicts, dataclasses)."
                ) from None
            self.add(CtxMatch(src, type(t), snap))
            # dynamo lists the inner names last; here they come first so that an explanation
            # reports a missing inner tensor once instead of failing to read it.
            self.add(InnerNames(src, tuple(names)))
        if _compat.is_njt(t) and not _compat.is_fake(t):
            # dynamo does not track a NestedTensor's outer sizes (they follow from its inner
            # tensors): nested-int dims and strides are dynamic, the batch dim follows _offsets.
            sizes, strides = self._njt_outer(t, src, policy, marks)
        else:
            kinds, stride_dyn = self._kinds(t, src, marks)
            shape = self.sim.tensor(src, t, kinds, stride_dyn)
            if shape.free_stride:
                self.add(Layout(src, bool(t.is_contiguous())))
            sizes, strides = shape.static_sizes(), shape.static_strides()
        keys = None if _compat.is_fake(t) else _compat.dispatch_keys(t)
        tm = TensorMatch(src, cls, keys, t.dtype, t.device, t.requires_grad,
                         tuple(sizes), tuple(strides))
        self.out.tensor_matches.append(tm)
        self.add(tm)
        if not _compat.is_fake(t):
            self.add(MarkMatch(src, tuple(sorted(marks.attrs.items()))))
        self.tensors.append((src, t))
        if wrapper:
            _, inner_pol = split_policy(policy)
            for name in names:
                inner = getattr(t, name)
                isrc = InnerSource(name, src)
                if isinstance(inner, torch.Tensor):
                    self.tensor(inner, isrc, inner_pol.get(name), nested=True)
                else:  # an opaque reference (e.g. a DeviceMesh): its type only
                    self.add(TypeMatch(isrc, type(inner), structural=False))
            self.wrappers.append((src, t))
        base = None if _compat.is_fake(t) else _compat.view_base(t)
        if base is not None:
            self.base(base, AttrSource(src, "_base"))

    def _njt_outer(self, t, src, policy, marks) -> tuple[list, list]:
        _, inner_pol = split_policy(policy)
        name = "_offsets" if t._lengths is None else "_lengths"
        off, pol = getattr(t, name), inner_pol.get(name)
        om = read_marks(off) if pol is None else policy_marks(split_policy(pol)[0], off.dim(), nested=True)
        batch_dynamic = (0 in om.dims and om.dims[0].kind != "static") or self.dynamic is True
        if self.state is not None:
            # automatic dynamic on the outer's own frame-state entry (nested ints as -1)
            plain = lambda xs: tuple(-1 if isinstance(x, torch.SymInt) else int(x) for x in xs)  # noqa: E731
            strict = [i for i, d in marks.dims.items() if d.kind == "dynamic"]
            entry = self.state.record_tensor(self.render(src), plain(t.size()), plain(t.stride()), strict)
            batch_dynamic = batch_dynamic or entry.size_dynamic(0)
        if self.state is not None and not batch_dynamic:
            e = self.state.tensors.get(self.render(InnerSource(name, src)))
            batch_dynamic = e is not None and e.size_dynamic(0)
        sizes = []
        for i, x in enumerate(t.size()):
            if _compat.is_nested_int(x) or (i == 0 and batch_dynamic):
                sizes.append(None)
            else:
                sizes.append(int(x))
        strides = [None if isinstance(x, torch.SymInt) else int(x) for x in t.stride()]
        return sizes, strides

    def base(self, b: torch.Tensor, src: Source) -> None:
        """A view's base: dynamo fakeifies it (symbols, symbolic guards) but does not match it."""
        marks = read_marks(b)
        kinds, stride_dyn = self._kinds(b, src, marks)
        self.sim.tensor(src, b, kinds, stride_dyn, match=False)
        if _compat.is_traceable_wrapper_subclass(b):
            for name in b.__tensor_flatten__()[0]:
                inner = getattr(b, name)
                if isinstance(inner, torch.Tensor):
                    self.base(inner, InnerSource(name, src))

    def dtensor(self, t, src: Source, policy: Any) -> None:
        # dynamo: TYPE_MATCH, the spec (placements, mesh, order, dtype; shapes skipped),
        # requires_grad by value, then the local tensor in full. No TENSOR_MATCH on the outer.
        self.add(TypeMatch(src, type(t)))
        self.add(SpecMatch(src, copy.deepcopy(_compat.dtensor_spec(t))))
        _, inner_pol = split_policy(policy)
        self.tensor(_compat.dtensor_local(t), InnerSource("_local_tensor", src), inner_pol.get("_local_tensor"),
                    nested=True)
        self.add(ValueMatch(AttrSource(src, "requires_grad"), bool(t.requires_grad)))

    # -- after all inputs --------------------------------------------------------------
    def finish(self) -> Collected:
        eqs, ranges = self.sim.finish()
        first = self.sim.first_sources()
        groups: dict[int, list[Source]] = {}
        for src, t in self.tensors:
            groups.setdefault(id(t), []).append(src)
        if len(self.tensors) > 1:
            self.add(NoAliasing(tuple(tuple(g) for g in groups.values())))
        for src, t in self.wrappers:
            self._relations(src, t)
        for e in eqs:
            self.add(ShapeEquality(e.source, e.expr, {s: first[s] for s in e.expr.free_symbols}))
        for r in ranges:
            self.add(ShapeRange(r.source, r.lo, r.hi))
        return self.out

    def _relations(self, src: Source, t) -> None:
        fn = getattr(type(t), "__inner_shapes__", None)
        if fn is None:
            return
        names, ctx = t.__tensor_flatten__()
        shapes = {s.source: s for s in self.sim.tensors}
        outer = shapes.get(src)
        if outer is None or all(x.is_Integer for x in outer.sizes):
            return  # all outer sizes static: TENSOR_MATCH already pins every inner size
        try:
            expect = fn(t.size(), ctx)
        except Exception:
            return
        rel = _symbolic_relations(t, src)
        for name in names:
            inner = shapes.get(InnerSource(name, src))
            if inner is None or name not in expect:
                continue
            for d in range(min(len(expect[name]), len(inner.sizes))):
                rhs, syms = rel.get(SizeSource(InnerSource(name, src), d), (None, None))
                self.add(Relation(src, type(t), name, d, rhs, syms))
                if inner.sizes[d].is_Integer:
                    self._pinned(src, t, fn, ctx, outer, name, d, int(inner.sizes[d]), names)

    def _pinned(self, src, t, fn, ctx, outer, name, d, c, names) -> None:
        # A static inner size c = f(outer sizes) is a guard on the outer symbols. When
        # only the current value satisfies it (f(v-1) and f(v+1) both differ), the symbol
        # is pinned to a constant; dynamo refuses that for a mark_dynamic dim
        # (ConstraintViolationError), on the outer tensor or an inner one equal to it.
        size = list(t.size())
        for k, e in enumerate(outer.sizes):
            if e.is_Integer:
                continue
            v = size[k]
            alive = False
            for w in (v - 1, v + 1):
                if w < 2:
                    continue
                try:
                    alive = fn(torch.Size(size[:k] + [w] + size[k + 1:]), ctx)[name][d] == c
                except Exception:
                    alive = True
                if alive:
                    break
            if alive:
                continue
            strict = [SizeSource(src, k)] if self._strict(src, k) else []
            for other in names:
                isrc = InnerSource(other, src)
                m = self.marks_of.get(isrc)
                for j, dr in (m.dims.items() if m else ()):
                    if dr.kind == "dynamic" and getattr(t, other).size(j) == v and self._identity(fn, t, ctx, other, j, k):
                        strict.append(SizeSource(isrc, j))
            if strict:
                raise PolicyViolationError(
                    f"{self.render(SizeSource(src, k))} = {v} is pinned to that one value by "
                    f"{type_name(type(t), short=True)}.__inner_shapes__ ({self.render(SizeSource(InnerSource(name, src), d))}"
                    f" = {c} holds for no other size), but {', '.join(self.render(s) for s in strict)} "
                    "is marked with mark_dynamic; dynamo raises ConstraintViolationError. Use "
                    "maybe_mark_dynamic, or a size the relation does not pin."
                )

    def _strict(self, src, k) -> bool:
        m = self.marks_of.get(src)
        return m is not None and k in m.dims and m.dims[k].kind == "dynamic"

    @staticmethod
    def _identity(fn, t, ctx, name, j, k) -> bool:
        probe = [10007 + 30 * i for i in range(t.dim())]
        try:
            return fn(torch.Size(probe), ctx)[name][j] == probe[k]
        except Exception:
            return False

def _symbolic_relations(t, src: Source) -> dict:
    """``{inner size source: (rhs, {symbol: source})}`` from ``symbolic.relations``, for
    rendering; empty when symbolic cannot express them."""
    try:
        import symbolic

        eqs = symbolic.relations(t)
        where = {sym: rebase(s, src) for sym, s in symbolic.size_sources(t).items()}
    except Exception:
        return {}
    out = {}
    for eq in eqs:
        lhs = where.get(eq.lhs)
        if lhs is None or not all(s in where for s in eq.rhs.free_symbols):
            continue
        out[lhs] = (eq.rhs, {s: where[s] for s in eq.rhs.free_symbols})
    return out


def collect(roots, *, dynamic: bool | None, state: FrameState | None,
            render: Callable[[Source], str]) -> Collected:
    """Guards for ``roots`` (a list of ``(source, value, policy)``)."""
    w = _Walker(dynamic=dynamic, state=state, render=render)
    for src, v, pol in roots:
        w.visit(v, src, pol)
    return w.finish()
