"""The op table of ShardedTensor, one module per op family (as DTensor keeps them):
``pointwise``, ``view``, ``matrix``, ``reduction``, ``factory``. Importing this package
registers every rule; ops that no family claims raise ``UnsupportedOpError``."""

from . import factory, matrix, pointwise, reduction, view  # noqa: F401  (registration)
