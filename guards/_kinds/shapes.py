"""Symbolic shape guards: equalities (duck sizing, strides tied to sizes) and ranges."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import sympy

from .._sources import Source
from .base import Guard, line

__all__ = ["ShapeEquality", "ShapeRange", "render_expr", "eval_expr"]


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
