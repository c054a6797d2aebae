"""Field specifiers: ``inner()`` for tensors held inside, ``meta()`` for constant metadata.

The kind of a field comes from these specifier objects, never from the annotation (which
may be a string under ``from __future__ import annotations``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["inner", "meta", "InnerField", "MetaField", "MISSING"]


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


def meta(*, default: Any = MISSING, doc: str = "") -> Any:
    """Declare constant metadata: hashable, picklable, tensor-free, guarded by ``==``.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, meta
        >>> class Blocked(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     block: int = meta(default=32)
    """
    return MetaField(default=default, doc=doc)
