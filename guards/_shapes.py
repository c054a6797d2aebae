"""A small model of dynamo's ShapeEnv: which sizes, strides and offsets become symbols,
which symbols are shared, and which shape guards that produces.

It follows torch/fx/experimental/symbolic_shapes.py (``create_symbol``,
``_compute_symbolic_stride``, ``produce_guards_verbose``) for the inputs alone:

* a STATIC dim is its value; a DUCK or DYNAMIC dim of size 0 or 1 is specialized to it;
* DUCK symbols are shared by value (duck sizing), DYNAMIC ones (marks, automatic dynamic)
  are fresh; strides are inferred from sizes where they match a contiguous product, else a
  DUCK symbol; the storage offset is static when every size is, else a DUCK symbol;
* guards: every source equals the expression it was given (this is where duck sizing and
  stride relations show up), every symbol lies in its range (``2 <= s``, ``s <= max``).

Static sizes and strides are left to the TENSOR_MATCH guard, as dynamo does. Guards the
traced code adds (broadcasting, branching on a size) are outside this model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from symbolic import DimKind

from . import _compat
from ._sources import SizeSource, Source, StorageOffsetSource, StrideSource
from .errors import PolicyViolationError

__all__ = ["Symbol", "TensorShape", "ShapeSim", "Equality", "Range"]


@dataclass(eq=False)
class Symbol:
    """One symbol: its value at build time, range, and the sources that equal it."""

    index: int
    value: int | None
    lo: int | None
    hi: int | None
    sym: sympy.Symbol
    sources: list = field(default_factory=list)
    unbacked: bool = False


@dataclass(eq=False)
class TensorShape:
    """Size, stride and offset expressions of one tensor (ints where static)."""

    source: Source
    sizes: list
    strides: list
    offset: Any
    match: bool  # False for a view's ``_base``: no TENSOR_MATCH, only symbolic guards
    free_stride: bool = False  # some stride is a symbol of its own, not a product of sizes
    symbolic: bool = True  # False when every size, stride and the offset is an int
    _properties: tuple | None = field(default=None, repr=False)

    def static_sizes(self) -> list:
        return [int(s) if _is_int(s) else None for s in self.sizes]

    def static_strides(self) -> list:
        return [int(s) if _is_int(s) else None for s in self.strides]

    def properties(self) -> tuple:
        """``(source, expr)`` for every size, stride and the offset, in dynamo's order.

        Built once per tensor (``finish`` reads it twice; sources are torch ``Source``
        objects, not free to build).
        """
        if self._properties is None:
            src = self.source
            self._properties = (
                *((SizeSource(src, i), s) for i, s in enumerate(self.sizes)),
                *((StrideSource(src, i), s) for i, s in enumerate(self.strides)),
                (StorageOffsetSource(src), self.offset),
            )
        return self._properties


@dataclass(frozen=True)
class Equality:
    """``source == expr`` where expr is over symbols (rendered through their first source)."""

    source: Source
    expr: Any


@dataclass(frozen=True)
class Range:
    """``lo <= source`` and/or ``source <= hi`` for the first source of a symbol."""

    source: Source
    lo: int | None
    hi: int | None


def _is_int(x) -> bool:
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer)


class ShapeSim:
    """Allocates symbols for the tensors of one frame, in the order dynamo sees them."""

    def __init__(self, *, duck: bool | None = None):
        self.duck = _compat.use_duck_shape() if duck is None else duck
        self.symbols: list[Symbol] = []
        self._by_sym: dict[sympy.Symbol, Symbol] = {}
        self._val_to_var: dict[int, Symbol] = {}
        self.tensors: list[TensorShape] = []

    # -- allocation --------------------------------------------------------------------
    def _new(self, value, lo, hi, *, unbacked=False, sym=None) -> Symbol:
        i = len(self.symbols)
        s = Symbol(i, value, lo, hi, sym if sym is not None else sympy.Symbol(f"s{i}", positive=True, integer=True),
                   unbacked=unbacked)
        self.symbols.append(s)
        self._by_sym[s.sym] = s
        return s

    def create(self, value: int, source: Source, kind: DimKind, lo: int | None = None, hi: int | None = None) -> Any:
        """The expression dynamo gives ``source`` (value ``value``, kind ``kind``)."""
        if lo is not None and hi is not None and lo == hi:
            # A range of one value is static (create_symbol turns it into STATIC).
            if value != lo:
                raise PolicyViolationError(
                    f"{source.name} is constrained to exactly {lo} but the input has {value}"
                )
            kind = DimKind.STATIC
        if kind is DimKind.STATIC:
            return sympy.Integer(value)
        if kind is DimKind.UNBACKED:
            return self._new(value, None, None, unbacked=True).sym
        if value in (0, 1):
            if lo is not None or hi is not None:
                # A ranged mark_dynamic is a StrictMinMaxConstraint: dynamo refuses to let
                # it become a constant, 0/1 included (an unranged mark may specialize).
                raise PolicyViolationError(
                    f"{source.name} = {value} is marked dynamic with a range "
                    f"[{lo}, {hi}] but sizes 0 and 1 are specialized; dynamo raises "
                    "ConstraintViolationError. Drop the range or use maybe_mark_dynamic."
                )
            return sympy.Integer(value)  # 0/1 specialization, even for a marked dim
        duck = kind is DimKind.DUCK and self.duck
        if duck and value in self._val_to_var:
            return self._val_to_var[value].sym
        rlo = 2 if lo is None else max(2, lo)
        if value < rlo or (hi is not None and value > hi):
            raise PolicyViolationError(
                f"{source.name} = {value} is outside its marked range "
                f"[{lo if lo is not None else 2}, {hi if hi is not None else 'inf'}]; "
                "dynamo raises ConstraintViolationError when compiling such an input"
            )
        s = self._new(value, rlo, hi)
        if duck:
            self._val_to_var[value] = s
        return s.sym

    def _symbolic_passthrough(self, expr):
        """Map an already-symbolic size (a fake tensor's SymInt) into our symbols."""
        for fs in sorted(expr.free_symbols, key=str):
            if fs not in self._by_sym:
                self._new(None, None, None, sym=fs)
        return expr

    def tensor(self, source: Source, t: torch.Tensor, kinds: list, stride_dynamic: list,
               *, match: bool = True) -> TensorShape:
        """Allocate ``t``'s sizes, strides and offset; ``kinds[i]`` is ``(kind, lo, hi)``."""
        raw_sizes = [_compat.sym_value(s) for s in t.size()]
        raw_strides = [_compat.sym_value(s) for s in t.stride()]
        raw_off = _compat.sym_value(t.storage_offset())
        if any(e is not None for _, e in raw_sizes + raw_strides + [raw_off]):
            # Fake tensor during tracing: keep torch's own expressions.
            sizes = [sympy.Integer(v) if e is None else self._symbolic_passthrough(e) for v, e in raw_sizes]
            strides = [sympy.Integer(v) if e is None else self._symbolic_passthrough(e) for v, e in raw_strides]
            off = sympy.Integer(raw_off[0]) if raw_off[1] is None else self._symbolic_passthrough(raw_off[1])
            shape = TensorShape(source, sizes, strides, off, match)
            self.tensors.append(shape)
            return shape

        ex_size = [v for v, _ in raw_sizes]
        ex_stride = [v for v, _ in raw_strides]
        # A STATIC dim is its value (``create``'s first answer); its source is not built.
        sizes = [
            sympy.Integer(v) if k is DimKind.STATIC else self.create(v, SizeSource(source, i), k, lo, hi)
            for i, (v, (k, lo, hi)) in enumerate(zip(ex_size, kinds))
        ]
        all_static = all(k is DimKind.STATIC for k, _, _ in kinds)
        self._free = False
        strides = self._strides(source, sizes, ex_size, ex_stride, stride_dynamic, all_static)
        if all_static:
            off = sympy.Integer(raw_off[0])
        else:
            off = self.create(raw_off[0], StorageOffsetSource(source), DimKind.DUCK)
        shape = TensorShape(source, sizes, strides, off, match, self._free,
                            symbolic=not (all_static and not any(stride_dynamic)))
        self.tensors.append(shape)
        return shape

    def _strides(self, source, sizes, ex_size, ex_stride, stride_dynamic, all_static):
        # Mirrors ShapeEnv._compute_symbolic_stride: fill strides smallest first (ties: the
        # rightmost dim first), reusing "size * stride" products of dims already filled.
        n = len(ex_size)
        out: list = [None] * n
        candidates: dict[int, Any] = {}
        order = sorted(((v, -i) for i, v in enumerate(ex_stride)))
        for val, neg_i in order:
            i = -neg_i
            contiguous = i != n - 1 and ex_stride[i] == ex_size[i + 1] * ex_stride[i + 1]
            if val in (0, 1) and not contiguous:
                st = sympy.Integer(val)
            elif not stride_dynamic[i] and val in candidates:
                st = candidates[val]
            else:
                if stride_dynamic[i]:
                    kind = DimKind.DYNAMIC
                else:
                    kind = DimKind.STATIC if all_static else DimKind.DUCK
                if kind is DimKind.STATIC:
                    st = sympy.Integer(val)
                else:
                    st = self.create(val, StrideSource(source, i), kind)
                    self._free = self._free or not st.is_Integer
            out[i] = st
            prod = sizes[i] * st
            candidates[ex_size[i] * val] = prod if prod.is_Integer else sympy.expand(prod)
        return out

    # -- guards ------------------------------------------------------------------------
    def finish(self) -> tuple[list[Equality], list[Range]]:
        """Shape guards for everything allocated: equalities, then ranges."""
        # A shape with no symbol (every dim static) has nothing for these guards; its
        # sources are not built.
        shapes = [shape for shape in self.tensors if shape.symbolic]
        first: dict[sympy.Symbol, Source] = {}
        for shape in shapes:
            for src, expr in shape.properties():
                if isinstance(expr, sympy.Symbol):
                    sym = self._by_sym[expr]
                    sym.sources.append(src)
                    first.setdefault(expr, src)
        eqs: list[Equality] = []
        seen: set = set()
        for shape in shapes:
            for src, expr in shape.properties():
                if _is_int(expr):
                    continue  # static: TENSOR_MATCH's job (or unguarded, for offsets)
                if isinstance(expr, sympy.Symbol) and first.get(expr) == src:
                    continue
                if src in seen:
                    continue
                seen.add(src)
                eqs.append(Equality(src, expr))
        ranges = [
            Range(first[s.sym], s.lo, s.hi)
            for s in self.symbols
            if s.sym in first and not s.unbacked and (s.lo is not None or s.hi is not None)
        ]
        return eqs, ranges

    def first_sources(self) -> dict:
        """``{sympy symbol: first source}`` (valid after ``finish``)."""
        return {s.sym: s.sources[0] for s in self.symbols if s.sources}
