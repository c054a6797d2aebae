"""The op table of ShardedTensor, one module per op family (as DTensor keeps them):
``pointwise``, ``view``, ``reshape`` (where a shard lands through a view: ``view_targets``),
``as_strided``, ``view_backward``, ``matrix``, ``reduction``, ``factory``, ``indexing``, ``attention``, ``conv``, ``embedding``, ``mse``, ``norm``, ``nll``,
``random``, ``decompose``, ``independent`` (its per-op table in ``independent_table``, its
``info`` checks in ``linalg_errors``), ``shared_dims`` (its per-op table in
``shared_dims_table``), ``chunked_ce``. Importing this package registers every rule; ops no
family claims by registration or by torch's tags run through ``generic`` (gathered to
Replicate, run densely, logged once per op)."""

from . import as_strided, attention, chunked_ce, conv, decompose, embedding, factory, generic, independent, indexing, layouts, linalg_errors, matrix, mse, nll, norm, pointwise, random, reduction, reshape, shared_dims, view, view_backward  # noqa: F401  (registration)
