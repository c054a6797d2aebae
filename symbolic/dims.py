"""``Dim``: the policy for one dimension of one tensor; ``DimKind``: the kinds of dimension."""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import Any

from .errors import PolicyError, PolicyTypeError

__all__ = ["Dim", "DimKind"]


class DimKind(str, enum.Enum):
    """How dynamo treats one dimension: the one vocabulary of dim kinds (torch's ``DimDynamic``).

    A policy (``Dim``) is ``DYNAMIC`` (``mark_dynamic``), ``STATIC`` (``mark_static``) or
    ``AUTO`` (``maybe_mark_dynamic``). Reading marks can also give ``UNBACKED``
    (``mark_unbacked``). ``DUCK`` is how ShapeEnv allocates an unmarked dim under
    ``dynamic=True`` (equal sizes share a symbol); ``guards`` uses it, a ``Dim`` never is one.

    A ``str`` enum so that its values are the JSON of stable keys, and a kind compared with
    its text (``Dim.static().kind == "static"``) stays true.

    Example:
        >>> Dim.auto().kind is DimKind.AUTO, DimKind("static")
        (True, <DimKind.STATIC: 'static'>)
    """

    DYNAMIC = "dynamic"
    STATIC = "static"
    AUTO = "auto"
    UNBACKED = "unbacked"
    DUCK = "duck"


# The kinds a user's policy may ask for.
_POLICY_KINDS = (DimKind.DYNAMIC, DimKind.STATIC, DimKind.AUTO)


def _bound(v: Any, what: str, kind_repr: str) -> int | None:
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
        (<DimKind.STATIC: 'static'>, True)
    """

    kind: DimKind
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        kind: Any = self.kind
        if not isinstance(kind, DimKind) and isinstance(kind, str):
            kind = next((k for k in DimKind if k.value == kind), kind)
        if kind not in _POLICY_KINDS or not isinstance(kind, DimKind):
            raise PolicyError(
                f"Dim kind must be one of {[k.value for k in _POLICY_KINDS]}, got {self.kind!r}. "
                "Build one with Dim.dynamic(), Dim.static() or Dim.auto()."
            )
        object.__setattr__(self, "kind", kind)
        if self.kind is not DimKind.DYNAMIC and (self.min is not None or self.max is not None):
            raise PolicyError(f"Dim.{self.kind.value}() takes no range; only Dim.dynamic(min, max) does.")
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
        return cls(DimKind.DYNAMIC, min, max)

    @classmethod
    def static(cls) -> "Dim":
        """A dimension specialized to its value (``mark_static``).

        Example:
            >>> Dim.static()
            Dim.static()
        """
        return cls(DimKind.STATIC)

    @classmethod
    def auto(cls) -> "Dim":
        """A dimension that is symbolic unless the code specializes it (``maybe_mark_dynamic``).

        Example:
            >>> Dim.auto()
            Dim.auto()
        """
        return cls(DimKind.AUTO)

    @property
    def is_dynamic(self) -> bool:
        """True for ``dynamic`` and ``auto``: dynamo allocates a symbol for the dim."""
        return self.kind is not DimKind.STATIC

    def canonical(self) -> list[Any]:
        """JSON-able form for stable keys: ``[kind, min, max]``.

        Example:
            >>> Dim.dynamic(min=2).canonical()
            ['dynamic', 2, None]
        """
        return [self.kind.value, self.min, self.max]

    def __repr__(self) -> str:
        if self.kind is not DimKind.DYNAMIC:
            return f"Dim.{self.kind.value}()"
        args = [f"{k}={v!r}" for k, v in (("min", self.min), ("max", self.max)) if v is not None]
        return f"Dim.dynamic({', '.join(args)})"
