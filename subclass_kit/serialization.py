"""``torch.load(..., weights_only=True)`` for WrapperTensor subclasses.

The weights-only unpickler refuses every global it was not told about. A kit subclass
pickles as ``rebuild(cls, inner_tensors, ctx, size, stride, requires_grad)``, so loading it
needs exactly: the class, ``rebuild``, and the ctx type with its rebuild function.
``allow`` adds those and nothing else — plus the types a class lists in its
``__safe_globals__`` class attribute (the types of its meta values, e.g. placements).
"""

from __future__ import annotations

from typing import Any

from . import _compat
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
            raise TypeError(
                f"serialization.allow() takes WrapperTensor subclasses; got {c!r}. For other "
                "globals use torch.serialization.add_safe_globals directly."
            )
    extra = []
    for c in classes:
        for g in getattr(c, "__safe_globals__", ()):
            if g not in extra:
                extra.append(g)
    return [*classes, rebuild, SubclassCtx, _rebuild_ctx, *extra]


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
