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
    "FrozenFieldError",
    "MetaTypeError",
    "MetaValueError",
    "OuterDtypeWarning",
    "CheckpointError",
    "UnsafeGlobalError",
    "OuterArgumentError",
    "InnerShapesKeyError",
    "HandlerResultError",
    "ToPlainError",
    "LocalClassWarning",
    "WrapGradientError",
    "GradientDroppedError",
    "SymbolicSizeError",
    "SizeSpecializedWarning",
    "PlainMaskWarning",
    "MetaRecompileWarning",
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


# ---- author mistakes caught where they are made (issue 13) ---------------------------------


class FrozenFieldError(SubclassKitError, AttributeError):
    """A declared inner or meta field was assigned after construction (``x.scale = ...``).

    Fields are part of the flatten protocol: dynamo guards the ctx and AOTAutograd rebuilds
    the wrapper from it, so a changed field would silently disagree with compiled code.
    Build a new instance instead."""


class MetaTypeError(ConstructionError):
    """A meta value's type contradicts the field's annotation (``block="32"`` for ``int``)."""


class MetaValueError(ConstructionError, ValueError):
    """A meta value breaks its field's ``meta(check=...)`` rule (``block=0`` where a positive
    int is required), at construction or in a loaded checkpoint."""


class OuterDtypeWarning(UserWarning):
    """``dtype=`` was left out, so the outer dtype is the primary inner tensor's integer
    dtype, but ``to_plain()`` computes a floating tensor: the wrapper would claim an integer
    dtype and ops on it would truncate. Pass ``dtype=`` or set ``__default_dtype__``."""


class OuterArgumentError(ConstructionError, ValueError):
    """``size=``, ``stride=``, ``dtype=``, ``device=`` or ``requires_grad=`` is not valid for
    the outer tensor (a string dtype, a stride that does not fit the size)."""


class InnerShapesKeyError(InnerShapeError):
    """A class's ``__inner_shapes__`` returned keys that are not its present inner fields."""


class HandlerResultError(SubclassKitError, RuntimeError):
    """A dispatch handler returned something the op's schema cannot return (a list or a
    float where the op returns one Tensor).

    A RuntimeError (what torch raises for it, "Unable to cast"), not a TypeError: torch turns
    a TypeError inside ``x + y`` into NotImplemented, which would hide this message."""


class ToPlainError(SubclassKitError, RuntimeError):
    """A class's ``to_plain()`` returned a tensor whose shape, dtype or device is not the
    wrapper's, so a result computed on it (``fallbacks.to_plain``) would be silently wrong.
    A RuntimeError for the reason ``HandlerResultError`` is one."""


class LocalClassWarning(UserWarning):
    """A WrapperTensor subclass is not importable by its qualified name, so compile caches
    (AOTAutograd's, which pickles the class by name) are bypassed for it."""


class CheckpointError(SubclassKitError, ValueError):
    """A saved wrapper fails the checks its construction applies (inner shapes against
    ``__inner_shapes__`` and the outer size, dtypes, devices, meta values, the ctx's class):
    a forged or corrupt checkpoint, refused at ``torch.load``."""


class UnsafeGlobalError(SubclassKitError, TypeError):
    """``serialization.allow`` was asked to allow-list a global the kit cannot vouch for
    (a class's ``__safe_globals__`` naming a function such as ``os.system``)."""


# ---- autograd through wrappers (issue 28) -------------------------------------------------------


class WrapGradientError(SubclassKitError, RuntimeError):
    """The backward of ``Cls.wrap`` got a gradient it cannot split into gradients of the
    inner tensors: a plain tensor for a class without a differentiable ``to_plain()``, or a
    wrapper laid out differently from the one ``wrap`` built."""


class GradientDroppedError(SubclassKitError, RuntimeError):
    """A torch-function handler returned a wrapper built with the constructor from inputs
    that require grad: the constructor makes a leaf, so the gradient stops there (a weight's
    ``.grad`` stays None). Build the result with ``Cls.wrap(...)`` instead."""


class SymbolicSizeError(SubclassKitError, RuntimeError):
    """A handler needed a concrete value of a size that is symbolic under torch.compile (a
    data-dependent value, ``int(offsets[-1])``); torch's raw guard error, named."""


class SizeSpecializedWarning(UserWarning):
    """A handler turned a dynamic size into a constant while compiling (``int(x.shape[0])``):
    a dim marked dynamic then fails with torch's ``ConstraintViolationError``, an unmarked one
    recompiles for each new size. Keep the size symbolic."""


class PlainMaskWarning(UserWarning):
    """``fallbacks.to_plain`` ran an op that mixes positions (a reduction, a matmul) on a
    class whose ``__plain_mask__`` declares don't-care positions in ``to_plain()``: the
    padding can enter the result. Register a handler for the op."""


class MetaRecompileWarning(UserWarning):
    """A meta field has taken more distinct values than torch.compile's recompile limit:
    dynamo guards meta values by ``==``, so each new value recompiles. A value that varies per
    batch (offsets, lengths) is data: declare it ``inner()``."""
