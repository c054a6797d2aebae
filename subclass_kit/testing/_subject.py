"""What is being checked: the class, its samples, and small readers for any wrapped tensor.

``check_subclass`` accepts an instance, a list of instances, a zero-argument factory, or a
class whose ``__samples__()`` classmethod returns instances. Everything here reads a
wrapped tensor through torch's protocol only (``__tensor_flatten__``), so it serves
torch's TwoTensor and DTensor as well as the kit's classes; the kit's extras
(``to_plain``, ``__inner_shapes__``) are duck-typed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from symbolic import FREE

from .. import _compat
from .._construct import contiguous_strides
from .errors import SamplesError

__all__ = ["Subject", "resolve", "describe", "flatten", "inner_values", "dense", "has_to_plain", "resized"]


@dataclass
class Subject:
    """One class under check and its sample instances."""

    cls: type
    samples: list

    @property
    def name(self) -> str:
        return self.cls.__qualname__

    @property
    def is_kit(self) -> bool:
        return hasattr(self.cls, "__kit_spec__")

    @property
    def has_to_plain(self) -> bool:
        return has_to_plain(self.cls)


def has_to_plain(cls) -> bool:
    return callable(getattr(cls, "to_plain", None))


def _materialize(samples):
    if isinstance(samples, torch.Tensor):
        return [samples]
    if isinstance(samples, type):
        make = getattr(samples, "__samples__", None)
        if make is None:
            raise SamplesError(
                f"{samples.__qualname__} has no __samples__() classmethod, so check_subclass "
                "cannot make instances of it. Pass instances, a list of them or a zero-argument "
                f"factory, or add `@classmethod def __samples__(cls): return [...]` to "
                f"{samples.__qualname__}."
            )
        return _materialize(make())
    if isinstance(samples, (list, tuple)):
        out = []
        for s in samples:
            out.extend(_materialize(s))
        return out
    if callable(samples):
        return _materialize(samples())
    raise SamplesError(
        f"check_subclass takes wrapped-tensor instances, a list of them, a zero-argument "
        f"factory, or a class with __samples__(); got {type(samples).__name__}."
    )


def resolve(samples) -> list:
    """Turn ``samples`` into one :class:`Subject` per class, in first-seen order.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> [s.name for s in resolve(lambda: [TwoTensor(torch.ones(2), torch.ones(2))])]
        ['TwoTensor']
    """
    items = _materialize(samples)
    if not items:
        raise SamplesError("check_subclass got no samples (an empty list or factory result).")
    subjects: dict = {}
    for i, s in enumerate(items):
        if type(s) is torch.Tensor or not isinstance(s, torch.Tensor):
            raise SamplesError(
                f"sample {i} is a {type(s).__name__}, not a tensor subclass instance; "
                "check_subclass checks wrapper subclasses such as DTensor or a WrapperTensor."
            )
        subjects.setdefault(type(s), Subject(type(s), [])).samples.append(s)
    return list(subjects.values())


def flatten(t):
    """``(names, ctx)`` from ``__tensor_flatten__``."""
    names, ctx = t.__tensor_flatten__()
    return list(names), ctx


def inner_values(t) -> dict:
    """``{name: getattr(t, name)}`` for the names ``__tensor_flatten__`` lists."""
    names, _ = flatten(t)
    return {n: getattr(t, n) for n in names}


def dense(t):
    """``t.to_plain()`` for a wrapped tensor that has it; other values unchanged."""
    if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and has_to_plain(type(t)):
        return t.to_plain()
    return t


def describe(t) -> str:
    """A short description of a sample: ``TwoTensor(4, 6) float32``, plus the ctx.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> describe(TwoTensor(torch.ones(4, 6), torch.ones(4, 6)))
        'TwoTensor(4, 6) float32'
    """
    shape = ", ".join(str(s) for s in t.shape)
    out = f"{type(t).__name__}({shape}) {str(t.dtype).replace('torch.', '')}"
    try:
        _, ctx = flatten(t)
    except Exception:
        return out
    if ctx is None:
        return out
    fields = getattr(ctx, "fields", None)
    if isinstance(fields, tuple):
        if fields:
            out += " " + " ".join(f"{k}={v!r}" for k, v in fields)
        return out
    text = repr(ctx)
    return out + " ctx=" + (text if len(text) <= 60 else text[:57] + "...")


def _cycle(t: torch.Tensor, dim: int, new: int) -> torch.Tensor:
    """``t`` grown or shrunk to ``new`` along ``dim`` by cycling its own slices (any dtype)."""
    old = t.size(dim)
    if old == new:
        return t.clone()
    idx = torch.arange(new, device=t.device) % max(old, 1)
    return t.index_select(dim, idx).contiguous()


def inner_shapes_for(t, new_size) -> dict | None:
    """Inner shapes for a new outer size: the class's ``__inner_shapes__`` when it has one,
    else the "same dim" reading (an inner tensor with the outer shape follows it, one whose
    first size matches the outer first size follows in dim 0, the rest keep their shape)."""
    names, ctx = flatten(t)
    fn = getattr(type(t), "__inner_shapes__", None)
    if fn is not None:
        shapes = fn(tuple(new_size), ctx)
        # A FREE dim keeps this instance's size (the sweep varies the outer size only).
        return {n: tuple(int(getattr(t, n).size(j)) if s is FREE else int(s) for j, s in enumerate(shapes[n]))
                for n in names if n in shapes}
    out = {}
    outer = tuple(t.shape)
    for n in names:
        v = getattr(t, n)
        if not isinstance(v, torch.Tensor):
            continue
        shape = tuple(v.shape)
        if shape == outer:
            out[n] = tuple(new_size)
        elif v.dim() == len(outer) and v.dim() > 0 and shape[0] == outer[0]:
            out[n] = (new_size[0],) + shape[1:]
        else:
            out[n] = shape
    return out


def resized(t, new_size):
    """A new instance like ``t`` but with outer size ``new_size`` (values cycled from ``t``)."""
    names, ctx = flatten(t)
    shapes = inner_shapes_for(t, new_size)
    inner = {}
    for n in names:
        v = getattr(t, n)
        if not isinstance(v, torch.Tensor):
            inner[n] = v
            continue
        want = shapes.get(n, tuple(v.shape))
        if _compat.is_traceable_wrapper_subclass(v):
            inner[n] = resized(v, want)
            continue
        out = v
        for d, (have, w) in enumerate(zip(v.shape, want)):
            if have != w:
                out = _cycle(out, d, w)
        if out is v:
            out = v.clone()
        inner[n] = out
    return type(t).__tensor_unflatten__(inner, ctx, torch.Size(new_size), contiguous_strides(new_size))
