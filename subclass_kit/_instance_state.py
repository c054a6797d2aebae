"""Per-instance state declared with ``state()``: installed on the class, shared by views.

State is what a wrapper instance carries besides its fields: not part of the ctx, so not
flattened, guarded, hashed or pickled (an asynchronous result's pending wait, a cache). It
lives in the instance's attributes; an instance that never set it reads the declared
default from the class. Only this module, the class's ``make`` (``_runtime.py``) and the rewrap
engine's view fast path (``_aliasing.rewrap``) write it into the instance dict.
"""

from __future__ import annotations

__all__ = ["install", "of", "check", "share"]


def install(cls, spec) -> None:
    """Give ``cls`` its state defaults as class attributes (the names are in ``cls.__kit__``)."""
    for f in spec.state:
        if f.name in cls.__dict__:
            # The StateField specifier is replaced by the default every instance starts from.
            setattr(cls, f.name, f.default)


def of(x) -> dict | None:
    """The state ``x`` has set (not the defaults), to share with a view of ``x``; None if none.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, state
        >>> class Tagged(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     _tag: str = state(default="")
        >>> t = Tagged(torch.ones(1)); t._tag = "x"
        >>> of(t)
        {'_tag': 'x'}
    """
    names = type(x).__kit__.state_order
    if not names:
        return None
    d = x.__dict__
    return {n: d[n] for n in names if n in d} or None


def check(cls, values: dict) -> None:
    """Raise TypeError naming any of ``values``' names ``cls`` declares no state for.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, state
        >>> class Tagged(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     _tag: str = state(default="")
        >>> check(Tagged, {"_tag": "x"})
        >>> check(Tagged, {"_typo": 1})
        Traceback (most recent call last):
        TypeError: Tagged has no state named ['_typo'] (declared state: ['_tag']). Declare it in the class body, e.g. `_name: object = state()`.
    """
    names = cls.__kit__.state_names
    if not values.keys() <= names:
        unknown = values.keys() - names
        declared = sorted(names) or "none"
        raise TypeError(
            f"{cls.__qualname__} has no state named {sorted(unknown)} (declared state: "
            f"{declared}). Declare it in the class body, e.g. `_name: object = state()`."
        )


def share(out, x) -> None:
    """Give ``out`` (a fresh view or alias of ``x``, same class) the state ``x`` has set."""
    d = x.__dict__
    od = None
    for n in type(x).__kit__.state_order:
        if n in d:
            if od is None:
                od = out.__dict__
            od[n] = d[n]
