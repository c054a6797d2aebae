"""``describe``: a tensor plus its policy, as one description of how dynamo treats its shape.

(The module is ``description`` so that the function ``symbolic.describe`` does not shadow
it.) This is the one shape model of the distribution. ``guards`` generates its shape checks from
it and reads nothing else about dimensions: per tensor inside the value (pre-order, as
``walk``), the ``Dim`` dynamo will read for each dimension (from torch's marks or from a
``SubclassPolicy``, with the nested-wrapper rule applied), the mark attributes dynamo guards
on, and, per wrapper class that declares ``__inner_shapes__``, the relations between its
inner sizes and its outer sizes as sympy expressions with the sources of their symbols.

The nested-wrapper rule: torch fakeifies a wrapper inside a wrapper from its concrete outer
size, so a strict ``mark_dynamic`` on its own dims always fails in dynamo. ``apply`` marks
such dims ``maybe_mark_dynamic`` instead; ``describe`` reports a policy that way, and reports
strict marks found on such a wrapper in ``TensorDims.refused``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from . import _compat
from .source_types import ROOT, InnerSource, SizeSource, Source
from .dims import Dim, DimKind
from .errors import PolicyTypeError, RelationError
from .free_dims import FREE
from .policy import SubclassPolicy, normalize_dims, resolve_dims
from .protocol import Node, tree, where
from .shape_relations import TensorShape, analyze, inner_shapes_of, size_symbol

__all__ = ["describe", "ShapeDescription", "TensorDims", "Relation", "MARK_ATTRS"]

#: Every dimension-mark attribute dynamo guards on, in its order.
MARK_ATTRS = _compat.MARK_ATTRS


@dataclass(frozen=True)
class TensorDims:
    """How dynamo treats the dimensions of one tensor inside the described value.

    Attributes:
        source: where the tensor is, relative to the described value.
        tensor: the tensor.
        dims: ``{dim: Dim}`` dynamo reads; dims absent are unmarked (static on a first
            compile, duck-sized with ``dynamic=True``, automatic dynamic after a change).
        unbacked: dims torch's ``mark_unbacked`` marked (no ``Dim`` asks for those).
        marks: ``{attribute: dims}`` of the mark attributes the tensor carries (or, under a
            policy, that ``apply`` leaves); dynamo guards them (a later input may carry a
            subset, and no attribute that is absent here).
        wrapper: a traceable wrapper subclass.
        nested: a wrapper inside a wrapper.
        refused: dims of a nested wrapper carrying a strict ``mark_dynamic``, which dynamo
            refuses (ConstraintViolationError).
    """

    source: Source
    tensor: torch.Tensor
    dims: Mapping[int, Dim]
    unbacked: frozenset
    marks: Mapping[str, frozenset]
    wrapper: bool
    nested: bool
    refused: tuple

    def kind(self, i: int) -> DimKind | None:
        """``DimKind.DYNAMIC``, ``AUTO``, ``STATIC``, ``UNBACKED`` or None (unmarked)."""
        if i in self.unbacked:
            return DimKind.UNBACKED
        d = self.dims.get(i)
        return None if d is None else d.kind


@dataclass(frozen=True)
class Relation:
    """``target == expr``: an inner size as ``__inner_shapes__`` gives it for the outer size.

    ``expr`` is over the symbols in ``symbols`` (the wrapper's own outer sizes, ``s0``,
    ``s1``...), each mapped to the source that reads it; ``wrapper`` is where the declaring
    wrapper sits. The same equalities reach dynamo: the kit's ``__tensor_unflatten__``
    records them with ``torch._check`` when it receives symbolic sizes.
    """

    wrapper: Source
    target: SizeSource
    expr: sympy.Expr
    symbols: Mapping[sympy.Symbol, SizeSource]

    @property
    def constant(self) -> bool:
        """True when the inner size does not depend on any outer size."""
        return not self.expr.free_symbols

    def solve_pinned(self, value: int, *, lo: int = 2) -> dict[sympy.Symbol, int]:
        """The outer size that ``target == value`` fixes to a single value, if any.

        Solved, not probed: for ``a*s + b``, ``floor((a*s + b)/d)`` and
        ``ceiling((a*s + b)/d)`` in one symbol ``s`` (``a > 0``) the sizes that satisfy the
        equation form an interval; intersected with ``s >= lo`` (dynamo's symbols are at
        least 2) it pins ``s`` when one integer is left, which dynamo then specializes.
        Other forms are treated as not pinning.

        Example:
            >>> s0 = size_symbol("", 0)
            >>> r = Relation(ROOT, SizeSource(InnerSource("a"), 0), s0, {s0: SizeSource(ROOT, 0)})
            >>> r.solve_pinned(5)
            {s0: 5}
            >>> Relation(ROOT, r.target, sympy.ceiling(s0 / 2), r.symbols).solve_pinned(1)
            {s0: 2}
            >>> Relation(ROOT, r.target, sympy.ceiling(s0 / 32), r.symbols).solve_pinned(1)
            {}
        """
        free = self.expr.free_symbols
        if len(free) != 1:
            return {}
        (s,) = free
        span = _solution_interval(self.expr, s, int(value))
        if span is None:
            return {}
        first, last = max(span[0], lo), span[1]
        return {s: first} if first == last else {}


def _solution_interval(expr, s, c: int):
    """``[first, last]`` (integers) of ``s`` with ``expr == c``; None if not of a solved form."""
    kind = None
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        kind, (arg,) = type(expr), expr.args
    else:
        arg = expr
    num, den = sympy.fraction(sympy.together(arg))
    if not den.is_Integer or int(den) <= 0 or not num.is_polynomial(s):
        return None
    poly = sympy.Poly(num, s)
    if poly.degree() != 1:
        return None
    a, b = (int(x) if x.is_Integer else None for x in poly.all_coeffs())
    if a is None or b is None or a <= 0:
        return None
    d = int(den)
    if kind is None:  # (a*s + b) / d == c
        x = sympy.Rational(c * d - b, a)
        return (int(x), int(x)) if x.is_Integer else (1, 0)
    if kind is sympy.floor:  # c <= (a*s + b)/d < c + 1
        lo_num, hi_num = c * d - b, (c + 1) * d - b  # a*s in [lo_num, hi_num)
        return (-(-lo_num // a), (hi_num - 1) // a)
    # ceiling: c - 1 < (a*s + b)/d <= c
    lo_num, hi_num = (c - 1) * d - b, c * d - b  # a*s in (lo_num, hi_num]
    return (lo_num // a + 1, hi_num // a)


class ShapeDescription:
    """The description of one value: its tensors (pre-order) and, on demand, its relations.

    Built from one read of the value (``protocol.tree``: one ``__tensor_flatten__`` per
    wrapper); ``plan``, ``apply`` and ``mark_dynamic`` plan from it rather than asking the
    tensor again.
    """

    def __init__(self, tensors: dict[Source, TensorDims], root: Node | None = None):
        self._tensors = tensors
        self._nodes = {n.source: n for n in root.walk()} if root is not None else None

    def node(self, src: Source = ROOT) -> Node:
        """The ``protocol.Node`` read for the tensor at ``src``."""
        if self._nodes is None:  # built by hand from TensorDims alone
            self._nodes = {n.source: n for n in tree(self._tensors[ROOT].tensor).walk()}
        return self._nodes[src]

    @functools.cached_property
    def shapes(self) -> list[TensorShape]:
        """``shape_relations.analyze`` of the value, computed once (pre-order).

        Raises:
            RelationError: ``__inner_shapes__`` is not plain arithmetic, or contradicts the value.
        """
        return analyze(self.node(ROOT))

    @property
    def tensors(self) -> Mapping[Source, TensorDims]:
        """``{source: TensorDims}`` for the value and every tensor inside it, pre-order."""
        return self._tensors

    def __getitem__(self, src: Source) -> TensorDims:
        return self._tensors[src]

    def relations(self, wrapper: Source = ROOT) -> list[Relation]:
        """The declared relations of the wrapper at ``wrapper`` (empty for a plain tensor or
        a class without ``__inner_shapes__``), in flatten order.

        Raises:
            RelationError: ``__inner_shapes__`` is not plain arithmetic on symbols.
        """
        info = self._tensors[wrapper]
        t = info.tensor
        if not info.wrapper or not callable(getattr(type(t), "__inner_shapes__", None)):
            return []
        node = self.node(wrapper)
        shapes = inner_shapes_of(type(t), t.dim(), node.ctx)
        assert shapes is not None  # the class declares __inner_shapes__ (checked above)
        symbols = {size_symbol("", i): SizeSource(wrapper, i) for i in range(t.dim())}
        out = []
        for name, v in node.items():
            shape = shapes.get(name)
            if shape is None:
                continue
            for d, e in enumerate(shape[: v.dim()]):
                if e is FREE:
                    continue  # a size of its own: see free_dims()
                out.append(Relation(wrapper, SizeSource(InnerSource(name, wrapper), d), e,
                                    {s: symbols[s] for s in e.free_symbols if s in symbols}))
        return out

    def free_dims(self, wrapper: Source = ROOT) -> list[SizeSource]:
        """The inner sizes the wrapper at ``wrapper`` declares ``FREE`` in
        ``__inner_shapes__`` (sizes of their own, no relation), in flatten order.

        Example:
            >>> import torch
            >>> from torch.testing._internal.two_tensor import TwoTensor
            >>> describe(TwoTensor(torch.ones(2), torch.ones(2))).free_dims()
            []
        """
        info = self._tensors[wrapper]
        t = info.tensor
        if not info.wrapper:
            return []
        node = self.node(wrapper)
        shapes = inner_shapes_of(type(t), t.dim(), node.ctx)
        if shapes is None:
            return []
        return [SizeSource(InnerSource(name, wrapper), d)
                for name, v in node.items() if name in shapes
                for d, e in enumerate(shapes[name][: v.dim()]) if e is FREE]

    def notes(self, name: str = "x") -> list[str]:
        """One line per inner size that will recompile although it could be dynamic:

        - a ``FREE`` inner size (``free_dims``) left static, unmarked or marked static:
          a batch with another size there recompiles;
        - a derived inner size that stays static although an outer size it derives from
          is marked dynamic: the size is 0 or 1 on this instance, and dynamo specializes
          sizes 0 and 1 whatever the mark says (``plan`` keeps it static for that reason).
          The graph then serves every outer size with that same inner size, and an
          instance on which it is 2 or more recompiles.

        Example:
            >>> import torch
            >>> from subclass_kit.examples import BlockScaled  # doctest: +SKIP
            >>> x = BlockScaled.from_float(torch.randn(32, 8))  # doctest: +SKIP
            >>> describe(x, plan(x, 0)).notes()  # doctest: +SKIP
            ['x.scale dim 0 = ceiling(s0/32) = 1 on this instance: kept static ...']
        """
        out = []
        for src, info in self._tensors.items():
            if not info.wrapper:
                continue
            try:
                relations = self.relations(src)
                out.extend(self._free_static(src, info, name))
            except RelationError:
                continue  # the relations' own error is raised where they are used
            for r in relations:
                if r.constant or r.expr.is_Symbol:
                    continue
                dynamic = sorted(ss.dim for ss in r.symbols.values() if info.kind(ss.dim) is DimKind.DYNAMIC)
                inner = self._tensors.get(r.target.base)
                if not dynamic or inner is None or inner.kind(r.target.dim) is DimKind.DYNAMIC:
                    continue
                v = inner.tensor.size(r.target.dim)
                if type(v) is not int or v >= 2:
                    continue
                out.append(
                    f"{r.target.base.render(name)} dim {r.target.dim} = {r.expr} = {v} on this "
                    f"instance: kept static (dynamo specializes sizes 0 and 1) while outer dim(s) "
                    f"{dynamic} of {src.render(name)} are dynamic; a size >= 2 will recompile "
                    f"(mark an instance on which it is >= 2 to cover those sizes in one graph)."
                )
        return out

    def _free_static(self, src: Source, info: TensorDims, root: str) -> list[str]:
        """One note per FREE inner size of the wrapper at ``src`` that stays static."""
        out = []
        cls = type(info.tensor).__name__
        for target in self.free_dims(src):
            inner = self._tensors.get(target.base)
            kind = None if inner is None else inner.kind(target.dim)
            if kind not in (None, DimKind.STATIC):
                continue
            how = ("marked static: every new size recompiles" if kind is DimKind.STATIC else
                   "unmarked: the first graph specializes it, so a new size recompiles (automatic "
                   "dynamic makes it dynamic then)")
            attr = target.base.attr if isinstance(target.base, InnerSource) else "?"
            named = (f"symbolic.mark_dynamic({root}, dims, inner={{{attr!r}: [{target.dim}]}})" if src == ROOT
                     else f"a SubclassPolicy for {src.render(root)} with inner={{{attr!r}: [{target.dim}]}}")
            out.append(
                f"{target.render(f'L[{root!r}]')} is free (FREE in {cls}.__inner_shapes__) and {how}. "
                f"Mark it dynamic: mark an outer dim of {src.render(root)} dynamic (symbolic.mark_dynamic "
                f"or torch._dynamo.mark_dynamic / maybe_mark_dynamic), which marks its free dims "
                f"too, or name it: {named}."
            )
        return out

    def __repr__(self) -> str:
        rows = []
        for src, info in self._tensors.items():
            dims = {i: k.value for i in range(info.tensor.dim()) if (k := info.kind(i)) is not None}
            rows.append(f"{src.render('x')}: {dims}")
        return "ShapeDescription(" + "; ".join(rows) + ")"


def describe(t: torch.Tensor, policy: Any = None) -> ShapeDescription:
    """How dynamo treats every dimension of ``t`` and of the tensors inside it.

    Args:
        t: a plain or wrapped tensor.
        policy: a ``SubclassPolicy`` (or a ``{dim: Dim}`` for the outer tensor) read as
            ``apply`` would mark it; None reads the marks the tensors carry. A tensor the
            policy says nothing about is read from its marks.

    Returns:
        A ``ShapeDescription``.

    Raises:
        PolicyError / PolicyTypeError: a policy that does not fit ``t``.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> x = TwoTensor(torch.ones(4, 2), torch.ones(4, 2))
        >>> describe(x, SubclassPolicy(outer={0: Dim.dynamic()}, inner={"a": [0]}))
        ShapeDescription(x: {0: 'dynamic'}; x.a: {0: 'dynamic'}; x.b: {})
    """
    if not isinstance(t, torch.Tensor):
        raise PolicyTypeError(f"describe() expects a tensor, got {type(t).__name__}.")
    root = tree(t)
    out: dict[Source, TensorDims] = {}
    _describe(root, policy, False, out)
    return ShapeDescription(out, root)


def _describe(node: Node, policy, nested, out) -> None:
    t, src, wrapper = node.tensor, node.source, node.wrapper
    nested_wrapper = nested and wrapper
    inner_pol: Mapping = {}
    if policy is None:
        info = _from_marks(t, src, wrapper, nested_wrapper)
    else:
        if isinstance(policy, SubclassPolicy):
            outer, inner_pol = policy.outer, policy.inner
        elif isinstance(policy, Mapping):
            outer = normalize_dims(policy, where(src))
        else:
            raise PolicyTypeError(
                f"{where(src)}: a policy must be a symbolic.SubclassPolicy or a {{dim: Dim}} "
                f"mapping, got {type(policy).__name__}."
            )
        info = _from_policy(t, src, resolve_dims(t, outer, src), wrapper, nested_wrapper)
    out[src] = info
    for name, child in node.children:
        _describe(child, inner_pol.get(name), True, out)


def _from_marks(t, src, wrapper, nested_wrapper) -> TensorDims:
    dims, unbacked = {}, set()
    for i, (kind, lo, hi) in _compat.read_marks(t).items():
        if kind is DimKind.UNBACKED:
            unbacked.add(i)
        else:
            dims[i] = Dim(kind, lo, hi)
    refused = tuple(sorted(i for i, d in dims.items() if d.kind is DimKind.DYNAMIC)) if nested_wrapper else ()
    return TensorDims(src, t, dims, frozenset(unbacked), _compat.mark_attrs(t), wrapper,
                      nested_wrapper, refused)


def _from_policy(t, src, dims: dict[int, Dim], wrapper, nested_wrapper) -> TensorDims:
    out: dict[int, Dim] = {}
    attrs: dict[str, set[int]] = {}
    for i, dim in dims.items():
        if nested_wrapper and dim.kind is DimKind.DYNAMIC:
            dim = Dim.auto()  # what `apply` marks there (see the module docstring)
        out[i] = dim
        attrs.setdefault(_compat.ATTR_OF_KIND[dim.kind], set()).add(i)
    return TensorDims(src, t, out, frozenset(), {a: frozenset(s) for a, s in attrs.items()},
                      wrapper, nested_wrapper, ())
