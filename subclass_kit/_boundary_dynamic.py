"""The compile boundary on calls with dims marked dynamic: one body for every size.

A body compiled for static shapes holds each wrapper's outer size and stride as literals.
When an argument has dims marked dynamic (``symbolic.mark_dynamic``, torch's
``mark_dynamic``/``maybe_mark_dynamic``: the marks sit on the wrapper and its inner
tensors), the body instead reads each wrapper's outer size and stride from a *carrier*: a
meta tensor of the wrapper's size and stride carrying the wrapper's marks, passed after the
inner tensors. Dynamo then gives the outer dims symbols as it does a plain input's, and its
own guard tree (run by the direct path or by dynamo) checks every size, shape-env guards
included; the boundary's key keeps class, ctx, dtype, device and rank only, so a batch of
other sizes reaches the same body. A size outside dynamo's guards goes through dynamo,
which recompiles or specializes as it does for any function.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .base import WrapperTensor

__all__ = ["Carried", "carried_recipes", "carrier", "marked"]

_empty_strided = torch.empty_strided
_META = torch.device("meta")
_U8 = torch.uint8  # the carrier's dtype: its sizes are all the body reads
_no_tf = _compat.DisableTorchFunctionSubclass
#: the attributes torch's marking functions set on a tensor, read by dynamo when it traces
_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_unbacked_indices",
          "_dynamo_dynamic_range", "_dynamo_hint_overrides", "_dynamo_static_indices")


class Carried:
    """A wrapper's outer size and stride in a body's recipe: read from ``flat[i]``, a carrier."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __eq__(self, other: object) -> bool:
        return type(other) is Carried and other.i == self.i

    def __hash__(self) -> int:
        return hash(("Carried", self.i))


def marked(checked: list) -> bool:
    """True when any of ``checked`` (a call's tensors) has dims marked dynamic."""
    return any(_compat.has_dynamic_marks(t) for t in checked)


def carried_recipes(recipes: Any, first: int) -> tuple[Any, int]:
    """``recipes`` (see ``walk``) with every wrapper's size and stride read from a carrier, the
    carriers numbered from ``first`` in ``walk``'s order (a wrapper before its inner ones);
    returns the new recipes and how many carriers they read."""
    n = [0]

    def visit(r: Any) -> Any:
        if type(r) is not tuple or not r:
            return r
        kind = r[0]
        if kind == "w":
            c = Carried(first + n[0])
            n[0] += 1
            kids = tuple(visit(k) for k in r[2])
            return (*r[:2], kids, *r[3:7], c, c)
        if kind in ("list", "tuple"):
            return (kind, tuple(visit(k) for k in r[1]))
        if kind == "dict":
            return (kind, r[1], tuple(visit(k) for k in r[2]))
        return r

    out = tuple(visit(r) for r in recipes)
    return out, n[0]


def carrier(w: WrapperTensor) -> torch.Tensor:
    """A meta tensor with ``w``'s size, stride and dynamic marks (no storage: ~2 µs)."""
    # The wrapper's own size()/stride() go through its __torch_function__ (3 µs each).
    with _no_tf():
        c = _empty_strided(w.shape, w.stride(), dtype=_U8, device=_META)
    d = w.__dict__
    for a in _MARKS:
        v = d.get(a)
        if v is not None:
            setattr(c, a, v.copy() if hasattr(v, "copy") else v)
    return c
