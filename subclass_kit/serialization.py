"""``torch.load(..., weights_only=True)`` for WrapperTensor subclasses.

The weights-only unpickler refuses every global it was not told about. A kit subclass
pickles as ``rebuild(cls, inner_tensors, ctx, size, stride, requires_grad)``, so loading it
needs exactly: the class, ``rebuild``, and the ctx type with its rebuild function.
``allow`` adds those and nothing else.
"""

from __future__ import annotations

from . import _compat
from .ctx import SubclassCtx, _rebuild_ctx
from .flatten import rebuild

__all__ = ["allow", "required_globals"]


def required_globals(*classes) -> list:
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
    return [*classes, rebuild, SubclassCtx, _rebuild_ctx]


def allow(*classes) -> None:
    """Let ``torch.load(..., weights_only=True)`` load these WrapperTensor subclasses.

    Meta values of other types (enums, dataclasses) must be allowed by the caller with
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
