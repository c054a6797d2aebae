"""subclass_kit: declare a wrapper tensor subclass's fields, get a compile-ready subclass.

Layer: the top layer. May import ``symbolic`` and ``guards``; they never import it.
This module only re-exports; what is not re-exported is private.
"""

from . import fallbacks as fallbacks, pytree as pytree, serialization as serialization
from .base import WrapperTensor as WrapperTensor
from .compiling import is_compiling as is_compiling
from .ctx import SubclassCtx as SubclassCtx, ctx_of as ctx_of
from .errors import (
    ConstructionError as ConstructionError,
    FieldDeclarationError as FieldDeclarationError,
    FrozenFieldError as FrozenFieldError,
    HandlerResultError as HandlerResultError,
    ToPlainError as ToPlainError,
    InnerShapeError as InnerShapeError,
    InnerShapesKeyError as InnerShapesKeyError,
    LocalClassWarning as LocalClassWarning,
    MetaTypeError as MetaTypeError,
    MetaValueError as MetaValueError,
    OuterDtypeWarning as OuterDtypeWarning,
    CheckpointError as CheckpointError,
    UnsafeGlobalError as UnsafeGlobalError,
    OuterArgumentError as OuterArgumentError,
    SubclassKitError as SubclassKitError,
    SubclassOutputError as SubclassOutputError,
    UnsupportedOpError as UnsupportedOpError,
    WrapGradientError as WrapGradientError,
    GradientDroppedError as GradientDroppedError,
    SymbolicSizeError as SymbolicSizeError,
    SizeSpecializedWarning as SizeSpecializedWarning,
    PlainMaskWarning as PlainMaskWarning,
    MetaRecompileWarning as MetaRecompileWarning,
)
from .fields import inner as inner, meta as meta, state as state


def _installed_version() -> str:
    # One source of truth: pyproject's version, read back from the installed metadata.
    from importlib import metadata

    try:
        return metadata.version("subclass-kit")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


__version__: str = _installed_version()

# TORCH_LOGS=recompiles: a wrapper's ctx change is logged as the field, old and new value.
from . import recompiles as _recompiles  # noqa: E402

_recompiles.install()

__all__ = [
    "WrapperTensor",
    "inner",
    "meta",
    "state",
    "fallbacks",
    "pytree",
    "serialization",
    "is_compiling",
    "SubclassCtx",
    "ctx_of",
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


def __getattr__(name):
    # Heavier submodules load on first use so `import subclass_kit` stays cheap.
    if name in ("examples", "testing", "collectives", "sharded", "bench", "deploy"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'subclass_kit' has no attribute {name!r}")
