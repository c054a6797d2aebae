"""Building wrapper instances: the validated public path and the trusted fast path.

User construction (``BlockScaled(q, s, block=32)``) binds and checks every argument, so a
mistake is reported where it is made. Dispatch outputs and ``__tensor_unflatten__`` come
from parts torch or the kit already produced and take ``from_parts``, which only calls
``_make_wrapper_subclass`` and fills the instance dict: it is on the hot path of every op.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .ctx import SubclassCtx
from .errors import ConstructionError, InnerShapeError
from .fields import MISSING, InnerField
from .spec import check_meta_value

__all__ = ["from_parts", "construct", "contiguous_strides"]

_STRIDED = torch.strided


def from_parts(cls, inners, ctx, size, stride, offset, dtype, device, requires_grad=False):
    """Trusted construction: no validation. ``inners`` is in declaration order (None = absent).

    Every construction must pass here while a torch-function mode is on: that is where
    export's pre-dispatch tracing records it. A fast path that inlines this (one per op,
    e.g. ``sharded.tensor.wrap``) may do so only when ``torch_function_mode_enabled()`` is
    false."""
    if requires_grad or type(offset) is not int or offset != 0:
        r = _compat.make_wrapper_subclass(
            cls,
            size,
            strides=stride,
            storage_offset=offset,
            dtype=dtype,
            device=device,
            layout=_STRIDED,
            requires_grad=requires_grad,
        )
    else:
        # The common case passes only what differs from the defaults: keyword parsing in
        # _make_wrapper_subclass is a measurable part of every op's cost.
        r = _compat.make_wrapper_subclass(cls, size, strides=stride, dtype=dtype, device=device)
    d = r.__dict__
    d.update(zip(cls._kit_inner_names, inners))
    d["_kit_ctx"] = ctx
    if _compat.torch_function_mode_enabled():
        # User-level code under a torch-function mode, perhaps export's pre-dispatch
        # tracing, which must see this construction (see pre_dispatch.py).
        from .pre_dispatch import maybe_record

        maybe_record(r, inners, size, stride, offset)
    return r


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
    for k, v in kwargs.items():
        if k not in cls._kit_field_index:
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
    ok = cls._kit_checked_meta
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
                ok.add(key)
        meta_values.append(v)

    if size is None:
        size = primary.shape
        if stride is None:
            stride = primary.stride()
        offset = primary.storage_offset()
    else:
        size = torch.Size(size) if all(isinstance(s, int) for s in size) else tuple(size)
        if stride is None:
            stride = contiguous_strides(size)
        offset = 0
    dtype = primary.dtype if dtype is None else dtype
    device = primary.device if device is None else torch.device(device)
    requires_grad = primary.requires_grad if requires_grad is None else bool(requires_grad)

    present = tuple(f.name for f, t in zip(spec.inner, inners) if t is not None)
    ctx = SubclassCtx.make(qual, spec.meta_names, tuple(meta_values), dtype, present)
    _check_inner_shapes(cls, spec, inners, size, ctx)
    return from_parts(cls, tuple(inners), ctx, size, tuple(stride), offset, dtype, device, requires_grad)


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
