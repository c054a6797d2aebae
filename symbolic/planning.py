"""``plan``: turn ``mark_dynamic``'s arguments into an explicit ``SubclassPolicy``.

The ``inner`` modes:

- ``"derived"``: an inner dim that a relation (``__inner_shapes__``, or "same size at the
  same index" for classes without it) ties to a dynamic outer dim becomes dynamic, with
  the outer range carried through the relation (``ceiling(s0/32)`` over ``[64, 320]`` gives
  ``[2, 10]``); a dim tied to an auto outer dim becomes auto; a dim tied only to static outer
  dims, or constant, becomes static; a dim tied to nothing marked is left alone.
- ``"same_dim"``: torch's own rule: every inner tensor with as many dims as the outer gets
  the same marks, recursively.
- ``"none"``: only the outer tensor is marked.
- a mapping ``{name: dims | SubclassPolicy}``: those inners as given (dims for a nested
  wrapper are planned "derived" inside it); the others derived.

Free dims (``FREE`` in ``__inner_shapes__``) under ``"derived"``: ``Dim.auto()`` as soon as
any outer dim is marked dynamic or auto (see ``_free_dim``); left alone otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import sympy
import torch

from .dims import Dim, DimKind
from .errors import PolicyError, PolicyTypeError
from .description import ShapeDescription, describe
from .policy import SubclassPolicy, normalize_dims, resolve_dims
from .protocol import Node, where
from .shape_relations import TensorShape, analyze, size_symbol
from .source_types import ROOT, Source
from . import _compat

__all__ = ["plan", "plan_described", "resolve_dims", "divisors", "INNER_MODES"]

INNER_MODES = ("derived", "same_dim", "none")

_RANK = {DimKind.DYNAMIC: 2, DimKind.AUTO: 1, DimKind.STATIC: 0}


def _outer_dims(t, dims, min, max, src) -> dict[int, Dim]:
    if isinstance(dims, Mapping):
        if min is not None or max is not None:
            raise PolicyTypeError(
                f"{where(src)}: min=/max= apply to bare dims; with a {{dim: Dim}} mapping put "
                "the range in it: {0: Dim.dynamic(min=..., max=...)}."
            )
        return resolve_dims(t, normalize_dims(dims, where(src)), src)
    try:
        default = Dim.dynamic(min, max)
    except (PolicyError, PolicyTypeError) as e:
        raise type(e)(f"{where(src)}: {e}") from None
    return resolve_dims(t, normalize_dims(dims, where(src), default=default), src)


def _check_mode(inner: Any, src: Source) -> None:
    if isinstance(inner, str):
        if inner not in INNER_MODES:
            raise PolicyError(
                f"{where(src)}: inner={inner!r} is not a mode; use one of {INNER_MODES} or a "
                "{name: dims | SubclassPolicy} mapping."
            )
    elif not isinstance(inner, Mapping):
        raise PolicyTypeError(
            f"{where(src)}: inner must be one of {INNER_MODES} or a mapping, got "
            f"{inner!r} ({type(inner).__name__})."
        )


def plan(t: torch.Tensor, dims: Any, *, min: int | None = None, max: int | None = None,
         inner: Any = "derived") -> SubclassPolicy:
    """The ``SubclassPolicy`` that ``mark_dynamic`` with these arguments applies.

    Args:
        t: a tensor (plain or wrapped).
        dims: outer dims to make dynamic: an int, a sequence of ints, or ``{dim: Dim}``.
        min, max: range for bare dims (as torch's ``mark_dynamic``).
        inner: ``"derived"`` (default), ``"same_dim"``, ``"none"`` or ``{name: dims | SubclassPolicy}``.

    Raises:
        PolicyError: a dim out of range, an unknown or None inner, ``min > max``.
        PolicyTypeError: a malformed argument.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> plan(TwoTensor(torch.ones(4, 2), torch.ones(4, 2)), 0)
        SubclassPolicy(outer={0: Dim.dynamic()}, inner={'a': {0: Dim.dynamic()}, 'b': {0: Dim.dynamic()}})
    """
    if not isinstance(t, torch.Tensor):
        raise PolicyTypeError(f"mark_dynamic/plan expect a tensor, got {type(t).__name__}.")
    return plan_described(describe(t), dims, min=min, max=max, inner=inner)


def plan_described(desc: ShapeDescription, dims: Any, *, min: int | None = None, max: int | None = None,
                   inner: Any = "derived") -> SubclassPolicy:
    """``plan`` for a value already described (``describe(t)``): reads the description only.

    ``mark_dynamic`` describes its tensor once and plans, warns and marks from that one
    description.
    """
    return _plan(desc.node(ROOT), dims, min, max, inner, desc)


def _plan(node: Node, dims, min, max, inner, desc: ShapeDescription | None = None) -> SubclassPolicy:
    t, src = node.tensor, node.source
    _check_mode(inner, src)
    outer = _outer_dims(t, dims, min, max, src)
    overrides: dict[str, Any] = {}
    if isinstance(inner, Mapping):
        for name, spec in inner.items():
            overrides[name] = _override(node.child(name), spec)
    if not node.wrapper or inner == "none":
        return SubclassPolicy(outer, overrides)
    if inner == "same_dim":
        return _same_dim(node, outer)
    # A nested wrapper named in a mapping is planned in its own symbols.
    infos = desc.shapes if desc is not None else analyze(node)
    policy = _derived(node, infos, outer, overrides)
    moved = {d: m for d, m in divisors(infos, outer).items() if _carried(policy, outer[d])}
    if not moved:
        return policy
    # Dynamo adds a divisibility guard (rows % m == 0) for whole-block layouts and reports it
    # as a violation of any explicit range on the outer dim; the inner sizes carry the range
    # instead (they are the outer size times a constant, or its count of blocks).
    return SubclassPolicy({d: (Dim.dynamic() if d in moved else dim) for d, dim in outer.items()},
                          policy.inner)


def divisors(infos: list[TensorShape], outer: Mapping[int, Dim]) -> dict[int, int]:
    """``{outer dim: m}`` for ranged dynamic outer dims whose size this instance's layout
    requires to be a multiple of ``m``: an inner size ``floor(a*s/d)`` (``floor_div``, the
    other outer sizes at their values) of whole blocks on the instance (``a*s`` divisible
    by ``d``) makes dynamo guard ``s % (d / gcd(a, d)) == 0``.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> divisors(analyze(TwoTensor(torch.ones(4), torch.ones(4))), {0: Dim.dynamic(2, 8)})
        {}
    """
    root = infos[0]
    root_syms = {size_symbol("", i): i for i in range(root.tensor.dim())}
    ranged = {s: i for s, i in root_syms.items() if i in outer and outer[i].kind is DimKind.DYNAMIC
              and (outer[i].min is not None or outer[i].max is not None)}
    fixed = {s: root.tensor.size(i) for s, i in root_syms.items()
             if s not in ranged and type(root.tensor.size(i)) is int}
    out: dict[int, int] = {}
    for info in infos[1:]:
        for j, e in enumerate(info.exprs):
            if not info.related(j):
                continue
            for fl in sympy.sympify(e).subs(fixed).atoms(sympy.floor):
                free = fl.args[0].free_symbols
                if len(free) != 1 or not free <= ranged.keys():
                    continue
                (sym,) = free
                num, den = sympy.fraction(sympy.together(fl.args[0]))
                if not den.is_Integer or not num.is_polynomial(sym):
                    continue
                poly = sympy.Poly(num, sym)
                a = poly.coeff_monomial(sym)
                if poly.degree() != 1 or not a.is_Integer or poly.coeff_monomial(1) != 0:
                    continue
                m = int(den) // math.gcd(int(a), int(den))
                v = root.tensor.size(ranged[sym])
                if m > 1 and type(v) is int and v % m == 0:
                    d = ranged[sym]
                    out[d] = math.lcm(out.get(d, 1), m)
    return out


def _carried(policy: SubclassPolicy, dim: Dim) -> bool:
    """True when some inner dim carries a range like ``dim``'s (in a derived policy a ranged
    inner dim comes from a ranged outer dim)."""
    stack: list[Any] = [policy]
    while stack:
        p = stack.pop()
        for v in p.inner.values():
            if isinstance(v, SubclassPolicy):
                stack.append(v)
                continue
            for inner_dim in v.values():
                if inner_dim.kind is DimKind.DYNAMIC and (inner_dim.min is not None) == (dim.min is not None) \
                        and (inner_dim.max is not None) == (dim.max is not None):
                    return True
    return False


def _override(node: Node, spec):
    v, src = node.tensor, node.source
    if isinstance(spec, SubclassPolicy):
        if not node.wrapper:
            raise PolicyTypeError(
                f"{where(src)} is a plain {type(v).__name__}; a SubclassPolicy only fits a "
                "wrapped tensor. Give its dims instead: [0] or {0: Dim.dynamic()}."
            )
        return spec
    if node.wrapper:
        return _plan(node, spec, None, None, "derived")
    return resolve_dims(v, normalize_dims(spec, where(src)), src)


def _same_dim(node: Node, outer) -> SubclassPolicy:
    inner = {}
    for name, child in node.children:
        if child.tensor.dim() == node.tensor.dim():
            inner[name] = _same_dim(child, outer) if child.wrapper else dict(outer)
    return SubclassPolicy(outer, inner)


def _derive_dim(info: TensorShape, j: int, outer: dict[int, Dim], root: TensorShape) -> Dim | None:
    expr = info.exprs[j]
    if j in info.free:
        return _free_dim(outer)
    if not info.related(j):
        return None
    free = expr.free_symbols
    if not free:
        return Dim.static()
    root_dims = {size_symbol("", i): i for i in range(len(root.symbols))}
    kinds = [outer[root_dims[s]] for s in free if s in root_dims and root_dims[s] in outer]
    if not kinds:
        return None
    best = max(kinds, key=lambda d: _RANK[d.kind])
    if best.kind is DimKind.STATIC:
        # Static only when every size it depends on is pinned; else it may still move.
        return best if len(kinds) == len(free) else None
    if best.kind is DimKind.AUTO:
        return best
    if _small_on_instance(info, j, expr, kinds, outer, root_dims):
        return Dim.static()
    if expr.is_Symbol:
        return outer[root_dims[expr]]
    if all(d.min is None and d.max is None for d in kinds if d.kind is DimKind.DYNAMIC):
        return Dim.dynamic()
    ranges = {}
    for s in free:
        d = outer.get(root_dims[s]) if s in root_dims else None
        if d is not None and d.kind is DimKind.DYNAMIC:
            ranges[s] = (d.min, d.max)
        elif (d is None or d.kind is DimKind.STATIC) and s in root_dims \
                and type(root.tensor.size(root_dims[s])) is int:
            # An outer dim not marked dynamic keeps its size in the graph this policy is
            # for (static, or unmarked: static on the first compile), so the range of a
            # product like s0*s1 takes s1's value rather than [0, inf].
            v = root.tensor.size(root_dims[s])
            ranges[s] = (v, v)
        else:
            ranges[s] = (None, None)
    lo, hi = _compat.bound(expr, ranges)
    if (
        lo is not None
        and lo < 2
        and (hi is None or hi >= 2)
        and any(d.min is not None for d in kinds if d.kind is DimKind.DYNAMIC)
    ):
        # The range reaches 0 or 1 here (ceil(rows / block) for rows <= block) and 2+
        # elsewhere: dynamo specializes sizes 0 and 1, so one graph cannot serve the whole
        # outer range and dynamo would fail deep in guard generation. Say so here.
        here = info.source.render("x")
        raise PolicyError(
            f"{here}.size({j}) = {expr} spans [{lo}, {hi if hi is not None else 'inf'}] over "
            f"the requested outer range; dynamo specializes sizes 0 and 1, so no single graph "
            f"can serve it. Raise the outer min so that {expr} >= 2, split the range at that "
            f"boundary, or mark the outer dim with Dim.auto() (maybe_mark_dynamic)."
        )
    # Dynamo specializes sizes 0 and 1, so a range that admits at most one size >= 2
    # can only ever produce one graph: say static rather than ask torch for a
    # "fully constrained" dynamic dim, which it rejects.
    if hi is not None and hi <= max(lo or 0, 2):
        return Dim.static()
    any_min = any(d.min is not None for d in kinds if d.kind is DimKind.DYNAMIC)
    any_max = any(d.max is not None for d in kinds if d.kind is DimKind.DYNAMIC)
    return Dim.dynamic(min=lo if any_min else None, max=hi if any_max else None)


def _free_dim(outer: dict[int, Dim]) -> Dim | None:
    """A ``FREE`` dim moves with the data, not with the outer size: once any outer dim may
    move (dynamic or auto), a new batch brings new sizes there too, so it gets a symbol as
    well. ``Dim.auto()``, not a strict mark: nobody promised a range or that the code keeps
    it symbolic, and dynamo specializes a size of 0 or 1 whatever the mark says. Outer dims
    all static (or none marked): left alone."""
    if any(d.kind is not DimKind.STATIC for d in outer.values()):
        return Dim.auto()
    return None


def _small_on_instance(info: TensorShape, j: int, expr, kinds, outer, root_dims) -> bool:
    """True when a derived inner size is 0 or 1 on this instance under a strict mark: it
    stays static (dynamo specializes sizes 0 and 1 whatever the mark says). Raises
    ``PolicyError`` when that static size pins the outer dim it derives from.

    ``ceiling(s0/32) == 1`` leaves a range of rows (1..32): one graph serves them, and a
    larger instance recompiles once. ``floor(s0*s1/16384) == 1`` comes from a layout of whole
    blocks (``floor_div``: the size is an exact multiple), so it leaves one size: dynamo
    would specialize the marked outer dim and fail with ConstraintViolationError while
    compiling. Say so now, naming the inner size and the outer dims it ties.
    """
    if not any(d.kind is DimKind.DYNAMIC for d in kinds) or expr.is_Symbol:
        return False
    v = info.tensor.size(j)
    if type(v) is not int or v >= 2:
        return False
    if not expr.has(sympy.floor):
        return True
    here = info.source.render("x")
    tied = sorted(root_dims[s] for s in expr.free_symbols if s in root_dims and root_dims[s] in outer
                  and outer[root_dims[s]].kind is DimKind.DYNAMIC)
    raise PolicyError(
        f"{here}.size({j}) = {expr} is {v} on this instance, and dynamo specializes sizes 0 and "
        f"1: that size becomes a constant, and with whole blocks (floor_div) it fixes outer "
        f"dim(s) {tied}, which are marked dynamic, to this one size, so compiling would fail "
        f"(ConstraintViolationError). Mark an instance on which {expr} >= 2, or mark dim(s) "
        f"{tied} with Dim.auto() (maybe_mark_dynamic): the first size then compiles specialized "
        "and later sizes share one graph."
    )


def _derived(top: Node, infos: list[TensorShape], outer: dict[int, Dim], overrides: dict) -> SubclassPolicy:
    root = infos[0]
    by_source = {info.source: info for info in infos}

    def build(node: Node, own: dict[int, Dim], extra: dict) -> SubclassPolicy:
        inner = {}
        for name, child in node.children:
            if name in extra:
                inner[name] = extra[name]
                continue
            info = by_source[child.source]
            dims = {j: d for j in range(child.tensor.dim()) if (d := _derive_dim(info, j, outer, root)) is not None}
            if child.wrapper:
                nested = build(child, dims, {})
                if nested.outer or nested.inner:
                    inner[name] = nested
            elif dims:
                inner[name] = dims
        return SubclassPolicy(own, inner)

    return build(top, outer, overrides)
