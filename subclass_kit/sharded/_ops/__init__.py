"""The op table of ShardedTensor, one module per op family (as DTensor keeps them):
``pointwise``, ``view``, ``view_backward``, ``matrix``, ``reduction``, ``factory``, ``indexing``,
``attention``, ``norms``, ``random``. Importing this package
registers every rule; ops that no family claims raise ``UnsupportedOpError``."""

from . import attention, factory, indexing, matrix, norms, pointwise, random, reduction, view, view_backward  # noqa: F401  (registration)
