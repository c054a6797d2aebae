"""The guard kinds, one module per family. This package only re-exports."""

from .base import Guard as Guard, fmt as fmt, line as line
from .shapes import ShapeEquality as ShapeEquality, ShapeRange as ShapeRange
from .tensors import Layout as Layout, MarkMatch as MarkMatch, NoAliasing as NoAliasing, TensorMatch as TensorMatch
from .values import (
    KeysMatch as KeysMatch,
    LenMatch as LenMatch,
    NotNan as NotNan,
    TypeMatch as TypeMatch,
    ValueMatch as ValueMatch,
)
from .wrappers import (
    CtxMatch as CtxMatch,
    InnerNames as InnerNames,
    Relation as Relation,
    SpecMatch as SpecMatch,
    ctx_diff as ctx_diff,
    spec_diff as spec_diff,
)
