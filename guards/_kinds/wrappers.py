"""Guards on a wrapped tensor's protocol: inner names, the flatten ctx, DTensor's spec,
and ``__inner_shapes__`` relations."""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy

from .. import _compat
from .._canonical import canonical, type_name
from .._sources import (
    AttrSource,
    CtxFieldSource,
    FlattenSource,
    SizeSource,
    Source,
)
from .base import Guard, fmt, line

__all__ = ["InnerNames", "CtxMatch", "SpecMatch", "Relation", "py_expr", "ctx_fields", "ctx_diff", "spec_diff"]


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
    if isinstance(ctx, dict):
        return list(ctx.items())
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
                out.append(line(r, CtxFieldSource(ctx_src, k, isinstance(old, dict)), fmt(a), fmt(b)))
        if out:
            return out
    if isinstance(old, dict) and isinstance(new, dict) and type(old) is type(new) and set(old) != set(new):
        out = [line(r, CtxFieldSource(ctx_src, k, True), fmt(old[k]), "no such key") for k in old if k not in new]
        out += [line(r, CtxFieldSource(ctx_src, k, True), "no such key", fmt(new[k])) for k in new if k not in old]
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
        where = f"the ctx of {type_name(self.cls)}"
        key = getattr(self.cls, "__metadata_key__", None)
        if self.custom is not None and key is not None:
            # The class's own guard compares only part of the ctx; its key hook says which
            # part, so two ctxs the guard accepts as equal get one key.
            return ["ctx_key", r(self.source), canonical(key(self.ctx), where=f"{type_name(self.cls)}.__metadata_key__(ctx)")]
        # Without the hook the whole ctx is keyed: equal keys mean equal ctxs (which the
        # guard accepts); ctxs the guard merely tolerates get different keys -- a cache
        # miss, never a wrong artifact.
        return ["ctx", r(self.source), canonical(self.ctx, where=where)]


@dataclasses.dataclass(frozen=True)
class SpecMatch(Guard):
    """DTensor: ``v._spec._check_equals(spec, skip_shapes=True)`` (dynamo's DTENSOR_SPEC_MATCH)."""

    source: Source
    spec: Any
    kind = "dtensor_spec"

    def _check(self, got) -> bool:
        return _compat.dtensor_spec_matches(got, self.spec)

    def emit(self, cg):
        fn = cg.const(self._check, "D")
        cg.check(f"{fn}({cg.var(AttrSource(self.source, '_spec'))})")

    def failures(self, root, r):
        got = _compat.dtensor_spec(self.source(root))
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
class Relation(Guard):
    """An inner size equals what ``__inner_shapes__`` declares for the outer size.

    Generated from ``symbolic.describe``: ``expr`` is the sympy expression of the inner size
    over the wrapper's outer size symbols, ``symbols`` maps each symbol to the (absolute)
    source that reads it. The check evaluates ``expr`` in integer arithmetic on the
    input's sizes; the same equality reaches dynamo through the kit's unflatten.
    """

    source: Source  # the wrapper
    cls: type
    target: SizeSource  # the inner size
    expr: Any  # sympy expression over ``symbols``
    symbols: Any  # {sympy.Symbol: Source}
    # ``scale * target == expr``: an outer size that is a multiple of the inner size is
    # stated as torch states it (``2*inner == outer``), not as ``inner == outer // 2``.
    scale: int = 1
    kind = "relation"

    @property
    def nodes(self):
        return (self.source, self.target.base)

    def _rhs_text(self, r) -> str:
        return str(self.expr.xreplace({s: sympy.Symbol(r(src)) for s, src in self.symbols.items()}))

    def emit(self, cg):
        names = {s: cg.var(src) for s, src in self.symbols.items()}
        try:
            rhs = py_expr(self.expr, names)
        except TypeError:
            # An expression with no integer-arithmetic spelling: evaluate it with sympy
            # (slower, same answer).
            syms = sorted(self.symbols, key=str)
            fn = cg.const(lambda *vals, e=self.expr, s=syms: _eval(e, dict(zip(s, vals))), "X")
            rhs = f"{fn}({', '.join(names[s] for s in syms)})"
        lhs = cg.var(self.target) if self.scale == 1 else f"{self.scale} * {cg.var(self.target)}"
        cg.check(f"{lhs} == {rhs}")

    def expected(self, root) -> int:
        return _eval(self.expr, {s: src(root) for s, src in self.symbols.items()})

    def failures(self, root, r):
        exp = self.expected(root)
        got = self.target(root)
        if exp == self.scale * got:
            return []
        if self.scale == 1:
            return [line(r, self.target, f"{self._rhs_text(r)} = {exp}", str(got))]
        return [line(r, self.target, f"({self._rhs_text(r)})/{self.scale} = {exp}/{self.scale}", str(got))]

    def describe(self, r):
        lhs = r(self.target) if self.scale == 1 else f"{self.scale}*{r(self.target)}"
        return f"{lhs} == {self._rhs_text(r)}"

    def canonical(self, r):
        return ["relation", r(self.target)]


def _eval(expr, values: dict) -> int:
    return int(expr.xreplace({s: sympy.Integer(v) for s, v in values.items()}))


def py_expr(expr, names: dict) -> str:
    """Python integer arithmetic for a shape expression (``ceiling(s0/32)`` ->
    ``-((-s0) // 32)``), each symbol spelled ``names[symbol]``; TypeError if it has none.

    Example:
        >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
        >>> py_expr(sympy.ceiling(s0 / 32), {s0: "n"})
        '(-((-(n)) // (32)))'
    """
    if expr.is_Symbol:
        return names[expr]
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        n, d = py_expr(num, names), py_expr(den, names)
        if isinstance(expr, sympy.floor):
            return f"(({n}) // ({d}))"
        return f"(-((-({n})) // ({d})))"
    if expr.is_Add:
        return "(" + " + ".join(py_expr(a, names) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(py_expr(a, names) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return f"(({py_expr(expr.base, names)}) ** {int(expr.exp)})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(expr, sympy.Max) else "min"
        return f"{fn}(" + ", ".join(py_expr(a, names) for a in expr.args) + ")"
    if isinstance(expr, sympy.Mod):
        return f"(({py_expr(expr.args[0], names)}) % ({py_expr(expr.args[1], names)}))"
    raise TypeError(f"no integer spelling for {expr}")
