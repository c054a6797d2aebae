"""Shape arithmetic that works alike on ints, SymInts and sympy expressions.

`__inner_shapes__` methods are written once and evaluated three ways: on concrete ints
(eager construction), on SymInts (fake tensors under torch.compile) and on sympy symbols
(`symbolic.relations`). Python's ``//`` means floor division for all three, but ceiling
division has no operator, and ``max``/``min`` branch in Python (which would specialize a
SymInt), so those four live here.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

# An int, a SymInt or a sympy expression (what __inner_shapes__ arithmetic runs on); Any,
# since sympy has no types and the result goes wherever an int would.
Size = Any

__all__ = ["ceil_div", "floor_div", "sym_max", "sym_min"]


def _is_sympy(*xs: Any) -> bool:
    return any(isinstance(x, sympy.Basic) for x in xs)


def ceil_div(a: Size, b: Size) -> Size:
    """Ceiling of ``a / b`` for ints, SymInts or sympy expressions.

    Example:
        >>> ceil_div(65, 32)
        3
        >>> import sympy; ceil_div(sympy.Symbol("s0", positive=True, integer=True), 32)
        ceiling(s0/32)
    """
    if _is_sympy(a, b):
        return sympy.ceiling(sympy.sympify(a) / sympy.sympify(b))
    # -(-a // b) keeps SymInt arithmetic in the integer domain (no float division).
    return -((-a) // b)


def floor_div(a: Size, b: Size) -> Size:
    """Floor of ``a / b`` for ints, SymInts or sympy expressions.

    Example:
        >>> floor_div(65, 32)
        2
        >>> import sympy; floor_div(sympy.Symbol("s0", positive=True, integer=True), 4)
        floor(s0/4)
    """
    if _is_sympy(a, b):
        return sympy.floor(sympy.sympify(a) / sympy.sympify(b))
    return a // b


def sym_max(a: Size, b: Size) -> Size:
    """``max(a, b)`` without a Python branch on symbolic values.

    Example:
        >>> sym_max(3, 5)
        5
    """
    if _is_sympy(a, b):
        return sympy.Max(a, b)
    return torch.sym_max(a, b)


def sym_min(a: Size, b: Size) -> Size:
    """``min(a, b)`` without a Python branch on symbolic values.

    Example:
        >>> sym_min(3, 5)
        3
    """
    if _is_sympy(a, b):
        return sympy.Min(a, b)
    return torch.sym_min(a, b)
