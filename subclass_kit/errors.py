"""Errors raised by subclass_kit. Each also subclasses the matching builtin, so callers can
catch either ``UnsupportedOpError`` or ``NotImplementedError``."""

from __future__ import annotations

__all__ = [
    "SubclassKitError",
    "FieldDeclarationError",
    "ConstructionError",
    "InnerShapeError",
    "UnsupportedOpError",
    "SubclassOutputError",
    "LocalClassWarning",
]


class SubclassKitError(Exception):
    """Base of every error the kit raises."""


class FieldDeclarationError(SubclassKitError, TypeError):
    """A WrapperTensor subclass declares its fields wrongly (raised at class definition)."""


class ConstructionError(SubclassKitError, TypeError):
    """A WrapperTensor was constructed with arguments that do not fit its fields."""


class InnerShapeError(SubclassKitError, ValueError):
    """An inner tensor's shape contradicts the class's ``__inner_shapes__``."""


class UnsupportedOpError(SubclassKitError, NotImplementedError):
    """An op reached a WrapperTensor subclass that has no handler and no fallback for it."""


class SubclassOutputError(SubclassKitError, TypeError):
    """A deployment target (an AOTInductor package) would have to return a tensor subclass."""


class LocalClassWarning(UserWarning):
    """A WrapperTensor subclass is not importable by its qualified name, so compile caches
    (AOTAutograd's, which pickles the class by name) are bypassed for it."""
