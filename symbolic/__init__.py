"""symbolic: dynamic-shape policies, shape relations and sources for wrapper subclasses.

Layer: imports torch and sympy only; never ``subclass_kit`` or ``guards``. Works on any
traceable wrapper subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``); classes
that also define ``__inner_shapes__(outer_size, ctx)`` get exact relations.
"""

from .arith import ceil_div as ceil_div, floor_div as floor_div, sym_max as sym_max, sym_min as sym_min
from .sources import (
    ROOT as ROOT,
    InnerSource as InnerSource,
    ItemSource as ItemSource,
    Root as Root,
    SizeSource as SizeSource,
    Source as Source,
    StorageOffsetSource as StorageOffsetSource,
    StrideSource as StrideSource,
)
