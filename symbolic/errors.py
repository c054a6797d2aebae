"""Errors raised by ``symbolic``. Each also subclasses the matching builtin.

Messages name the tensor path (``x.scale``, rendered like every other source), what was
expected, what was got, and how to fix it.
"""

from __future__ import annotations

__all__ = ["SymbolicError", "PolicyError", "PolicyTypeError", "RelationError", "CtxPinsShapeWarning"]


class SymbolicError(Exception):
    """Base of every error ``symbolic`` raises."""


class PolicyError(SymbolicError, ValueError):
    """A dimension policy that does not fit the tensor it is applied to.

    A dim out of range, an inner name the class does not have, a policy for an optional
    inner that is None, ``min > max``.
    """


class PolicyTypeError(SymbolicError, TypeError):
    """A policy of the wrong kind: not a tensor, a nested policy for a plain tensor, a bad dim."""


class RelationError(SymbolicError, ValueError):
    """``__inner_shapes__`` could not be evaluated symbolically, or contradicts an instance."""


class CtxPinsShapeWarning(UserWarning):
    """A dim asked to be dynamic is also stored in the wrapper's flatten ctx.

    Dynamo compares the ctx with ``==`` on every call, so a new size there fails the ctx
    guard and recompiles whatever the marks say (torchao's NF4Tensor keeps
    ``tensor_meta.original_shape``); a strict ``mark_dynamic`` on such a dim raises
    ConstraintViolationError.
    """
