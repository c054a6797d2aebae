"""Comparing results: wrapped against wrapped (type, ctx, then every inner tensor), or
anything against a dense reference (through ``to_plain()``).

Returns a description of the first difference, or None. Descriptions name the place with
a path (``output[1].scale``) so that a failing row says where the results part.
"""

from __future__ import annotations

import torch

from .. import _compat
from ._subject import dense, flatten, has_to_plain

__all__ = ["difference", "dense_difference", "tolerances"]


def _bitwise(dtype: torch.dtype) -> bool:
    """float8 (which assert_close refuses), integer and bool results compare bit for bit."""
    return not (dtype.is_floating_point or dtype.is_complex) or dtype.itemsize == 1


def tolerances(dtype: torch.dtype) -> dict:
    """How results of ``dtype`` are compared: ``{}`` (torch's default rtol/atol for that
    dtype, as ``torch.testing.assert_close`` picks them) or ``{"rtol": 0, "atol": 0}``
    (bit for bit: float8, integers, bool).

    Example:
        >>> tolerances(torch.float32), tolerances(torch.float8_e4m3fn), tolerances(torch.int8)
        ({}, {'rtol': 0, 'atol': 0}, {'rtol': 0, 'atol': 0})
    """
    return {"rtol": 0, "atol": 0} if _bitwise(dtype) else {}


def _values(a: torch.Tensor, e: torch.Tensor, path: str, values: bool = True):
    if a.shape != e.shape:
        return f"{path}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"{path}: dtype {a.dtype}, expected {e.dtype}"
    if not values:
        return None
    if a.device.type == "meta" or e.device.type == "meta" or _compat.is_fake(a) or _compat.is_fake(e):
        return None
    if _bitwise(e.dtype):
        raw = (lambda t: t.view(torch.uint8)) if e.dtype.is_floating_point else (lambda t: t)  # noqa: E731
        ra, re_ = raw(a.detach().cpu().contiguous()), raw(e.detach().cpu().contiguous())
        if torch.equal(ra, re_):
            return None
        bad = (ra != re_).nonzero()
        first = tuple(bad[0].tolist()) if len(bad) else ()
        return (f"{path}: values differ bit for bit ({e.dtype}; {len(bad)} of {e.numel()} elements, "
                f"first at index {first})")
    try:
        torch.testing.assert_close(a, e, equal_nan=True, check_device=False)
    except AssertionError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        detail = "; ".join(ln for ln in lines[1:4]) or lines[0]
        return f"{path}: values differ ({detail})"
    return None


def difference(actual, expected, path: str = "output"):
    """First difference between two results that should be the same, or None.

    Wrapped tensors must agree in type, ctx, outer shape/dtype and every inner tensor.

    Example:
        >>> import torch
        >>> difference((torch.ones(2),), (torch.zeros(2),)) is not None
        True
        >>> difference([torch.ones(2)], [torch.ones(2)]) is None
        True
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: got {type(actual).__name__}, expected a tensor"
        if type(actual) is not type(expected):
            return f"{path}: got a {type(actual).__name__}, expected a {type(expected).__name__}"
        if not _compat.is_traceable_wrapper_subclass(expected):
            return _values(actual, expected, path)
        if [_compat.sym_expr(s) for s in actual.shape] != [_compat.sym_expr(s) for s in expected.shape]:
            # (nested ints compare by coefficient: their ragged structure is the inner offsets')
            return f"{path}: outer shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        if actual.dtype != expected.dtype:
            return f"{path}: outer dtype {actual.dtype}, expected {expected.dtype}"
        an, actx = flatten(actual)
        en, ectx = flatten(expected)
        if an != en:
            return f"{path}: inner tensors {an}, expected {en}"
        try:
            same_ctx = bool(actx == ectx)
        except Exception as e:  # a ctx whose == raises is reported by the ctx checks
            same_ctx = False
            actx = f"{actx!r} (== raised {type(e).__name__})"
        if not same_ctx:
            return f"{path}: ctx {actx!r}, expected {ectx!r}"
        for n in en:
            av, ev = getattr(actual, n), getattr(expected, n)
            if isinstance(ev, torch.Tensor):
                d = difference(av, ev, f"{path}.{n}")
                if d:
                    return d
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: got {actual!r:.80}, expected {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            d = difference(a, e, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            return f"{path}: keys differ"
        for k in expected:
            d = difference(actual[k], expected[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    try:
        same = bool(actual == expected)
    except Exception:
        same = False
    return None if same else f"{path}: {actual!r:.80}, expected {expected!r:.80}"


def densify(v):
    """Map every wrapped tensor with a ``to_plain()`` in a result to its dense value."""
    if isinstance(v, torch.Tensor):
        return dense(v)
    if isinstance(v, (list, tuple)):
        return type(v)(densify(x) for x in v) if not hasattr(v, "_fields") else type(v)(*map(densify, v))
    return v


def dense_difference(actual, expected_dense, path: str = "output", *, values: bool = True):
    """First difference between a (possibly wrapped) result and a dense reference, or None
    (``values=False``: shapes and dtypes only, for random or uninitialized results)."""
    a = densify(actual)
    if isinstance(a, torch.Tensor) and _compat.is_traceable_wrapper_subclass(a) and not has_to_plain(type(a)):
        return None
    if isinstance(a, torch.Tensor) and isinstance(expected_dense, torch.Tensor):
        if type(a) is not torch.Tensor and _compat.is_traceable_wrapper_subclass(a):
            return f"{path}: to_plain() returned a {type(a).__name__}, expected a plain tensor"
        return _values(a.detach(), expected_dense.detach(), path, values)
    if not values:
        return None
    return difference(a, expected_dense, path)
