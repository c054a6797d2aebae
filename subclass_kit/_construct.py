"""Validated construction: ``Cls(...)`` binds and checks every argument.

User construction (``BlockScaled(q, s, block=32)``) checks every argument, so a mistake is
reported where it is made, then builds the instance with the class's ``make`` (the one
trusted constructor, see ``_runtime.py``), as dispatch outputs and ``__tensor_unflatten__`` do.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .ctx import SubclassCtx
from .errors import ConstructionError, InnerShapeError, InnerShapesKeyError, OuterArgumentError
from .fields import MISSING, InnerField
from ._spec import check_meta_type, check_meta_value

__all__ = ["construct", "contiguous_strides"]


def contiguous_strides(size) -> tuple:
    """Row-major strides for ``size`` (works on SymInts)."""
    strides = []
    acc = 1
    for s in reversed(tuple(size)):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_inner_shapes(cls, spec, inners, size, ctx) -> None:
    expected = cls.__inner_shapes__(tuple(size), ctx)
    _check_inner_shapes_keys(spec, inners, size, expected)
    for f, t in zip(spec.inner, inners):
        if t is None or f.name not in expected:
            continue
        exp = tuple(expected[f.name])
        got = tuple(t.shape)
        if len(exp) != len(got):
            raise InnerShapeError(
                f"{spec.qualname}.{f.name} has shape {_fmt_shape(got)} but "
                f"{spec.qualname}.__inner_shapes__ expects {_fmt_shape(exp)} for outer size "
                f"{_fmt_shape(tuple(size))} (ndim {len(got)} vs {len(exp)}). Pass matching "
                "tensors, pass size= for the outer tensor, or fix __inner_shapes__."
            )
        for d, (e, g) in enumerate(zip(exp, got)):
            if isinstance(e, int) and isinstance(g, int):
                if e != g:
                    raise InnerShapeError(
                        f"{spec.qualname}.{f.name} has shape {_fmt_shape(got)} but "
                        f"{spec.qualname}.__inner_shapes__ expects {_fmt_shape(exp)} for outer "
                        f"size {_fmt_shape(tuple(size))} (dim {d}: expected {e}, got {g}). Pass "
                        "matching tensors, pass size= for the outer tensor, or fix __inner_shapes__."
                    )
            else:
                # Symbolic: a Python `!=` would specialize the dimension; torch._check records
                # the relation instead (and fails at trace time if it is provably false).
                _compat.sym_check(
                    g == e,
                    lambda f=f, d=d, e=e, g=g: (
                        f"{spec.qualname}.{f.name}.size({d}) is {g} but __inner_shapes__ "
                        f"expects {e}"
                    ),
                )


def _check_inner_shapes_keys(spec, inners, size, expected) -> None:
    # A wrong or missing key used to pass here unnoticed (the shape check skipped it) and
    # surface much later, inside torch, as "setStorage ... out of bounds". Absent optional
    # inners may be listed or not.
    if type(expected) is dict and len(expected) == len(inners) and all(n in expected for n in spec.inner_names):
        return  # the common case, checked without building anything
    where = f"{spec.qualname}.__inner_shapes__(outer_size={_fmt_shape(tuple(size))}, ctx)"
    if not hasattr(expected, "keys"):
        raise InnerShapesKeyError(
            f"{where} returned a {type(expected).__name__}, not a dict; return one shape per "
            f"inner field, e.g. {{{', '.join(repr(n) + ': (...)' for n in spec.inner_names)}}}."
        )
    present = [f.name for f, t in zip(spec.inner, inners) if t is not None]
    keys = list(expected.keys())
    unknown = [k for k in keys if k not in spec.inner_names]
    missing = [n for n in present if n not in keys]
    if unknown or missing:
        got = ", ".join(repr(k) for k in keys) or "no keys"
        wrong = []
        if unknown:
            wrong.append(f"{', '.join(repr(k) for k in unknown)} {'is not an inner field' if len(unknown) == 1 else 'are not inner fields'}")
        if missing:
            wrong.append(f"{', '.join(repr(n) for n in missing)} {'is' if len(missing) == 1 else 'are'} missing")
        raise InnerShapesKeyError(
            f"{where} returned keys {got}, but must return one shape per inner field: "
            f"expected {', '.join(repr(n) for n in present)} ({'; '.join(wrong)}). Fix the "
            f"keys of the dict {spec.qualname}.__inner_shapes__ returns."
        )


def construct(cls, args: tuple, kwargs: dict) -> Any:
    """Validated construction from user arguments; see ``WrapperTensor``."""
    spec = cls.__kit_spec__
    qual = spec.qualname
    if not spec.inner:
        raise ConstructionError(f"{qual} is abstract (declares no inner tensor) and cannot be constructed.")
    size = kwargs.pop("size", None)
    stride = kwargs.pop("stride", None)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", None)

    if len(args) > len(spec.fields):
        raise ConstructionError(
            f"{qual} takes at most {len(spec.fields)} positional arguments "
            f"({', '.join(f.name for f in spec.fields)}) but got {len(args)}."
        )
    values = {}
    for f, v in zip(spec.fields, args):
        values[f.name] = v
    kit = cls.__kit__
    for k, v in kwargs.items():
        if k not in kit.field_index:
            raise ConstructionError(
                f"{qual} got an unexpected keyword argument {k!r}. Its fields are "
                f"{[f.name for f in spec.fields]}; the outer tensor takes size=, stride=, "
                "dtype=, device=, requires_grad=."
            )
        if k in values:
            raise ConstructionError(f"{qual} got multiple values for field {k!r}.")
        values[k] = v

    inners = []
    for f in spec.inner:
        t = values.get(f.name, MISSING)
        if t is MISSING or t is None:
            if f.optional:
                inners.append(None)
                continue
            raise ConstructionError(
                f"{qual} is missing its inner tensor {f.name!r}"
                + (" (None given; declare it inner(optional=True) to allow that)" if t is None else "")
                + "."
            )
        if not isinstance(t, torch.Tensor):
            raise ConstructionError(
                f"{qual}.{f.name} is an inner tensor field but got a {type(t).__name__} "
                f"({t!r:.60}). Pass a torch.Tensor (e.g. torch.as_tensor(...))."
            )
        _check_dtype(qual, f, t)
        inners.append(t)

    primary = inners[0]
    for f, t in zip(spec.inner, inners):
        if t is not None and t.device != primary.device:
            raise ConstructionError(
                f"{qual}.{f.name} is on {t.device} but the primary inner tensor "
                f"{spec.primary!r} is on {primary.device}. All inner tensors must share one "
                f"device: move it with .to({str(primary.device)!r})."
            )

    meta_values = []
    ok = kit.checked_meta
    for f, default in zip(spec.meta, spec.meta_defaults):
        v = values.get(f.name, MISSING)
        if v is MISSING:
            if default is MISSING:
                raise ConstructionError(
                    f"{qual} is missing its meta field {f.name!r} (it has no default); pass "
                    f"{f.name}=... ."
                )
            v = default
        else:
            # Validated values are remembered per class: pickling on every construction
            # would cost more than the construction itself.
            key = (f.name, type(v), v)
            try:
                seen = not isinstance(v, torch.Tensor) and key in ok
            except TypeError:  # unhashable: check_meta_value explains
                seen = False
            if not seen:
                check_meta_value(qual, f.name, v, where="the value passed")
                check_meta_type(qual, f, v, where="the value passed")
                ok.add(key)
        meta_values.append(v)

    if size is None:
        size = primary.shape
        if stride is None:
            stride = primary.stride()
        else:
            _check_stride(qual, stride, size, primary)
        offset = primary.storage_offset()
    else:
        size = _check_size(qual, size)
        size = torch.Size(size) if all(isinstance(s, int) for s in size) else tuple(size)
        if stride is None:
            stride = contiguous_strides(size)
        else:
            _check_stride(qual, stride, size, primary)
        offset = 0
    dtype = primary.dtype if dtype is None else _check_dtype_arg(qual, dtype)
    device = primary.device if device is None else _check_device_arg(qual, device, primary)
    requires_grad = primary.requires_grad if requires_grad is None else bool(requires_grad)

    present = tuple(f.name for f, t in zip(spec.inner, inners) if t is not None)
    ctx = SubclassCtx.make(qual, spec.meta_names, tuple(meta_values), dtype, present)
    _check_inner_shapes(cls, spec, inners, size, ctx)
    return kit.make(tuple(inners), ctx, size, tuple(stride), offset, requires_grad,
                    device=None if device == primary.device else device)


def _check_dtype(qual: str, f: InnerField, t: torch.Tensor) -> None:
    if f.dtype is None:
        return
    allowed = f.dtype if isinstance(f.dtype, tuple) else (f.dtype,)
    if t.dtype not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ConstructionError(
            f"{qual}.{f.name} must have dtype {want} but got {t.dtype}; convert it with "
            f".to({allowed[0]})."
        )


# ---- the outer tensor's arguments (size=, stride=, dtype=, device=) ------------------------
# Checked here so a mistake names the class and the argument instead of surfacing as a raw
# _make_wrapper_subclass error, or (for a stride that does not fit) not at all.


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_tuple(v):
    """``v`` as a tuple of ints / SymInts, or None when it is not one."""
    try:
        t = tuple(v)
    except TypeError:
        return None
    return t if all(_is_int(x) or isinstance(x, _compat.SymInt) for x in t) else None


def _check_size(qual: str, size):
    dims = _int_tuple(size)
    if dims is None:
        raise OuterArgumentError(
            f"{qual}: size= must be a sequence of ints (the outer shape) but got {size!r}. "
            "Pass e.g. size=(rows, cols)."
        )
    if any(_is_int(d) and d < 0 for d in dims):
        raise OuterArgumentError(f"{qual}: size= {dims} has a negative dimension; sizes are >= 0.")
    return dims


def _check_stride(qual: str, stride, size, primary) -> None:
    """An explicit ``stride=`` must be a layout of ``size`` that no two elements share.

    Rules (docs/authoring.md, "Mistakes caught for you"): one int >= 0 per dim, and
    non-overlapping (sorted by stride, each dim of size > 1 starts past the extent of the
    smaller ones); gaps are allowed (a wrapper over a slice). When the primary inner
    tensor has the outer shape, it backs the outer layout, so the strides must also be
    the primary's (on dims of size > 1): the kit derives views from the inner tensors, and
    an outer stride that disagrees would make them describe different elements. Symbolic
    strides (dynamo re-creating a wrapper) are only checked for their count.
    """
    st = _int_tuple(stride)
    if st is None:
        raise OuterArgumentError(
            f"{qual}: stride= must be a sequence of ints, one per dimension of the outer size "
            f"{_fmt_shape(tuple(size))}, but got {stride!r}."
        )
    if len(st) != len(size):
        raise OuterArgumentError(
            f"{qual}: stride= {_fmt_shape(st)} has {len(st)} entries but the outer size "
            f"{_fmt_shape(tuple(size))} has {len(size)} dimensions. Pass one stride per "
            f"dimension, e.g. stride={_fmt_shape(contiguous_strides(size))} (row-major), or "
            "leave stride= out."
        )
    if not all(_is_int(s) for s in st) or not all(_is_int(d) for d in size):
        return
    if 0 in size:
        return  # no elements, nothing can overlap
    if any(s < 0 for s in st):
        raise OuterArgumentError(
            f"{qual}: stride= {_fmt_shape(st)} has a negative stride; torch tensors have "
            f"strides >= 0. Use e.g. stride={_fmt_shape(contiguous_strides(size))}."
        )
    extent = 1  # elements spanned by the dims placed so far
    for s, d in sorted((s, d) for s, d in zip(st, size) if d > 1):
        if s < extent:
            raise OuterArgumentError(
                f"{qual}: stride= {_fmt_shape(st)} overlaps for the outer size "
                f"{_fmt_shape(tuple(size))}: two elements would share one storage offset. "
                f"Pass a non-overlapping layout, e.g. stride={_fmt_shape(contiguous_strides(size))} "
                "(row-major), or leave stride= out."
            )
        extent = s * (d - 1) + extent
    if all(_is_int(d) for d in primary.shape) and tuple(primary.shape) == tuple(size):
        pst = primary.stride()
        if any(a != b for a, b, d in zip(st, pst, size) if d > 1):
            raise OuterArgumentError(
                f"{qual}: stride= {_fmt_shape(st)} differs from the strides "
                f"{_fmt_shape(pst)} of the primary inner tensor, which has the outer size "
                f"{_fmt_shape(tuple(size))} and so backs the outer layout. Leave stride= out "
                "(the primary's layout is used), or lay the primary out that way first: "
                "torch.empty_strided(size, stride, dtype=...).copy_(primary)."
            )


def _check_dtype_arg(qual: str, dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    hint = ""
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        hint = f" Pass dtype=torch.{dtype.removeprefix('torch.')}."
    raise OuterArgumentError(
        f"{qual}: dtype= must be a torch.dtype (e.g. torch.float32) but got {dtype!r} "
        f"(a {type(dtype).__name__}).{hint or ' Pass a torch.dtype.'}"
    )


def _check_device_arg(qual: str, device, primary):
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OuterArgumentError(
            f"{qual}: device= must be a torch.device or a device string such as 'cpu' but got "
            f"{device!r} ({e}). Leave it out to use the primary inner tensor's device "
            f"({primary.device})."
        ) from None
    return dev
