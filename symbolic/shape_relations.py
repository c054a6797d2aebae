"""Shape relations: which inner sizes are functions of which outer sizes.

A class's ``__inner_shapes__(outer_size, ctx)`` is evaluated on sympy symbols for the outer
sizes; each inner size it returns is an expression in those symbols. A class without it
(torch's ``TwoTensor``, ``DTensor``) gets relations inferred from an instance: an inner dim
equals the outer dim at the same index when their sizes are equal on the example.

Symbol naming (stable, documented in ``docs/symbolic.md``):

- the outer tensor's dim ``i`` is ``s{i}`` (``s0``, ``s1``, ...);
- dim ``i`` of the inner tensor at attribute path ``p`` is ``{p with '.' -> '_'}_{i}``
  (``scale_0``, ``a_scale_0`` for ``x.a.scale``).

All symbols are ``sympy.Symbol(name, integer=True, positive=True)``; get them with
``size_symbol`` rather than building them by hand (sympy symbols with different assumptions
are different symbols).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import sympy
import torch

from . import _compat
from .errors import PolicyTypeError, RelationError
from .free_dims import FREE
from .protocol import Node, path_of, tree, walk, where
from .source_types import ROOT, InnerSource, SizeSource, Source

__all__ = ["size_symbol", "size_sources", "relations", "TensorShape", "analyze", "inner_shapes_of", "multiple_of"]


def size_symbol(path: str, dim: int) -> sympy.Symbol:
    """The symbol ``relations`` uses for ``dim`` of the tensor at ``path`` (``""`` = outer).

    Example:
        >>> size_symbol("", 0), size_symbol("scale", 0), size_symbol("a.scale", 1)
        (s0, scale_0, a_scale_1)
    """
    name = f"s{dim}" if path == "" else f"{path.replace('.', '_')}_{dim}"
    return sympy.Symbol(name, integer=True, positive=True)


def size_sources(t: torch.Tensor) -> dict[sympy.Symbol, SizeSource]:
    """Each size symbol of ``t`` (as ``relations`` names them) and the source of that size.

    Lets a relation be read against a tensor, or rendered with dynamo's names.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> x = TwoTensor(torch.ones(4), torch.ones(4))
        >>> {str(k): v.name_for("x") for k, v in size_sources(x).items()}
        {'s0': "L['x'].size()[0]", 'a_0': "L['x'].a.size()[0]", 'b_0': "L['x'].b.size()[0]"}
    """
    return {
        size_symbol(path_of(src), i): SizeSource(src, i)
        for src, tensor in walk(t)
        for i in range(tensor.dim())
    }


@dataclass(frozen=True)
class TensorShape:
    """One tensor reached inside a root: where it is, and its sizes as expressions.

    ``exprs[i]`` is dim ``i`` in terms of the root's symbols (``s0``...) where a relation
    ties it to them, else the tensor's own symbol ``symbols[i]``. ``free`` holds the dims
    the declaring class marks ``FREE`` in ``__inner_shapes__`` (their ``exprs`` are their
    own symbols).
    """

    source: Source
    tensor: torch.Tensor
    symbols: tuple
    exprs: tuple
    free: frozenset = frozenset()

    def related(self, i: int) -> bool:
        """True when dim ``i`` is given by a relation rather than its own free symbol."""
        return self.exprs[i] != self.symbols[i]


def _tidy(expr: Any) -> sympy.Expr:
    expr = sympy.sympify(expr)
    if expr.is_Atom:
        return expr
    # `-(-a // b)` (the usual ceil-div idiom) reaches sympy as -floor(-a/b); say ceiling.
    expr = expr.replace(
        lambda e: e.is_Mul and len(e.args) == 2 and e.args[0] == -1 and isinstance(e.args[1], (sympy.floor, sympy.ceiling)),
        lambda e: (sympy.ceiling if isinstance(e.args[1], sympy.floor) else sympy.floor)(-e.args[1].args[0]),
    )
    return sympy.simplify(expr) if not expr.is_Atom else expr


def _evaluate(cls: Any, ndim: int, ctx: Any) -> Mapping[str, tuple]:
    outer = tuple(size_symbol("", i) for i in range(ndim))
    try:
        shapes = cls.__inner_shapes__(outer, ctx)
    except Exception as e:
        if isinstance(e, TypeError) and ("truth value" in str(e) or "Relational" in str(e)):
            raise RelationError(
                f"{cls.__name__}.__inner_shapes__ branches on a size (`if`, `max`, `min`, `%` "
                f"tested in Python), which sympy symbols cannot answer ({e}). Write it as plain "
                "arithmetic with symbolic.ceil_div / floor_div / sym_max / sym_min."
            ) from e
        raise RelationError(
            f"{cls.__name__}.__inner_shapes__ failed on symbolic outer size {outer}: {e!r}. It "
            "must be plain arithmetic that runs on ints, SymInts and sympy symbols."
        ) from e
    try:
        # Read-only: the result is cached and shared between callers.
        return MappingProxyType({name: tuple(s if s is FREE else _tidy(s) for s in shape)
                                 for name, shape in shapes.items()})
    except (TypeError, sympy.SympifyError, AttributeError) as e:
        raise RelationError(
            f"{cls.__name__}.__inner_shapes__ must return {{inner_name: tuple_of_sizes}}, got "
            f"{shapes!r} ({e})."
        ) from e


@functools.lru_cache(maxsize=256)
def _evaluate_cached(cls: type, ndim: int, ctx: Any) -> Mapping[str, tuple]:
    return _evaluate(cls, ndim, ctx)


def _njt_shapes(ndim: int, ctx: Any) -> Mapping[str, tuple]:
    # torch's NestedTensor has no __inner_shapes__; its layout is fixed: ``_offsets`` has one
    # entry more than the batch, ``_lengths`` one per batch item, ``_values`` the ragged dim
    # collapsed into its dim ``ragged_idx - 1`` (FREE: a size of its own) and the outer dims after
    # the ragged one; the seqlen tensors' sizes are their own (left out).
    r = int(ctx["ragged_idx"]) if isinstance(ctx, Mapping) and "ragged_idx" in ctx else 1
    outer = [size_symbol("", i) for i in range(ndim)]
    values = tuple(outer[1:r]) + (FREE,) + tuple(outer[r + 1:])
    return MappingProxyType({
        "_values": values,
        "_offsets": (outer[0] + 1,),
        "_lengths": (outer[0],),
    })


def inner_shapes_of(cls: type, ndim: int, ctx: Any) -> Mapping[str, tuple] | None:
    """``__inner_shapes__`` of ``cls`` evaluated on the symbols ``s0, s1, ...`` (cached), the
    fixed layout of torch's NestedTensor, or None for a class that declares neither. A dim
    the class marks ``FREE`` stays ``FREE``; every other dim is a sympy expression.

    Raises:
        RelationError: ``__inner_shapes__`` is not plain arithmetic on symbols.
    """
    if _compat.is_njt_class(cls):
        return _njt_shapes(ndim, ctx)
    if not callable(getattr(cls, "__inner_shapes__", None)):
        return None
    try:
        hash(ctx)
    except TypeError:
        return _evaluate(cls, ndim, ctx)
    # simplify() is slow (~0.1 s); mark_dynamic in a loop over sizes must not pay it each time.
    return _evaluate_cached(cls, ndim, ctx)


def multiple_of(expr: Any) -> tuple[int, int, sympy.Symbol] | None:
    """``(k, a, s)`` when ``expr`` is ``floor(a*s/k)`` (``floor_div(a*s, k)``, ``k > 1``): an
    outer size that is a multiple of an inner size. On an instance where ``a*s`` is a
    multiple of ``k`` the relation is stated as torch states it, ``k*inner == a*s``
    (dynamo's ``Eq(2*s50, s77)``), not ``inner == a*s // k``. None for other forms.

    Example:
        >>> s0 = size_symbol("", 0)
        >>> multiple_of(sympy.floor(s0 / 2)), multiple_of(sympy.ceiling(s0 / 2)), multiple_of(s0)
        ((2, 1, s0), None, None)
    """
    if not isinstance(expr, sympy.floor):
        return None
    num, den = sympy.fraction(sympy.together(expr.args[0]))
    a, s = num.as_coeff_Mul()
    if not (den.is_Integer and int(den) > 1 and a.is_Integer and int(a) > 0 and s.is_Symbol):
        return None
    return int(den), int(a), s


def _known(symbols, sizes) -> dict:
    # Jagged dims (nested ints) have no single value; their symbols stay free.
    return {s: sympy.Integer(n) for s, n in zip(symbols, sizes) if type(n) is int}


def _same_int(a, b) -> bool:
    return type(a) is int and type(b) is int and a == b


def analyze(t: "torch.Tensor | Node") -> list[TensorShape]:
    """Every tensor in ``t`` (pre-order) with its sizes as expressions in the root's symbols.

    ``t`` is a tensor or its ``protocol.tree`` (read as it is, without flattening again).
    Raises ``RelationError`` when ``__inner_shapes__`` cannot be evaluated on symbols or
    contradicts the instance.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> [s.exprs for s in analyze(TwoTensor(torch.ones(4, 2), torch.ones(4, 2)))]
        [(s0, s1), (s0, s1), (s0, s1)]
    """
    if isinstance(t, torch.Tensor):
        t = tree(t)
    elif not isinstance(t, Node):
        raise PolicyTypeError(f"expected a tensor, got {type(t).__name__}.")
    out: list[TensorShape] = []
    values: dict[sympy.Symbol, int] = {}
    root_syms = tuple(size_symbol("", i) for i in range(t.tensor.dim()))
    values.update(_known(root_syms, t.tensor.shape))
    _analyze(t, root_syms, root_syms, values, out)
    return out


def _analyze(node: Node, symbols, exprs, values, out, free=frozenset()) -> None:
    t, src = node.tensor, node.source
    out.append(TensorShape(src, t, symbols, exprs, free))
    if not node.wrapper:
        return
    cls = type(t)
    shapes = inner_shapes_of(cls, t.dim(), node.ctx)
    canon = {size_symbol("", i): e for i, e in enumerate(exprs)}
    for name, child in node.children:
        v = child.tensor
        isrc = child.source
        path = path_of(isrc)
        syms = tuple(size_symbol(path, j) for j in range(v.dim()))
        values.update(_known(syms, v.shape))
        ifree: frozenset = frozenset()
        if shapes is not None and name in shapes:
            shape = shapes[name]
            if len(shape) != v.dim():
                raise RelationError(
                    f"{where(isrc)}: {cls.__name__}.__inner_shapes__ gives {len(shape)} dims "
                    f"{shape} but the tensor has {v.dim()} (shape {tuple(v.shape)})."
                )
            ifree = frozenset(j for j, e in enumerate(shape) if e is FREE)
            iexprs = tuple(syms[j] if j in ifree else e.xreplace(canon) for j, e in enumerate(shape))
            for j, e in enumerate(iexprs):
                got = v.size(j)
                if j in ifree or type(got) is not int:
                    continue  # a nested int (jagged dim) has no value to check against
                want = e.xreplace(values)
                if want.free_symbols or want != got:
                    raise RelationError(
                        f"{where(isrc)}.size({j}) is {got} but {cls.__name__}.__inner_shapes__ "
                        f"says {shape[j]} = {want} for the outer size {tuple(t.shape)}. Fix the "
                        "instance or __inner_shapes__."
                    )
        elif shapes is not None:
            # Left out of __inner_shapes__ (or NestedTensor's seqlen tensors): a shape of
            # its own, as dynamo treats any inner tensor; nothing is inferred from sizes
            # that happen to be equal.
            iexprs = syms
        else:
            # No declared relation: only the "same size at the same index" ones are safe to infer.
            iexprs = tuple(
                exprs[j] if j < t.dim() and _same_int(v.size(j), t.size(j)) else syms[j]
                for j in range(v.dim())
            )
        _analyze(child, syms, iexprs, values, out, ifree)


def _class_ndim(cls: type, ndim: int | None) -> int:
    if ndim is not None:
        return ndim
    samples = getattr(cls, "__samples__", None)
    if callable(samples):
        got = samples()
        if got:
            return got[0].dim()
    raise PolicyTypeError(
        f"relations({cls.__name__}) needs the outer tensor's number of dims: pass ndim=..., "
        f"or an instance."
    )


def relations(t_or_cls: Any, *, ndim: int | None = None) -> list[sympy.Eq]:
    """The equalities between inner size symbols and outer size expressions.

    On a class, ``__inner_shapes__`` is evaluated with the meta defaults
    (``__default_ctx__()``); on an instance, with its own meta values, recursively through
    nested wrappers. Classes without ``__inner_shapes__`` get the "same size" relations an
    instance shows (inner dim ``i`` equals outer dim ``i``). Symbols are named by
    ``size_symbol``: ``s0, s1, ...`` outside, ``scale_0``, ``a_scale_0`` inside.

    Args:
        t_or_cls: a wrapped tensor, or a class with ``__inner_shapes__``.
        ndim: the outer rank, for a class (default: from its ``__samples__``).

    Returns:
        ``[sympy.Eq(inner_symbol, expression), ...]`` in flatten order.

    Raises:
        RelationError: ``__inner_shapes__`` is not plain arithmetic, or contradicts ``t``.
        PolicyTypeError: not a tensor or class; a class without ``__inner_shapes__``.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> relations(TwoTensor(torch.ones(4, 2), torch.ones(4, 2)))
        [Eq(a_0, s0), Eq(a_1, s1), Eq(b_0, s0), Eq(b_1, s1)]
    """
    if isinstance(t_or_cls, type):
        cls = t_or_cls
        if not callable(getattr(cls, "__inner_shapes__", None)):
            raise PolicyTypeError(
                f"relations({cls.__name__}): the class has no __inner_shapes__, so relations "
                "can only be inferred from an instance; pass one."
            )
        default_ctx = getattr(cls, "__default_ctx__", None)
        ctx = default_ctx() if callable(default_ctx) else None
        n = _class_ndim(cls, ndim)
        shapes = inner_shapes_of(cls, n, ctx)
        assert shapes is not None  # the class declares __inner_shapes__ (checked above)
        return [
            sympy.Eq(size_symbol(name, j), e)
            for name, shape in shapes.items()
            for j, e in enumerate(shape)
            if e is not FREE
        ]
    if not isinstance(t_or_cls, torch.Tensor):
        raise PolicyTypeError(
            f"relations() takes a wrapped tensor or a wrapper class, got {type(t_or_cls).__name__}."
        )
    out = []
    for info in analyze(t_or_cls)[1:]:
        for j, sym in enumerate(info.symbols):
            if info.related(j):
                out.append(sympy.Eq(sym, info.exprs[j]))
    return out
