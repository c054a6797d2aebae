"""The guard kinds: what each checks, how it is generated, explained, listed and keyed.

Every guard names the sources it reads (``nodes``), emits its check into a ``CodeGen``,
explains a failure as ``<rendered source>: expected <e>, got <a>`` lines, describes itself
for listings, and gives a canonical (process-independent, JSON-able) form for cache keys.
A *structural* guard (type, length, keys, inner names) protects what lies below it: when it
fails, explanations of guards below it are skipped rather than reported as noise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import sympy
import torch

from . import _compat
from ._canonical import canonical, type_name
from ._sources import (
    AttrSource,
    CallSource,
    CtxFieldSource,
    FlattenSource,
    KeysSource,
    LenSource,
    SizeSource,
    Source,
    StrideSource,
    TypeSource,
)

__all__ = [
    "Guard",
    "TypeMatch",
    "LenMatch",
    "KeysMatch",
    "ValueMatch",
    "NotNan",
    "InnerNames",
    "CtxMatch",
    "SpecMatch",
    "TensorMatch",
    "MarkMatch",
    "NoAliasing",
    "ShapeEquality",
    "ShapeRange",
    "Layout",
    "Relation",
    "fmt",
]


def fmt(v: Any) -> str:
    """Short, readable rendering of an expected/actual value."""
    if isinstance(v, type):
        return type_name(v, short=True)
    if isinstance(v, torch.Size):
        return str(tuple(v))
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(repr(x) for x in sorted(v)) + "}" if v else "set()"
    return repr(v)


class Guard:
    """Base class. Subclasses are frozen dataclasses."""

    structural = False
    kind = "guard"

    @property
    def nodes(self) -> tuple:
        return (self.source,)  # type: ignore[attr-defined]

    def emit(self, cg) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def failures(self, root, r) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self, r) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def canonical(self, r):
        """JSON-able form for cache keys; None leaves the guard out of the key."""
        return None


def line(r: Callable[[Source], str], src: Source, expected: str, got: str) -> str:
    """``<rendered source>: expected <e>, got <a>``."""
    return f"{r(src)}: expected {expected}, got {got}"


@dataclasses.dataclass(frozen=True)
class TypeMatch(Guard):
    """``type(v) is cls`` (exact type identity, as dynamo's TYPE_MATCH)."""

    source: Source
    cls: type
    structural: bool = True
    kind = "type"

    def emit(self, cg):
        cg.check(f"type({cg.var(self.source)}) is {cg.const(self.cls, 'T')}")

    def failures(self, root, r):
        got = type(self.source(root))
        return [] if got is self.cls else [line(r, TypeSource(self.source), fmt(self.cls), fmt(got))]

    def describe(self, r):
        return f"type({r(self.source)}) is {type_name(self.cls)}"

    def canonical(self, r):
        return ["type", r(self.source), type_name(self.cls)]


@dataclasses.dataclass(frozen=True)
class LenMatch(Guard):
    """``len(v) == n`` for a list or tuple."""

    source: Source
    n: int
    structural = True
    kind = "len"

    def emit(self, cg):
        cg.check(f"len({cg.var(self.source)}) == {self.n}")

    def failures(self, root, r):
        got = len(self.source(root))
        return [] if got == self.n else [line(r, LenSource(self.source), str(self.n), str(got))]

    def describe(self, r):
        return f"len({r(self.source)}) == {self.n}"

    def canonical(self, r):
        return ["len", r(self.source), self.n]


@dataclasses.dataclass(frozen=True)
class KeysMatch(Guard):
    """``list(d) == keys`` for a dict (order included, as dynamo's DICT_KEYS_MATCH)."""

    source: Source
    keys: tuple
    structural = True
    kind = "keys"

    def emit(self, cg):
        cg.check(f"list({cg.var(self.source)}) == {cg.const(list(self.keys), 'K')}")

    def failures(self, root, r):
        got = list(self.source(root))
        return [] if got == list(self.keys) else [line(r, KeysSource(self.source), fmt(list(self.keys)), fmt(got))]

    def describe(self, r):
        return f"list({r(self.source)}.keys()) == {list(self.keys)!r}"

    def canonical(self, r):
        return ["keys", r(self.source), [canonical(k) for k in self.keys]]


@dataclasses.dataclass(frozen=True)
class ValueMatch(Guard):
    """A non-tensor leaf guarded by value: ``type(v) is T and v == value`` (NaN: ``v != v``)."""

    source: Source
    value: Any
    kind = "value"

    def _is_nan(self):
        return isinstance(self.value, float) and math.isnan(self.value)

    def emit(self, cg):
        v = cg.var(self.source)
        if self.value is None:
            cg.check(f"{v} is None")
        elif self._is_nan():
            cg.check(f"type({v}) is float and {v} != {v}")
        else:
            cg.check(f"type({v}) is {cg.const(type(self.value), 'T')} and {v} == {cg.const(self.value, 'c')}")

    def _ok(self, got):
        if self.value is None:
            return got is None
        if type(got) is not type(self.value):
            return False
        if self._is_nan():
            return got != got
        return bool(got == self.value)

    def failures(self, root, r):
        got = self.source(root)
        if self._ok(got):
            return []
        exp = fmt(self.value) if self.value is None else f"{fmt(self.value)} ({type(self.value).__name__})"
        act = fmt(got) if got is None else f"{fmt(got)} ({type(got).__name__})"
        return [line(r, self.source, exp, act)]

    def describe(self, r):
        return f"{r(self.source)} == {self.value!r}"

    def canonical(self, r):
        return ["value", r(self.source), canonical(self.value)]


@dataclasses.dataclass(frozen=True)
class NotNan(Guard):
    """``not isnan(v)`` for a float dynamo traces as a symbol (its NaN specialization)."""

    source: Source
    kind = "nan"

    def emit(self, cg):
        v = cg.var(self.source)
        cg.check(f"{v} == {v}")

    def failures(self, root, r):
        got = self.source(root)
        return [] if got == got else [line(r, self.source, "not NaN", "nan")]

    def describe(self, r):
        return f"not math.isnan({r(self.source)})"

    def canonical(self, r):
        return ["notnan", r(self.source)]


@dataclasses.dataclass(frozen=True)
class InnerNames(Guard):
    """``v.__tensor_flatten__()[0] == names``: which inner tensors are present."""

    source: Source
    names: tuple
    structural = True
    kind = "names"

    def emit(self, cg):
        cg.check(f"{cg.var(FlattenSource(self.source, 0))} == {cg.const(list(self.names), 'N')}")

    def failures(self, root, r):
        got = list(self.source(root).__tensor_flatten__()[0])
        if got == list(self.names):
            return []
        return [line(r, FlattenSource(self.source, 0), fmt(list(self.names)), fmt(got))]

    def describe(self, r):
        return f"{r(FlattenSource(self.source, 0))} == {list(self.names)!r}"

    def canonical(self, r):
        return ["names", r(self.source), list(self.names)]


def ctx_fields(ctx) -> list[tuple[Any, Any]] | None:
    """``[(field, value)]`` of a ctx for field-by-field explanations, or None."""
    if hasattr(ctx, "fields") and isinstance(getattr(ctx, "fields"), tuple):
        try:
            pairs = [(n, v) for n, v in ctx.fields]
        except (TypeError, ValueError):
            pairs = None
        if pairs is not None:
            extra = [(k, getattr(ctx, k)) for k in ("dtype", "present") if hasattr(ctx, k)]
            return pairs + extra
    if dataclasses.is_dataclass(ctx) and not isinstance(ctx, type):
        return [(f.name, getattr(ctx, f.name)) for f in dataclasses.fields(ctx)]
    if isinstance(ctx, tuple) and hasattr(ctx, "_fields"):
        return list(zip(ctx._fields, ctx))
    if isinstance(ctx, (tuple, list)):
        return list(enumerate(ctx))
    return None


def ctx_diff(r, src: Source, old, new) -> list[str]:
    """One line per ctx field that differs between ``old`` and ``new``."""
    ctx_src = FlattenSource(src, 1)
    fo, fn = ctx_fields(old), ctx_fields(new)
    if fo is not None and fn is not None and type(old) is type(new) and [k for k, _ in fo] == [k for k, _ in fn]:
        out = []
        for (k, a), (_, b) in zip(fo, fn):
            try:
                same = bool(a == b)
            except Exception:
                same = False
            if not same:
                out.append(line(r, CtxFieldSource(ctx_src, k), fmt(a), fmt(b)))
        if out:
            return out
    return [line(r, ctx_src, fmt(old), fmt(new))]


@dataclasses.dataclass(frozen=True)
class CtxMatch(Guard):
    """The flatten ctx equals the one seen at build time (or the class's ``__metadata_guard__``)."""

    source: Source
    cls: type
    ctx: Any
    kind = "ctx"

    @property
    def custom(self):
        return getattr(self.cls, "__metadata_guard__", None)

    def emit(self, cg):
        got = cg.var(FlattenSource(self.source, 1))
        exp = cg.const(self.ctx, "C")
        if self.custom is not None:
            cg.check(f"{cg.const(self.custom, 'M')}({exp}, {got})")
        else:
            cg.check(f"{got} == {exp}")

    def _ok(self, got):
        if self.custom is not None:
            return bool(self.custom(self.ctx, got))
        return bool(got == self.ctx)

    def failures(self, root, r):
        got = self.source(root).__tensor_flatten__()[1]
        if self._ok(got):
            return []
        lines = ctx_diff(r, self.source, self.ctx, got)
        if self.custom is not None:
            lines = [ln + f" ({type_name(self.cls, short=True)}.__metadata_guard__ refused it)" for ln in lines]
        return lines

    def describe(self, r):
        how = "__metadata_guard__" if self.custom is not None else "=="
        return f"{r(FlattenSource(self.source, 1))} {how} {self.ctx!r}"

    def canonical(self, r):
        return ["ctx", r(self.source), canonical(self.ctx, where=f"the ctx of {type_name(self.cls)}")]


@dataclasses.dataclass(frozen=True)
class SpecMatch(Guard):
    """DTensor: ``v._spec._check_equals(spec, skip_shapes=True)`` (dynamo's DTENSOR_SPEC_MATCH)."""

    source: Source
    spec: Any
    kind = "dtensor_spec"

    def _check(self, got) -> bool:
        return bool(got._check_equals(self.spec, skip_shapes=True))

    def emit(self, cg):
        fn = cg.const(self._check, "D")
        cg.check(f"{fn}({cg.var(AttrSource(self.source, '_spec'))})")

    def failures(self, root, r):
        got = self.source(root)._spec
        if self._check(got):
            return []
        return spec_diff(r, AttrSource(self.source, "_spec"), self.spec, got)

    def describe(self, r):
        return f"{r(AttrSource(self.source, '_spec'))} matches {self.spec} (shapes skipped)"

    def canonical(self, r):
        s = self.spec
        mesh = s.mesh
        return [
            "dtensor_spec",
            r(self.source),
            [canonical(p) for p in s.placements],
            canonical(getattr(s, "shard_order", None)),
            [mesh.device_type, list(mesh.mesh.shape), canonical(getattr(mesh, "mesh_dim_names", None)),
             mesh.mesh.flatten().tolist()],
            str(s.tensor_meta.dtype) if s.tensor_meta is not None else None,
        ]


def spec_diff(r, spec_src: Source, old, new) -> list[str]:
    """Lines naming the DTensorSpec fields that differ (placements, mesh, order, dtype)."""
    out = []
    for f in ("placements", "mesh", "shard_order"):
        a, b = getattr(old, f, None), getattr(new, f, None)
        if a != b:
            out.append(line(r, AttrSource(spec_src, f), fmt(a), fmt(b)))
    ma, mb = old.tensor_meta, new.tensor_meta
    if (ma is None) != (mb is None):
        out.append(line(r, AttrSource(spec_src, "tensor_meta"), fmt(ma), fmt(mb)))
    elif ma is not None and ma.dtype != mb.dtype:
        out.append(line(r, AttrSource(AttrSource(spec_src, "tensor_meta"), "dtype"), fmt(ma.dtype), fmt(mb.dtype)))
    return out or [line(r, spec_src, str(old), str(new))]


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
        absent = frozenset(a for a in _compat.MARK_ATTRS if a not in present)
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
        for a in _compat.MARK_ATTRS:
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


def render_expr(expr, first: dict, render: Callable[[Source], str]) -> str:
    """Render a sympy expression over symbols through each symbol's first source."""
    if isinstance(expr, sympy.Symbol):
        return render(first[expr])
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Mul):
        return " * ".join(_paren(a, first, render) for a in expr.args)
    if isinstance(expr, sympy.Add):
        return " + ".join(render_expr(a, first, render) for a in expr.args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return " * ".join([_paren(expr.base, first, render)] * int(expr.exp))
    raise TypeError(f"cannot render shape expression {expr}")


def _paren(a, first, render):
    s = render_expr(a, first, render)
    return f"({s})" if isinstance(a, sympy.Add) else s


def eval_expr(expr, first: dict, root) -> int:
    """Evaluate a shape expression on ``root`` (each symbol read from its first source)."""
    subs = {s: first[s](root) for s in expr.free_symbols}
    return int(expr.xreplace({k: sympy.Integer(v) for k, v in subs.items()}))


@dataclasses.dataclass(frozen=True, eq=False)
class ShapeEquality(Guard):
    """``source == expr``: duck sizing, a stride tied to sizes, a shared offset symbol."""

    source: Source
    expr: Any
    first: dict  # sympy.Symbol -> Source
    kind = "shape_eq"

    @property
    def nodes(self):
        return (self.source.base,) + tuple(self.first[s].base for s in self.expr.free_symbols)

    def emit(self, cg):
        rhs = render_expr(self.expr, self.first, cg.var)
        cg.check(f"{cg.var(self.source)} == {rhs}")

    def failures(self, root, r):
        got = self.source(root)
        exp = eval_expr(self.expr, self.first, root)
        if got == exp:
            return []
        return [line(r, self.source, f"== {render_expr(self.expr, self.first, r)} (= {exp})", str(got))]

    def describe(self, r):
        return f"{r(self.source)} == {render_expr(self.expr, self.first, r)}"

    def canonical(self, r):
        return ["eq", r(self.source), render_expr(self.expr, self.first, r)]


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


@dataclasses.dataclass(frozen=True)
class ShapeRange(Guard):
    """``lo <= source <= hi`` for a symbol (``2 <=`` is the 0/1 specialization)."""

    source: Source
    lo: int | None
    hi: int | None
    kind = "shape_range"

    @property
    def nodes(self):
        return (self.source.base,)

    def emit(self, cg):
        v = cg.var(self.source)
        if self.lo is not None:
            cg.check(f"{self.lo} <= {v}")
        if self.hi is not None:
            cg.check(f"{v} <= {self.hi}")

    def failures(self, root, r):
        got = self.source(root)
        out = []
        if self.lo is not None and not self.lo <= got:
            out.append(line(r, self.source, f">= {self.lo}", str(got)))
        if self.hi is not None and not got <= self.hi:
            out.append(line(r, self.source, f"<= {self.hi}", str(got)))
        return out

    def describe(self, r):
        lo = f"{self.lo} <= " if self.lo is not None else ""
        hi = f" <= {self.hi}" if self.hi is not None else ""
        return f"{lo}{r(self.source)}{hi}"

    def canonical(self, r):
        return ["range", r(self.source), self.lo, self.hi]


@dataclasses.dataclass(frozen=True, eq=False)
class Relation(Guard):
    """An inner size equals what ``__inner_shapes__(outer_size, ctx)`` says (kit classes)."""

    source: Source  # the wrapper
    cls: type
    inner: str
    dim: int
    kind = "relation"

    @property
    def nodes(self):
        from ._sources import InnerSource

        return (self.source, InnerSource(self.inner, self.source))

    def _target(self):
        from ._sources import InnerSource

        return SizeSource(InnerSource(self.inner, self.source), self.dim)

    def emit(self, cg):
        fn = cg.const(self.cls.__inner_shapes__, "I")
        shapes = cg.bind(("inner_shapes", self.source),
                         f"{fn}({cg.sizes(self.source)}, {cg.var(FlattenSource(self.source, 1))})", "r")
        cg.check(f"{shapes}[{self.inner!r}][{self.dim}] == {cg.var(self._target())}")

    def failures(self, root, r):
        t = self.source(root)
        exp = self.cls.__inner_shapes__(t.size(), t.__tensor_flatten__()[1])[self.inner][self.dim]
        got = self._target()(root)
        if exp == got:
            return []
        how = f"{type_name(self.cls, short=True)}.__inner_shapes__({fmt(tuple(t.size()))}, ctx)"
        return [line(r, self._target(), f"{exp} (from {how})", str(got))]

    def describe(self, r):
        return (f"{r(self._target())} == {type_name(self.cls, short=True)}.__inner_shapes__("
                f"{r(self.source)}.size(), ctx)[{self.inner!r}][{self.dim}]")

    def canonical(self, r):
        return ["relation", r(self._target())]
