"""Guards on tensors themselves: TENSOR_MATCH, dimension marks, aliasing, layout."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from symbolic.description import MARK_ATTRS

from .. import _compat
from .._canonical import type_name
from .._sources import (
    AttrSource,
    CallSource,
    SizeSource,
    Source,
    StrideSource,
    TypeSource,
)
from .base import Guard, fmt, line

__all__ = ["TensorMatch", "MarkMatch", "NoAliasing", "Layout"]


@dataclasses.dataclass(frozen=True, eq=False)
class TensorMatch(Guard):
    """dynamo's TENSOR_MATCH: type, dispatch keys, dtype, device, requires_grad, rank, and
    the static sizes and strides (``None`` entries are symbolic and guarded elsewhere)."""

    source: Source
    cls: type
    keys: Any
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    sizes: tuple
    strides: tuple
    kind = "tensor"

    def emit(self, cg):
        # Emitted in one batch by the GuardSet (see TensorBatch), not one by one.
        raise AssertionError("TensorMatch is emitted through TensorBatch")

    def failures(self, root, r):
        t = self.source(root)
        src = self.source
        if type(t) is not self.cls:
            return [line(r, TypeSource(src), fmt(self.cls), fmt(type(t)))]
        out = []
        if t.dtype != self.dtype:
            out.append(line(r, AttrSource(src, "dtype"), fmt(self.dtype), fmt(t.dtype)))
        if t.device != self.device:
            out.append(line(r, AttrSource(src, "device"), fmt(self.device), fmt(t.device)))
        if t.requires_grad != self.requires_grad:
            out.append(line(r, AttrSource(src, "requires_grad"), fmt(self.requires_grad), fmt(t.requires_grad)))
        if t.dim() != len(self.sizes):
            out.append(line(r, CallSource(src, "dim"), str(len(self.sizes)), str(t.dim())))
            return out
        size, stride = t.size(), t.stride()
        for i, e in enumerate(self.sizes):
            if e is not None and size[i] != e:
                out.append(line(r, SizeSource(src, i), str(e), str(size[i])))
        for i, e in enumerate(self.strides):
            if e is not None and stride[i] != e:
                out.append(line(r, StrideSource(src, i), str(e), str(stride[i])))
        if not out and self.keys is not None:
            got = _compat.dispatch_keys(t)
            if got != self.keys:
                out.append(f"torch._C._dispatch_keys({r(src)}): expected {self.keys}, got {got}")
        return out

    def describe(self, r):
        sz = [("?" if s is None else s) for s in self.sizes]
        st = [("?" if s is None else s) for s in self.strides]
        return (
            f"{r(self.source)}: {type_name(self.cls, short=True)} {str(self.dtype).replace('torch.', '')} "
            f"on {self.device}, requires_grad={self.requires_grad}, size={sz}, stride={st}"
        )

    def canonical(self, r):
        return [
            "tensor",
            r(self.source),
            type_name(self.cls),
            str(self.dtype),
            str(self.device),
            self.requires_grad,
            list(self.sizes),
            list(self.strides),
        ]


@dataclasses.dataclass(frozen=True, eq=False)
class MarkMatch(Guard):
    """The dimension-mark attributes a tensor carries (dynamo's dimension marking guard):
    ones absent at build time must stay absent; present ones may only shrink."""

    source: Source
    present: tuple  # ((attr, frozenset_of_dims), ...)
    kind = "marks"

    def emit(self, cg):
        v = cg.var(self.source)
        present = dict(self.present)
        absent = frozenset(a for a in MARK_ATTRS if a not in present)
        if absent:
            # Every tensor has a __dict__ (marks live there); one set operation checks all.
            cg.check(f"{cg.const(absent, 'A')}.isdisjoint({v}.__dict__)")
        for a, dims in self.present:
            e = cg.const(dims, "E")
            cg.check(f"getattr({v}, {a!r}, {e}) <= {e}")

    def failures(self, root, r):
        t = self.source(root)
        present = dict(self.present)
        out = []
        for a in MARK_ATTRS:
            has = hasattr(t, a)
            if a not in present:
                if has:
                    out.append(line(r, AttrSource(self.source, a), "absent", fmt(set(getattr(t, a)))))
            elif has and not set(getattr(t, a)) <= present[a]:
                out.append(line(r, AttrSource(self.source, a), f"a subset of {fmt(present[a])}", fmt(set(getattr(t, a)))))
        return out

    def describe(self, r):
        p = ", ".join(f"{a}<={fmt(d)}" for a, d in self.present) or "no dimension marks"
        return f"{r(self.source)}: {p}"


@dataclasses.dataclass(frozen=True, eq=False)
class NoAliasing(Guard):
    """Tensors that were distinct objects stay distinct; ones that were the same stay so."""

    groups: tuple  # tuple of tuples of sources; each group was one object
    kind = "aliasing"

    @property
    def nodes(self):
        return tuple(s for g in self.groups for s in g)

    def emit(self, cg):
        reps = [cg.var(g[0]) for g in self.groups]
        for g in self.groups:
            for other in g[1:]:
                cg.check(f"{cg.var(other)} is {cg.var(g[0])}")
        if len(reps) <= 4:
            for i in range(len(reps)):
                for j in range(i + 1, len(reps)):
                    cg.check(f"{reps[i]} is not {reps[j]}")
        else:
            cg.check(f"len({{{', '.join(f'id({r})' for r in reps)}}}) == {len(reps)}")

    def failures(self, root, r):
        out = []
        vals = [[s(root) for s in g] for g in self.groups]
        for g, vs in zip(self.groups, vals):
            for s, v in zip(g[1:], vs[1:]):
                if v is not vs[0]:
                    out.append(f"{r(s)} is {r(g[0])}: expected True, got False")
        for i in range(len(self.groups)):
            for j in range(i + 1, len(self.groups)):
                if vals[i][0] is vals[j][0]:
                    out.append(
                        f"{r(self.groups[j][0])} is {r(self.groups[i][0])}: expected False, got True"
                    )
        return out

    def describe(self, r):
        same = [" is ".join(r(s) for s in g) for g in self.groups if len(g) > 1]
        txt = f"{len(self.groups)} distinct tensors"
        return txt + (f"; aliased: {', '.join(same)}" if same else "")

    def canonical(self, r):
        return ["aliasing", sorted(sorted(r(s) for s in g) for g in self.groups if len(g) > 1)]


@dataclasses.dataclass(frozen=True)
class Layout(Guard):
    """``v.is_contiguous()`` keeps its value, for a tensor whose stride is a free symbol.

    Not an input guard of dynamo's own: the traced code adds it. Elementwise ops decide the
    output layout by asking whether such an input is contiguous, which guards the free
    stride against the contiguous one (``x.stride()[0] != 2``). Every op on the tensor does
    this, so the kit models it rather than predict a reuse dynamo will refuse.
    """

    source: Source
    contiguous: bool
    kind = "layout"

    def emit(self, cg):
        cg.check(f"{cg.var(self.source)}.is_contiguous() is {self.contiguous}")

    def failures(self, root, r):
        got = self.source(root).is_contiguous()
        return [] if got == self.contiguous else [line(r, CallSource(self.source, "is_contiguous"), str(self.contiguous), str(got))]

    def describe(self, r):
        return f"{r(self.source)}.is_contiguous() == {self.contiguous}"

    def canonical(self, r):
        return ["layout", r(self.source), self.contiguous]
