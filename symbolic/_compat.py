"""Every torch-private name ``symbolic`` touches, in one place.

When torch moves one of these, this is the only file to change. Nothing here decides
policy; it only reaches into torch.
"""

from __future__ import annotations

import copy
from typing import Any

import sympy
import torch
from torch._dynamo import forbid_in_graph as forbid_in_graph
from torch._dynamo import mark_dynamic as _torch_mark_dynamic
from torch._dynamo import mark_static as _torch_mark_static
from torch._dynamo import maybe_mark_dynamic as _torch_maybe_mark_dynamic
from torch._dynamo.source import AttrSource as TorchAttrSource
from torch._dynamo.source import GetItemSource as TorchGetItemSource
from torch._dynamo.source import LocalSource as TorchLocalSource
from torch._dynamo.source import TensorProperty as TorchTensorProperty
from torch._dynamo.source import TensorPropertySource as TorchTensorPropertySource
from torch._guards import Source as TorchSource
from torch.utils._python_dispatch import is_traceable_wrapper_subclass as _is_traceable

from .dims import DimKind

__all__ = [
    "TorchSource",
    "TorchLocalSource",
    "TorchAttrSource",
    "TorchGetItemSource",
    "TorchTensorProperty",
    "TorchTensorPropertySource",
    "forbid_in_graph",
    "is_traceable_wrapper_subclass",
    "torch_mark",
    "mark_self",
    "read_marks",
    "mark_attrs",
    "MARK_ATTRS",
    "ATTR_OF_KIND",
    "bound",
    "torch_rule",
    "install_mirror_hook",
]

# Attributes torch's marking functions leave on a tensor (torch/_dynamo/decorators.py), in
# the order dynamo's marking guard lists them ("[Note: Dimension Marking Guards]" in
# torch/_dynamo/guards.py). `mark_self` copies whatever torch sets, so it needs no list.
_DYNAMIC = "_dynamo_dynamic_indices"
_DYNAMIC_RANGE = "_dynamo_dynamic_range"
_WEAK = "_dynamo_weak_dynamic_indices"
_STATIC = "_dynamo_static_indices"
_UNBACKED = ("_dynamo_unbacked_indices", "_dynamo_strict_unbacked_indices")
MARK_ATTRS = (_DYNAMIC, _WEAK, *_UNBACKED, _STATIC)
# Read like maybe_mark_dynamic but not guarded (NestedTensor's ragged dims, AOTAutograd's
# propagated dynamism).
_PROPAGATED = "_dynamo_propagated_dynamic_indices"
_EXTRA_MARK_ATTRS = ("_specialize_on", "_has_dynamo_dim_marking")

_TORCH_FN = {
    DimKind.DYNAMIC: _torch_mark_dynamic,
    DimKind.STATIC: _torch_mark_static,
    DimKind.AUTO: _torch_maybe_mark_dynamic,
}


def is_traceable_wrapper_subclass(t: Any) -> bool:
    """True for a tensor whose class implements ``__tensor_flatten__``/``__tensor_unflatten__``."""
    return _is_traceable(t)


def torch_mark(t: torch.Tensor, kind: DimKind, dims: Any, *, min: int | None = None, max: int | None = None) -> None:
    """Call torch's own marking function for ``kind`` (``dynamic``/``static``/``auto``).

    On a wrapper subclass torch mirrors the mark onto every inner tensor of the same
    dimensionality; that is torch's behaviour and what ``inner="same_dim"`` asks for.
    """
    fn = _TORCH_FN[kind]
    if kind is DimKind.DYNAMIC:
        fn(t, dims, min=min, max=max)
    else:
        fn(t, dims)


# ---- torch's own marking functions on a class that declares __inner_shapes__ --------------
# torch._dynamo.mark_dynamic / maybe_mark_dynamic / mark_static on a wrapper subclass first
# call ``_apply_func_to_inner_tensors_of_same_dim`` (torch/_dynamo/decorators.py), which
# mirrors the mark onto every inner tensor of the outer's rank, range included, and skips
# the others. For a class that says how its inner shapes follow from the outer one, that
# rule is wrong (a (3, 1) scale gets the rows' range; a flat NF4 payload gets nothing), so
# the mirror is routed through a hook that derives the inner marks instead. Classes without
# ``__inner_shapes__`` keep torch's rule, and ``torch_rule()`` restores it on demand (what
# ``inner="same_dim"`` asks for).
import contextlib as _contextlib
import functools
import torch._dynamo.decorators as _decorators

_TORCH_MIRROR = _decorators._apply_func_to_inner_tensors_of_same_dim
_KIND_OF_FN = {fn: kind for kind, fn in _TORCH_FN.items()}
_torch_rule_depth = 0


@_contextlib.contextmanager
def torch_rule():
    """Within this block torch's marking functions mirror marks by torch's own rule."""
    global _torch_rule_depth
    _torch_rule_depth += 1
    try:
        yield
    finally:
        _torch_rule_depth -= 1


