"""Walks a value the way dynamo wraps a frame's inputs and collects the guards it would install.

How each dimension is treated, and which inner sizes are tied to which outer sizes, comes
from ``symbolic.describe`` (the one shape model) and from nowhere else; this module only
decides, per compile mode, how ShapeEnv allocates those dims and in which order dynamo
lists the guards.

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

import symbolic
from symbolic import DimKind
from symbolic.description import ShapeDescription, TensorDims
from symbolic.protocol import flatten
from symbolic.shape_relations import multiple_of

from . import _compat
from ._autodynamic import FrameState
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
from ._sources import ROOT, AttrSource, FlattenSource, InnerSource, ItemSource, SizeSource, Source, rebase
from ._unguardable import find_cycle, find_nan
from .errors import PolicyViolationError, UnguardableValueError, UnhashableContextError, UnsupportedValueError

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
        self.wrappers: list[tuple[Source, torch.Tensor, _Described, Source]] = []
        self.dims_of: dict[Source, TensorDims] = {}
        self._seen: dict[int, Source] = {}
        self._open: dict[int, Source] = {}  # containers being walked, for cycles

    def add(self, g: Guard) -> None:
        self.out.guards.append(g)

    # -- containers and leaves ---------------------------------------------------------
    def visit(self, v: Any, src: Source, policy: Any) -> None:
        if isinstance(v, torch.Tensor):
            self.tensor(v, src, _Described(symbolic.describe(v, policy), src), ROOT)
        elif isinstance(v, (list, tuple, dict)):
            first = self._open.get(id(v))
            if first is not None:
                raise UnguardableValueError(
                    f"{self.render(src)} is {self.render(first)} again: the input contains itself, "
                    "and a cyclic list or dict cannot be guarded (a guard describes the whole "
                    "structure, and walking a cycle never ends; dynamo cannot trace it either). "
                    "Pass an acyclic structure: break the cycle, or pass the parts as separate "
                    "arguments."
                )
            self._open[id(v)] = src
            try:
                self.container(v, src, policy)
            finally:
                del self._open[id(v)]
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

    def container(self, v: list | tuple | dict, src: Source, policy: Any) -> None:
        if isinstance(v, (list, tuple)):
            self.add(TypeMatch(src, type(v)))
            self.add(LenMatch(src, len(v)))
            sub = policy if isinstance(policy, (list, tuple)) and len(policy) == len(v) else None
            for i, x in enumerate(v):
                self.visit(x, ItemSource(i, src), None if sub is None else sub[i])
        else:
            self.add(TypeMatch(src, type(v)))
            for k in v:
                if not isinstance(k, (str, int, bool, type(None), enum.Enum)):
                    raise UnsupportedValueError(
                        f"{self.render(src)} has a key {k!r} ({type(k).__name__}); only str, int, "
                        "bool, None and Enum keys can be guarded. Use a list or a str-keyed dict."
                    )
            self.add(KeysMatch(src, tuple(v)))
            subs = policy if isinstance(policy, dict) else {}
            for k, x in v.items():
                self.visit(x, ItemSource(k, src), subs.get(k))

    def _passes_itself(self, guard: CtxMatch, ctx: Any, t: torch.Tensor, src: Source) -> None:
        """A NaN in a ctx would fail its own guard on the next call (NaN != NaN), compiling
        anew every time, while its cache keys would be equal: name it here."""
        if guard.custom is not None:
            return  # the class's own __metadata_guard__ decides what equal means
        # By value, not by trying ``==``: a tuple compares items by identity first, so the
        # very same NaN object passes, and the next one (computed, unpickled) fails.
        nan = find_nan(ctx)
        if nan is None:
            return
        cls = type_name(type(t), short=True)
        where = self.render(FlattenSource(src, 1))
        raise UnguardableValueError(
            f"{self.render(src)} ({cls}) cannot be guarded: {where}{nan} is NaN, and NaN != NaN, so "
            "its ctx would not pass its own guard (==, dynamo's TENSOR_SUBCLASS_METADATA_MATCH) "
            "and every call would compile a new artifact. Use None (or another sentinel) for a "
            f"missing value, or give {cls} a __metadata_guard__ that treats NaN as equal."
        )

    def _scalar_dynamic(self, src, v) -> bool:
        if self.dynamic is True:
            return True
        if self.state is None:
            return False
        return self.state.record_scalar(self.render(src), v)

    # -- tensors -----------------------------------------------------------------------
    def _kinds(self, t, src, info: TensorDims, fake: bool):
        """Per-dim ``(kind, lo, hi)`` and per-dim stride dynamism, dynamo's precedence."""
        entry = None
        if self.state is not None and not fake:
            strict = [i for i in range(t.dim()) if info.kind(i) is DimKind.DYNAMIC]
            entry = self.state.record_tensor(self.render(src), tuple(t.size()), tuple(t.stride()), strict)
        kinds: list[tuple[DimKind, int | None, int | None]] = []
        stride_dyn: list[bool] = []
        for i in range(t.dim()):
            mk = info.kind(i)
            auto = entry is not None and entry.size_dynamic(i)
            if mk is DimKind.UNBACKED:
                kinds.append((DimKind.UNBACKED, None, None))
            elif mk is DimKind.DYNAMIC:
                d = info.dims[i]
                kinds.append((DimKind.DYNAMIC, d.min, d.max))
            elif mk is DimKind.AUTO or (auto and mk is not DimKind.STATIC):
                kinds.append((DimKind.DYNAMIC, None, None))
            elif self.dynamic is not True or mk is DimKind.STATIC:
                kinds.append((DimKind.STATIC, None, None))
            else:
                kinds.append((DimKind.DUCK, None, None))
            stride_dyn.append(mk is None and entry is not None and entry.stride_dynamic(i))
        return kinds, stride_dyn

    def tensor(self, t: torch.Tensor, src: Source, desc: "_Described", rel: Source) -> None:
        """``t`` at ``src``; ``desc[rel]`` is its entry in the description of its root."""
        first = self._seen.get(id(t))
        if first is not None:
            # The same tensor object again: dynamo guards it only by identity with the
            # first source (``L['y'] is L['x']``).
            self.tensors.append((src, t))
            return
        self._seen[id(t)] = src
        if _compat.is_dtensor(t):
            self.dtensor(t, src, desc, rel)
            return
        info = desc.shapes[rel]
        wrapper = info.wrapper
        fake = _compat.is_fake(t)
        cls = torch.Tensor if fake else type(t)
        self.dims_of[src] = info
        if info.refused:
            raise PolicyViolationError(
                f"{self.render(src)} is a wrapper inside a wrapper marked with mark_dynamic on "
                f"dims {list(info.refused)}; dynamo "
                "fakeifies it from its concrete outer size and raises ConstraintViolationError. "
                "Mark it with torch._dynamo.maybe_mark_dynamic (symbolic.apply does this)."
            )
        if wrapper:
            self.add(TypeMatch(src, cls))
            names, ctx = flatten(t)
            cycle = find_cycle(ctx)
            if cycle is not None:
                where = FlattenSource(src, 1)
                raise UnguardableValueError(
                    f"{self.render(where)}{cycle[0]} is {self.render(where)}{cycle[1]} again: the ctx "
                    f"of {type_name(type(t), short=True)} contains itself, so it cannot be guarded "
                    "(dynamo deep-copies a ctx and compares it with ==, which never ends on a cycle). "
                    "Keep meta values acyclic: tuples, frozen dataclasses, plain values."
                )
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
            guard = CtxMatch(src, type(t), snap)
            self._passes_itself(guard, ctx, t, src)
            self.add(guard)
            # dynamo lists the inner names last; here they come first so that an explanation
            # reports a missing inner tensor once instead of failing to read it.
            self.add(InnerNames(src, tuple(names)))
        if not fake and _compat.is_njt(t):
            # dynamo does not track a NestedTensor's outer sizes (they follow from its inner
            # tensors): nested-int dims and strides are dynamic, the batch dim follows _offsets.
            sizes, strides = self._njt_outer(t, src, desc, rel, info)
        else:
            kinds, stride_dyn = self._kinds(t, src, info, fake)
            shape = self.sim.tensor(src, t, kinds, stride_dyn)
            if shape.free_stride:
                self.add(Layout(src, bool(t.is_contiguous())))
            sizes, strides = shape.static_sizes(), shape.static_strides()
        keys = None if fake else _compat.dispatch_keys(t)
        tm = TensorMatch(src, cls, keys, t.dtype, t.device, t.requires_grad,
                         tuple(sizes), tuple(strides))
        self.out.tensor_matches.append(tm)
        self.add(tm)
        if not fake:
            self.add(MarkMatch(src, tuple(sorted(info.marks.items()))))
        self.tensors.append((src, t))
        if wrapper:
            for name in names:
                inner = getattr(t, name)
                isrc = InnerSource(name, src)
                if isinstance(inner, torch.Tensor):
                    self.tensor(inner, isrc, desc, InnerSource(name, rel))
                else:  # an opaque reference (e.g. a DeviceMesh): its type only
                    self.add(TypeMatch(isrc, type(inner), structural=False))
            self.wrappers.append((src, t, desc, rel))
        base = None if fake else _compat.view_base(t)
        if base is not None:
            self.base(base, AttrSource(src, "_base"))

    def _njt_outer(self, t, src, desc, rel, info: TensorDims) -> tuple[list, list]:
        name = "_offsets" if t._lengths is None else "_lengths"
        k = desc.shapes[InnerSource(name, rel)].kind(0)
        batch_dynamic = (k is not None and k is not DimKind.STATIC) or self.dynamic is True
        if self.state is not None:
            # automatic dynamic on the outer's own frame-state entry (nested ints as -1)
            plain = lambda xs: tuple(-1 if isinstance(x, torch.SymInt) else int(x) for x in xs)  # noqa: E731
            strict = [i for i in range(t.dim()) if info.kind(i) is DimKind.DYNAMIC]
            entry = self.state.record_tensor(self.render(src), plain(t.size()), plain(t.stride()), strict)
            batch_dynamic = batch_dynamic or entry.size_dynamic(0)
        if self.state is not None and not batch_dynamic:
            e = self.state.tensors.get(self.render(InnerSource(name, src)))
            batch_dynamic = e is not None and e.size_dynamic(0)
        sizes: list[int | None] = []
        for i, x in enumerate(t.size()):
            if _compat.is_nested_int(x) or (i == 0 and batch_dynamic):
                sizes.append(None)
            else:
                sizes.append(int(x))
        strides = [None if isinstance(x, torch.SymInt) else int(x) for x in t.stride()]
        return sizes, strides

    def base(self, b: torch.Tensor, src: Source) -> None:
        """A view's base: dynamo fakeifies it (symbols, symbolic guards) but does not match it."""
        for rel, info in symbolic.describe(b).tensors.items():
            s = rebase(rel, src)
            kinds, stride_dyn = self._kinds(info.tensor, s, info, _compat.is_fake(info.tensor))
            self.sim.tensor(s, info.tensor, kinds, stride_dyn, match=False)

    def dtensor(self, t, src: Source, desc: "_Described", rel: Source) -> None:
        # dynamo: TYPE_MATCH, the spec (placements, mesh, order, dtype; shapes skipped),
        # requires_grad by value, then the local tensor in full. No TENSOR_MATCH on the outer.
        self.add(TypeMatch(src, type(t)))
        self.add(SpecMatch(src, copy.deepcopy(_compat.dtensor_spec(t))))
        self.tensor(_compat.dtensor_local(t), InnerSource("_local_tensor", src), desc,
                    InnerSource("_local_tensor", rel))
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
        shapes = {s.source: s for s in self.sim.tensors}
        for src, t, desc, rel in self.wrappers:
            self._relations(src, t, desc, rel, shapes)
        for e in eqs:
            self.add(ShapeEquality(e.source, e.expr, {s: first[s] for s in e.expr.free_symbols}))
        for r in ranges:
            self.add(ShapeRange(r.source, r.lo, r.hi))
        return self.out

    def _relations(self, src: Source, t, desc: "_Described", rel: Source, shapes: dict) -> None:
        outer = shapes.get(src)
        if outer is None or all(x.is_Integer for x in outer.sizes):
            return  # all outer sizes static: TENSOR_MATCH already pins every inner size
        rels = [(r, desc.absolute(r.target), {s: desc.absolute(x) for s, x in r.symbols.items()})
                for r in desc.shapes.relations(rel)]
        for r, target, symbols in rels:
            assert isinstance(target, SizeSource)  # a relation targets one inner size
            inner = shapes.get(target.base)
            if inner is None:
                continue
            self.add(self._relation(src, t, desc, rel, r, target, symbols))
            size = inner.sizes[target.dim]
            if size.is_Integer:
                self._pinned(src, t, r, target, int(size), outer, rels)

    @staticmethod
    def _relation(src, t, desc, rel, r, target, symbols) -> Relation:
        # A whole multiple (floor(a*s/k) with a*s divisible by k on this input) reaches
        # dynamo as torch states it, k*inner == a*s (the kit's unflatten records it so).
        m = multiple_of(r.expr)
        if m is not None:
            k, a, sym = m
            inner = desc.shapes[r.target.base].tensor.size(r.target.dim)
            outer = t.size(r.symbols[sym].dim)
            if type(inner) is int and type(outer) is int and k * inner == a * outer:
                return Relation(src, type(t), target, a * sym, symbols, scale=k)
        return Relation(src, type(t), target, r.expr, symbols)

    def _pinned(self, src, t, r, target, c: int, outer, rels) -> None:
        # A static inner size c = f(outer sizes) is a guard on the outer symbols; when the
        # equation fixes a symbol (dynamo's solver does so for one linear in one symbol),
        # dynamo specializes it, which it refuses for a mark_dynamic dim on the outer tensor
        # or on an inner tensor that the relations make equal to it.
        for sym, _ in r.solve_pinned(c).items():
            k = r.symbols[sym].dim
            if outer.sizes[k].is_Integer:
                continue
            v = t.size(k)
            strict = [SizeSource(src, k)] if self.dims_of[src].kind(k) is DimKind.DYNAMIC else []
            for other, other_target, _ in rels:
                info = self.dims_of.get(other_target.base)
                if (other.expr == sym and info is not None and info.kind(other_target.dim) is DimKind.DYNAMIC
                        and info.tensor.size(other_target.dim) == v):
                    strict.append(other_target)
            if strict:
                raise PolicyViolationError(
                    f"{self.render(SizeSource(src, k))} = {v} is pinned to that one value by "
                    f"{type_name(type(t), short=True)}.__inner_shapes__ ({self.render(target)}"
                    f" = {c} holds for no other size), but {', '.join(self.render(s) for s in strict)} "
                    "is marked with mark_dynamic; dynamo raises ConstraintViolationError. Use "
                    "maybe_mark_dynamic, or a size the relation does not pin."
                )


class _Described:
    """A ``symbolic.ShapeDescription`` of one tensor and where that tensor sits in the input."""

    __slots__ = ("shapes", "root")

    def __init__(self, shapes: ShapeDescription, root: Source):
        self.shapes = shapes
        self.root = root

    def absolute(self, rel: Source) -> Source:
        """A source of the description (relative to its tensor) as a source in the input."""
        return rebase(rel, self.root)


def collect(roots, *, dynamic: bool | None, state: FrameState | None,
            render: Callable[[Source], str]) -> Collected:
    """Guards for ``roots`` (a list of ``(source, value, policy)``)."""
    w = _Walker(dynamic=dynamic, state=state, render=render)
    for src, v, pol in roots:
        w.visit(v, src, pol)
    return w.finish()
