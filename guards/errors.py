"""Errors raised by ``guards``; each also subclasses the matching builtin, so callers can
catch either ``GuardError`` or the builtin they already expect.

Example:
    >>> issubclass(UnhashableContextError, TypeError)
    True
"""

from __future__ import annotations

__all__ = [
    "GuardError",
    "UnhashableContextError",
    "UnstableKeyError",
    "PolicyViolationError",
    "UnsupportedValueError",
    "UnguardableValueError",
    "DispatcherLimitWarning",
]


class GuardError(Exception):
    """Base of every error the guards package raises."""


class UnhashableContextError(GuardError, TypeError):
    """A wrapper's ``__tensor_flatten__`` ctx cannot be deep-copied, so it cannot be guarded.

    (The name is historical: like dynamo, guards compare a ctx with ``==`` and never hash it,
    so dict and list ctxs are fine.)
    """


class UnstableKeyError(GuardError, TypeError):
    """A value inside a ctx has no process-independent form, so no stable cache key exists."""


class PolicyViolationError(GuardError, ValueError):
    """An input contradicts its own marks or policy (dynamo would refuse to compile it)."""


class UnsupportedValueError(GuardError, TypeError):
    """A value of a kind the guard builder cannot describe (e.g. a dict with unhashable keys)."""


class UnguardableValueError(GuardError, ValueError):
    """A value no guard can describe: a list or dict that contains itself, or a ctx holding
    a NaN meta value (NaN != NaN), whose guard would not pass on the next call."""


class DispatcherLimitWarning(UserWarning):
    """A ``GuardedDispatcher`` reached its entry limit; it now evicts or falls back."""
