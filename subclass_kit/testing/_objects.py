"""Object checks: ``copy.deepcopy`` and ``repr`` work, as users (and optimizers, and error
messages) call them on every tensor."""

from __future__ import annotations

import copy

import torch

from .. import _compat
from ._compare import difference
from ._check import Check, Fail
from ._subject import describe, flatten

__all__ = ["plan"]


def plan(run) -> list:
    return [
        Check("copy.deepcopy", _deepcopy, ("protocol.flatten",)),
        Check("repr", _repr, ()),
    ]


def _leaves(t):
    for n in flatten(t)[0]:
        v = getattr(t, n)
        if _compat.is_traceable_wrapper_subclass(v):
            yield from _leaves(v)
        elif isinstance(v, torch.Tensor):
            yield n, v


def _deepcopy(run):
    for i, x in enumerate(run.samples):
        what = f"sample {i} ({describe(x)})"
        try:
            y = copy.deepcopy(x)
        except Exception as e:
            raise Fail(
                f"copy.deepcopy of {what} raised {type(e).__name__}: {str(e).strip()[:160]}",
                "support aten.clone.default on every inner tensor, or define __deepcopy__ that "
                "deep-copies the inner tensors and rebuilds with __tensor_unflatten__",
            ) from None
        d = difference(y, x, "copy")
        if d:
            raise Fail(f"copy.deepcopy of {what} is not equal to it: {d}", "copy every inner tensor and keep the ctx")
        for n, v in _leaves(y):
            if any(_compat.same_storage(v, s) for _, s in _leaves(x)):
                raise Fail(
                    f"copy.deepcopy of {what} shares inner {n!r} with the original; writing to the copy changes it",
                    "deep-copy (clone) each inner tensor",
                )
    return ""


def _repr(run):
    for i, x in enumerate(run.samples):
        try:
            text = repr(x)
        except Exception as e:
            raise Fail(
                f"repr of sample {i} raised {type(e).__name__}: {str(e).strip()[:160]}",
                "define __repr__ from the inner tensors' reprs and the ctx (the default "
                "Tensor.__repr__ dispatches ops the class may not support)",
            ) from None
        if not isinstance(text, str) or not text:
            raise Fail(f"repr of sample {i} returned {text!r}", "return a non-empty string")
    if not hasattr(run.cls, "__tensor_flatten__"):
        return "no meta-device copy to print (the class has no __tensor_flatten__)"
    try:
        repr(_meta_copy(run.first))
    except Exception as e:
        raise Fail(
            f"repr of a meta-device copy of {describe(run.first)} raised {type(e).__name__}: "
            f"{str(e).strip()[:160]} (errors and debuggers print fake and meta tensors)",
            "do not read values in __repr__ when the inner tensors are on the meta device",
        ) from None
    return ""


def _meta_copy(x):
    names, ctx = flatten(x)
    inner = {}
    for n in names:
        v = getattr(x, n)
        inner[n] = v.detach().to("meta") if isinstance(v, torch.Tensor) and not _compat.is_traceable_wrapper_subclass(v) else v
    return type(x).__tensor_unflatten__(inner, ctx, x.shape, x.stride())
