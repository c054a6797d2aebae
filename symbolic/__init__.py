"""symbolic: dynamic-shape policies, shape relations and sources for wrapper subclasses.

Layer: imports torch and sympy only; never ``subclass_kit`` or ``guards``. Works on any
traceable wrapper subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``); classes
that also define ``__inner_shapes__(outer_size, ctx)`` get exact relations. Torch-private
names are reached only through ``symbolic._compat``.

This module only re-exports. The function ``symbolic.sources(t, name="x")`` lives in
``tensor_sources``, ``symbolic.relations(...)`` in ``shape_relations``: no module shares
its name with a function.
"""

from .arith import ceil_div as ceil_div, floor_div as floor_div, sym_max as sym_max, sym_min as sym_min
from .tensor_sources import sources as sources
from .source_types import (
    ROOT as ROOT,
    InnerSource as InnerSource,
    ItemSource as ItemSource,
    Root as Root,
    SizeSource as SizeSource,
    Source as Source,
    StorageOffsetSource as StorageOffsetSource,
    StrideSource as StrideSource,
    ViewBaseSource as ViewBaseSource,
)
from .errors import (
    CtxPinsShapeWarning as CtxPinsShapeWarning,
    PolicyError as PolicyError,
    PolicyTypeError as PolicyTypeError,
    RelationError as RelationError,
    SymbolicError as SymbolicError,
)
from .dims import Dim as Dim, DimKind as DimKind
from .free_dims import FREE as FREE
from .policy import SubclassPolicy as SubclassPolicy
from .protocol import walk as walk
from .shape_relations import relations as relations, size_sources as size_sources, size_symbol as size_symbol
from .planning import plan as plan
from .marking import apply as apply, mark_dynamic as mark_dynamic, marks as marks
from .description import (
    Relation as Relation,
    ShapeDescription as ShapeDescription,
    TensorDims as TensorDims,
    describe as describe,
)
