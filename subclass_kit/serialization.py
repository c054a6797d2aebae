"""``torch.load(..., weights_only=True)`` for WrapperTensor subclasses.

The weights-only unpickler refuses every global it was not told about. A kit subclass
pickles as ``rebuild(cls, inner_tensors, ctx, size, stride, requires_grad)``, so loading it
needs exactly: the class, ``rebuild``, and the ctx type with its rebuild function.
``allow`` adds those and nothing else — plus the types a class lists in its
``__safe_globals__`` class attribute (the types of its meta values, e.g. placements).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from . import _compat
from .errors import UnsafeGlobalError
from .ctx import SubclassCtx, _rebuild_ctx
from ._flatten import rebuild

__all__ = ["allow", "required_globals"]


def required_globals(*classes: type) -> list[Any]:
    """The globals ``torch.load(weights_only=True)`` needs for these classes.

    Example:
        >>> from subclass_kit.examples import TwoTensor
        >>> [getattr(g, "__name__", g) for g in required_globals(TwoTensor)]
        ['TwoTensor', 'rebuild', 'SubclassCtx', '_rebuild_ctx']
    """
    from .base import WrapperTensor

    for c in classes:
        if not (isinstance(c, type) and issubclass(c, WrapperTensor)):
            raise UnsafeGlobalError(
                f"serialization.allow() takes WrapperTensor subclasses; got {c!r}. For other "
                "globals use torch.serialization.add_safe_globals directly."
            )
    extra = []
    for c in classes:
        listed = getattr(c, "__safe_globals__", ())
        if isinstance(listed, (str, bytes)) or not hasattr(listed, "__iter__"):
            raise UnsafeGlobalError(
                f"{c.__qualname__}.__safe_globals__ must be a tuple of classes, got {listed!r}."
            )
        for g in listed:
            _check_safe_global(c, g)
            if g not in extra:
                extra.append(g)
    return [*classes, rebuild, SubclassCtx, _rebuild_ctx, *extra]


def _vouched(g: Any) -> bool:
    """Data types whose loading runs none of their own code: the unpickler makes them with
    ``cls.__new__`` (or ``cls(value)`` for an enum) and sets plain attributes."""
    from .base import WrapperTensor

    if not isinstance(g, type):
        return False
    if issubclass(g, WrapperTensor):
        return True
    if issubclass(g, enum.Enum):
        return True
    if dataclasses.is_dataclass(g):
        return True
    return issubclass(g, tuple) and hasattr(g, "_fields")  # a NamedTuple


def _check_safe_global(owner: type, g: Any) -> None:
    # allow() validates what a class lists as it validates its own arguments: a class body
    # is code anyone can write, and an allow-listed function is callable by any checkpoint.
    if _vouched(g):
        return
    what = (
        f"the {type(g).__name__} {getattr(g, '__module__', '?')}.{getattr(g, '__qualname__', g)!s}"
        if callable(g) else f"{g!r} (a {type(g).__name__})"
    )
    raise UnsafeGlobalError(
        f"{owner.__qualname__}.__safe_globals__ lists {what}, which serialization.allow "
        "cannot vouch for: a checkpoint could call it while loading. It allows only the types "
        "of meta values that load as data: enums, dataclasses, named tuples and WrapperTensor "
        "subclasses. Remove it from __safe_globals__; if you trust it, add it yourself with "
        "torch.serialization.add_safe_globals."
    )


def allow(*classes: type) -> None:
    """Let ``torch.load(..., weights_only=True)`` load these WrapperTensor subclasses.

    Meta values of other types (enums, dataclasses) are allowed too when the class lists
    them in ``__safe_globals__``; otherwise the caller adds them with
    ``torch.serialization.add_safe_globals``.

    Example:
        >>> import io, torch
        >>> from subclass_kit import serialization
        >>> from subclass_kit.examples import TwoTensor
        >>> serialization.allow(TwoTensor)
        >>> buf = io.BytesIO(); torch.save(TwoTensor(torch.ones(2), torch.zeros(2)), buf); _ = buf.seek(0)
        >>> type(torch.load(buf, weights_only=True)).__name__
        'TwoTensor'
    """
    _compat.add_safe_globals(required_globals(*classes))
