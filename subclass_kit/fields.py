"""Field specifiers: ``inner()`` for tensors held inside, ``meta()`` for constant metadata,
``state()`` for per-instance state that is neither (see the extension surface in ``base.py``).

The kind of a field comes from these specifier objects, never from the annotation (which
may be a string under ``from __future__ import annotations``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["inner", "meta", "state", "InnerField", "MetaField", "StateField", "MISSING"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self):
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class InnerField:
    """Spec of an inner tensor field (see :func:`inner`)."""

    optional: bool = False
    dtype: Any = None  # None, a torch.dtype, or a tuple of allowed dtypes
    doc: str = ""
    name: str = ""  # filled in by the class spec


@dataclass(frozen=True)
class MetaField:
    """Spec of a constant metadata field (see :func:`meta`)."""

    default: Any = MISSING
    doc: str = ""
    name: str = ""
    # Filled in by the class spec, for the construction-time type check (spec.meta_type_test):
    # the annotation as written (maybe a string) and the module it is resolved in.
    annotation: Any = field(default=None, compare=False, repr=False)
    home: str = field(default="", compare=False, repr=False)
    # ``check(value) -> None | str``: None when valid, else the rule in words.
    check: Any = field(default=None, compare=False, repr=False)


def inner(*, optional: bool = False, dtype: Any = None, doc: str = "") -> Any:
    """Declare a tensor held inside the wrapper.

    Args:
        optional: the field may be ``None`` (then it is absent from ``__tensor_flatten__``).
        dtype: a ``torch.dtype`` or tuple of dtypes the tensor must have; checked at construction.
        doc: a short description, shown in ``repr(cls.__kit_spec__)``.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner
        >>> class Pair(WrapperTensor):
        ...     a: torch.Tensor = inner()
        ...     b: torch.Tensor = inner(optional=True)
    """
    return InnerField(optional=optional, dtype=dtype, doc=doc)


def meta(*, default: Any = MISSING, doc: str = "", check: Any = None) -> Any:
    """Declare constant metadata: hashable, picklable, tensor-free, guarded by ``==``.

    Args:
        default: the value when none is passed (checked at class definition).
        doc: a short description.
        check: ``check(value) -> None | str``: None for a valid value, else the rule it
            breaks in words ("a positive int"). Applied wherever a value enters: the
            default, construction, and ``torch.load`` (``MetaValueError``).

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, meta
        >>> class Blocked(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     block: int = meta(default=32, check=lambda v: None if v > 0 else "a positive int")
        >>> try:
        ...     Blocked(torch.ones(2), block=0)
        ... except ValueError as e:
        ...     print(type(e).__name__)
        MetaValueError
    """
    if check is not None and not callable(check):
        raise TypeError(f"meta(check=...) takes a callable value -> None | str, got {check!r}.")
    return MetaField(default=default, doc=doc, check=check)


@dataclass(frozen=True)
class StateField:
    """Spec of a per-instance state attribute (see :func:`state`)."""

    default: Any = None
    doc: str = ""
    name: str = ""


def state(*, default: Any = None, doc: str = "", init: bool = False) -> Any:
    """Declare per-instance state: an attribute that is not part of the ctx.

    Unlike ``inner()`` and ``meta()`` fields it is no constructor argument, is not flattened,
    guarded, hashed or pickled, and may be set after construction by the class's own code
    (``self._name = value``) or passed to the trusted ``Cls.from_parts(..., _name=value)``.
    Views and aliases the kit builds share their base's state; any other instance (a
    rebuild, an op's new result, an unpickled copy) starts from ``default``. Names may start
    with ``_`` (state is usually private to the class).

    Args:
        default: the value an instance reads until one is set (shared: use an immutable one).
        doc: a short description.
        init: always False (for type checkers: the field is not a constructor argument).

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, state
        >>> class Tracked(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     _uses: int = state(default=0)
        >>> t = Tracked(torch.ones(2))
        >>> t._uses, t.__tensor_flatten__()[0]
        (0, ['payload'])
        >>> t._uses = 3; t._uses, t.detach()._uses
        (3, 3)
    """
    if init:
        raise TypeError("state() fields are never constructor arguments; drop init=True.")
    return StateField(default=default, doc=doc)

