"""The op table of ShardedTensor, one module per op family (as DTensor keeps them):
``pointwise``, ``view``, ``view_backward``, ``matrix``, ``reduction``, ``factory``, ``indexing``,
``attention``. Importing this package
registers every rule; ops that no family claims raise ``UnsupportedOpError``."""

from . import attention, factory, indexing, matrix, pointwise, reduction, view, view_backward  # noqa: F401  (registration)