def install_mirror_hook(hook) -> None:
    """Route torch's same-dim mirroring through ``hook(kind, t, index, min, max) -> bool``
    (True: handled; False: torch's rule runs)."""

    def mirror(func, t, *args, **kwargs):
        kind = _KIND_OF_FN.get(func)
        if kind is not None and not _torch_rule_depth and args:
            if hook(kind, t, args[0], kwargs.get("min"), kwargs.get("max")):
                return None
        return _TORCH_MIRROR(func, t, *args, **kwargs)

    functools.update_wrapper(mirror, _TORCH_MIRROR)
    _decorators._apply_func_to_inner_tensors_of_same_dim = mirror


def _own_marks(t: torch.Tensor) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(t).items()
        if k.startswith("_dynamo_") or k in _EXTRA_MARK_ATTRS
    }


def mark_self(t: torch.Tensor, kind: DimKind, dim: int, *, min: int | None = None, max: int | None = None) -> None:
    """Mark one dim of ``t`` itself, exactly as torch would, without touching its inners.

    torch's ``mark_dynamic`` on a wrapper subclass also marks every same-dim inner tensor,
    with no way to opt out. We run torch's function on a meta stand-in of the same shape
    that carries ``t``'s existing marks, then copy the resulting attributes back: ``t`` ends
    up with precisely the attributes torch itself sets, whatever their names in this torch
    version, and its inner tensors are left alone.
    """
    if not _is_traceable(t):
        torch_mark(t, kind, dim, min=min, max=max)
        return
    # Only the rank matters to torch's marking; zero sizes also cover jagged (nested-int) dims.
    stand_in = torch.empty((0,) * t.dim(), device="meta")
    for k, v in _own_marks(t).items():
        setattr(stand_in, k, copy.copy(v))
    torch_mark(stand_in, kind, dim, min=min, max=max)
    for k, v in _own_marks(stand_in).items():
        setattr(t, k, v)


def read_marks(t: torch.Tensor, *, propagated: bool = True) -> dict[int, tuple[DimKind, int | None, int | None]]:
    """The marks ``t`` itself carries: ``{dim: (kind, min, max)}``.

    ``kind`` is ``static``, ``auto``, ``dynamic`` or ``unbacked``. Precedence is dynamo's
    (``_automatic_dynamic`` in ``variables/builder.py``): unbacked over dynamic over weak
    (auto) over static over propagated (read as auto; ``propagated=False`` skips those,
    which no marking function of the user's set).
    """
    d = getattr(t, "__dict__", None)
    if not d:
        return {}
    out: dict[int, tuple[DimKind, int | None, int | None]] = {}
    for i in d.get(_PROPAGATED, ()) if propagated else ():
        out[i] = (DimKind.AUTO, None, None)
    for i in d.get(_STATIC, ()):
        out[i] = (DimKind.STATIC, None, None)
    for i in d.get(_WEAK, ()):
        out[i] = (DimKind.AUTO, None, None)
    ranges = {r.dim: r for r in d.get(_DYNAMIC_RANGE, ())}
    for i in d.get(_DYNAMIC, ()):
        r = ranges.get(i)
        out[i] = (DimKind.DYNAMIC, getattr(r, "min", None), getattr(r, "max", None))
    for a in _UNBACKED:
        for i in d.get(a, ()):
            out[i] = (DimKind.UNBACKED, None, None)
    return out


def mark_attrs(t: torch.Tensor) -> dict[str, frozenset]:
    """``{attribute: dims}`` for each of ``MARK_ATTRS`` that ``t`` carries (dynamo guards these)."""
    d = getattr(t, "__dict__", None)
    if not d:
        return {}
    return {a: frozenset(d[a]) for a in MARK_ATTRS if a in d}


# Which attribute torch's marking function for each kind sets (what `apply` leaves).
ATTR_OF_KIND = {DimKind.DYNAMIC: _DYNAMIC, DimKind.AUTO: _WEAK, DimKind.STATIC: _STATIC}


def bound(expr: sympy.Expr, ranges: dict[sympy.Symbol, tuple[int | None, int | None]]):
    """Sound integer bounds ``(lo, hi)`` of ``expr`` given symbol ranges (None = unbounded)."""
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    vr = {
        s: ValueRanges(sympy.Integer(lo) if lo is not None else sympy.Integer(0),
                       sympy.Integer(hi) if hi is not None else sympy.oo)
        for s, (lo, hi) in ranges.items()
    }
    out = bound_sympy(expr, vr)
    lo = _finite_int(out.lower, ceil=True)
    hi = _finite_int(out.upper, ceil=False)
    return lo, hi


def _finite_int(v, *, ceil: bool):
    # Infinite bounds come back as sympy.oo or torch's own int_oo; only rationals are finite.
    if not isinstance(v, sympy.Rational):
        return None
    return int(sympy.ceiling(v) if ceil else sympy.floor(v))


def is_njt_class(cls: type) -> bool:
    """True for torch's jagged-layout NestedTensor class."""
    from torch.nested._internal.nested_tensor import NestedTensor

    return isinstance(cls, type) and issubclass(cls, NestedTensor)


def is_dtensor(t: Any) -> bool:
    """True for torch's DTensor (dynamo compares its spec with shapes skipped)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch built without distributed
        return False
    return isinstance(t, DTensor)
