"""``Dim``: the policy for one dimension of one tensor."""

from __future__ import annotations

import operator
from dataclasses import dataclass

from .errors import PolicyError, PolicyTypeError

__all__ = ["Dim"]

_KINDS = ("dynamic", "static", "auto")


def _bound(v, what: str, kind_repr: str):
    if v is None:
        return None
    if isinstance(v, bool):
        raise PolicyTypeError(f"{kind_repr}: {what} must be an int or None, got {v!r}.")
    try:
        v = operator.index(v)
    except TypeError:
        raise PolicyTypeError(
            f"{kind_repr}: {what} must be an int or None, got {v!r} ({type(v).__name__})."
        ) from None
    if v < 0:
        raise PolicyError(f"{kind_repr}: {what}={v} is negative; sizes are >= 0.")
    return v


@dataclass(frozen=True, slots=True)
class Dim:
    """How dynamo should treat one dimension: dynamic, static, or automatic.

    ``Dim.dynamic(min, max)`` is torch's ``mark_dynamic`` (a symbol is required; dynamo
    raises if the code specializes it, and a size outside ``[min, max]`` is an error),
    ``Dim.static()`` is ``mark_static`` (every new size recompiles), ``Dim.auto()`` is
    ``maybe_mark_dynamic`` (a symbol if the code allows it).

    Example:
        >>> Dim.dynamic(min=2, max=512)
        Dim.dynamic(min=2, max=512)
        >>> Dim.static().kind, Dim.auto().is_dynamic
        ('static', True)
    """

    kind: str
    min: int | None = None
    max: int | None = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise PolicyError(f"Dim kind must be one of {_KINDS}, got {self.kind!r}.")
        if self.kind != "dynamic" and (self.min is not None or self.max is not None):
            raise PolicyError(f"Dim.{self.kind}() takes no range; only Dim.dynamic(min, max) does.")
        r = f"Dim.dynamic(min={self.min!r}, max={self.max!r})"
        object.__setattr__(self, "min", _bound(self.min, "min", r))
        object.__setattr__(self, "max", _bound(self.max, "max", r))
        if self.min is not None and self.max is not None and self.min > self.max:
            raise PolicyError(f"{r}: min > max; no size satisfies it. Swap or fix the bounds.")

    @classmethod
    def dynamic(cls, min: int | None = None, max: int | None = None) -> "Dim":
        """A dimension that must be symbolic, optionally within ``[min, max]``.

        Example:
            >>> Dim.dynamic(max=64).max
            64
        """
        return cls("dynamic", min, max)

    @classmethod
    def static(cls) -> "Dim":
        """A dimension specialized to its value (``mark_static``).

        Example:
            >>> Dim.static()
            Dim.static()
        """
        return cls("static")

    @classmethod
    def auto(cls) -> "Dim":
        """A dimension that is symbolic unless the code specializes it (``maybe_mark_dynamic``).

        Example:
            >>> Dim.auto()
            Dim.auto()
        """
        return cls("auto")

    @property
    def is_dynamic(self) -> bool:
        """True for ``dynamic`` and ``auto``: dynamo allocates a symbol for the dim."""
        return self.kind != "static"

    def canonical(self) -> list:
        """JSON-able form for stable keys: ``[kind, min, max]``.

        Example:
            >>> Dim.dynamic(min=2).canonical()
            ['dynamic', 2, None]
        """
        return [self.kind, self.min, self.max]

    def __repr__(self) -> str:
        if self.kind != "dynamic":
            return f"Dim.{self.kind}()"
        args = [f"{k}={v!r}" for k, v in (("min", self.min), ("max", self.max)) if v is not None]
        return f"Dim.dynamic({', '.join(args)})"
