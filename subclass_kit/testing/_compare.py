"""Comparing results: wrapped against wrapped (type, ctx, then every inner tensor), or
anything against a dense reference (through ``to_plain()``).

Returns a description of the first difference, or None. Descriptions name the place with
a path (``output[1].scale``) so that a failing row says where the results part. A wrapped
result whose class declares don't-care positions (``__plain_mask__``, see ``_mask``) is
compared at its meaningful positions only, and a difference there names the positions.
"""

from __future__ import annotations

import torch

from .. import _compat
from ._mask import plain_mask
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


# torch.testing.assert_close's defaults, to name the positions that differ
_CLOSE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
          torch.float64: (1e-7, 1e-7)}


def _where_differ(a: torch.Tensor, e: torch.Tensor, care: torch.Tensor, path: str) -> str:
    """``path: values differ at N of M meaningful positions ...`` naming the first few."""
    a, e, care = a.detach().cpu(), e.detach().cpu(), care.cpu()
    if _bitwise(e.dtype) or not e.dtype.is_floating_point:
        bad = a != e
    else:
        rtol, atol = _CLOSE.get(e.dtype, (1.3e-6, 1e-5))
        bad = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    bad = bad & care
    where = bad.nonzero()
    first = [tuple(i.tolist()) for i in where[:3]]
    shown = "; ".join(f"{i}: got {a[i].item():.4g}, expected {e[i].item():.4g}" for i in first)
    return (f"{path}: values differ at {len(where)} of {int(care.sum())} meaningful positions "
            f"(__plain_mask__; {e.numel() - int(care.sum())} don't-care positions not compared), at {shown}")


def _values(a: torch.Tensor, e: torch.Tensor, path: str, values: bool = True, care=None):
    if a.shape != e.shape:
        return f"{path}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"{path}: dtype {a.dtype}, expected {e.dtype}"
    if not values:
        return None
    if a.device.type == "meta" or e.device.type == "meta" or _compat.is_fake(a) or _compat.is_fake(e):
        return None
    if care is not None:
        care = care.expand(e.shape).to(e.device)
        if _values(a.detach()[care], e.detach()[care], path) is None:
            return None
        return _where_differ(a, e, care, path)
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
        masked = _masked_difference(actual, expected, path)
        if masked is not False:
            return masked
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


def _masked_difference(actual, expected, path: str):
    """For results of the same type, shape and ctx with don't-care positions: their
    non-floating inner tensors (offsets, indices: the structure) and their meaningful
    positions (the same mask on both, ``to_plain()`` equal there). False when ``expected``
    has no don't-care positions."""
    em = plain_mask(expected) if has_to_plain(type(expected)) else None
    if em is None:
        return False
    for n in flatten(expected)[0]:
        av, ev = getattr(actual, n), getattr(expected, n)
        if isinstance(ev, torch.Tensor) and not (ev.dtype.is_floating_point or ev.dtype.is_complex):
            d = difference(av, ev, f"{path}.{n}")
            if d:
                return d
    am = plain_mask(actual)
    if am is None or not torch.equal(am, em):
        return f"{path}: the meaningful positions (__plain_mask__) differ from the expected result's"
    return _values(dense(actual), dense(expected), f"{path}.to_plain()", care=em)


def densify(v):
    """Map every wrapped tensor with a ``to_plain()`` in a result to its dense value."""
    if isinstance(v, torch.Tensor):
        return dense(v)
    if isinstance(v, (list, tuple)):
        return type(v)(densify(x) for x in v) if not hasattr(v, "_fields") else type(v)(*map(densify, v))
    return v


def dense_difference(actual, expected_dense, path: str = "output", *, values: bool = True, judged=None):
    """First difference between a (possibly wrapped) result and a dense reference, or None
    (``values=False``: shapes and dtypes only, for random or uninitialized results).

    A wrapped result is compared where its ``__plain_mask__`` is True; ``judged`` (a list,
    one entry per leaf of the result: a bool tensor or None) narrows the positions further
    (see :class:`~subclass_kit.testing._mask.Reference`)."""
    if judged is not None or _any_masked(actual):
        return _dense_leaves(actual, expected_dense, path, values, list(judged or []))
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


def _any_masked(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_any_masked(x) for x in v)
    return isinstance(v, torch.Tensor) and type(v) is not torch.Tensor and plain_mask(v) is not None


def _dense_leaves(actual, expected, path: str, values: bool, judged: list):
    """``dense_difference`` leaf by leaf, each tensor at its meaningful, judged positions."""
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Tensor):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: got {actual!r:.80}, expected {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            d = _dense_leaves(a, e, f"{path}[{i}]", values, judged)
            if d:
                return d
        return None
    j = judged.pop(0) if judged else None
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return dense_difference(actual, expected, path, values=values)
    care = plain_mask(actual) if type(actual) is not torch.Tensor else None
    if j is not None:
        care = j if care is None else (care & j)
    a = dense(actual)
    if type(a) is not torch.Tensor and _compat.is_traceable_wrapper_subclass(a):
        return None if not has_to_plain(type(a)) else f"{path}: to_plain() returned a {type(a).__name__}, expected a plain tensor"
    return _values(a.detach(), expected.detach(), path, values, care)
