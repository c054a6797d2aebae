"""Shard layout arithmetic: the local shape of a shard from the global shape, and back.

Written as plain arithmetic with ``symbolic.ceil_div``/``sym_max``/``sym_min`` so that it runs
on ints (eager), SymInts (fake tensors under torch.compile) and sympy symbols
(``symbolic.relations``). Chunking follows ``torch.chunk``: chunk ``c`` of ``n`` items over
``k`` ranks starts at ``c * ceil(n / k)`` and has ``ceil(n / k)`` items, fewer (or none) at
the end.
"""

from __future__ import annotations

from symbolic import ceil_div, sym_max, sym_min


__all__ = ["chunk_size", "chunk_start", "local_shape", "even_global_shape", "contiguous_strides", "strided_pieces",
           "strided_local_size", "level_shape"]


def contiguous_strides(size) -> tuple:
    """Row-major strides for ``size`` (works on SymInts)."""
    strides = []
    acc = 1
    for s in reversed(tuple(size)):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def chunk_size(n, k: int, c: int):
    """Size of chunk ``c`` when ``n`` items are split over ``k`` ranks as torch.chunk does.

    ``k`` and ``c`` are plain ints (the mesh is static), so branching on them specializes
    nothing; ``n`` may be symbolic.

    Example:
        >>> [chunk_size(5, 2, c) for c in range(2)], [chunk_size(5, 4, c) for c in range(4)]
        ([3, 2], [2, 2, 1, 0])
    """
    if k == 1:
        return n
    full = ceil_div(n, k)
    if c == 0:
        return full
    if c == k - 1:
        # n <= k * ceil(n / k), so the last chunk never exceeds a full one; with two ranks
        # it is never negative either (ceil(n / 2) <= n), which keeps the relation plain.
        return n - full if k == 2 else sym_max(0, n - c * full)
    return sym_min(full, sym_max(0, n - c * full))


def chunk_start(n, k: int, c: int):
    """Offset of chunk ``c`` (clamped to ``n`` for the empty chunks past the end).

    Example:
        >>> [chunk_start(5, 4, c) for c in range(4)]
        [0, 2, 4, 5]
    """
    if c == 0 or k == 1:
        return 0
    return sym_min(c * ceil_div(n, k), n)


def strided_pieces(n, k: int, c: int, sf: int) -> list:
    """``[(start, size), ...]``: the ranges of a dim of ``n`` that coordinate ``c`` of ``k``
    holds under ``_StridedShard(split_factor=sf)``: chunk ``c`` of each of the ``sf`` chunks.

    Example:
        >>> strided_pieces(9, 4, 0, 2), strided_pieces(9, 4, 3, 2)
        ([(0, 2), (5, 1)], [(5, 0), (8, 1)])
    """
    out = []
    for j in range(sf):
        p, start = chunk_size(n, sf, j), chunk_start(n, sf, j)
        out.append((start + chunk_start(p, k, c), chunk_size(p, k, c)))
    return out


def strided_local_size(n, k: int, c: int, sf: int):
    """The size coordinate ``c`` of ``k`` holds of a dim of ``n`` under a strided shard.

    Example:
        >>> [strided_local_size(9, 4, c, 2) for c in range(4)]
        [3, 3, 2, 1]
    """
    total = 0
    for _, size in strided_pieces(n, k, c, sf):
        total = total + size
    return total


def level_shape(global_shape, placements, mesh_shape, coord, level: int) -> tuple:
    """The shape of what mesh dim ``level`` splits: the global shape under the placements
    of the mesh dims before it (a nested shard splits its parent's chunk).

    Example:
        >>> from subclass_kit.sharded import Shard
        >>> level_shape((9, 4), (Shard(0), Shard(0)), (2, 2), (1, 0), 1)
        (4, 4)
    """
    return local_shape(global_shape, placements[:level], mesh_shape[:level], coord[:level])


def local_shape(global_shape, placements, mesh_shape, coord) -> tuple:
    """The shape of this rank's shard (placements normalized, one per mesh dim).

    Example:
        >>> from subclass_kit.sharded import Shard
        >>> local_shape((5, 4), (Shard(0),), (2,), (1,))
        (2, 4)
    """
    shape = tuple(global_shape)
    for p, k, c in zip(placements, mesh_shape, coord):
        shape = p.local_shape(shape, k, c)
    return shape


def even_global_shape(local, placements, mesh_shape) -> tuple:
    """The global shape when every shard has the local shape (``from_local`` without shape=).

    Example:
        >>> from subclass_kit.sharded import Shard
        >>> even_global_shape((2, 4), (Shard(1),), (3,))
        (2, 12)
    """
    shape = tuple(local)
    for p, k in zip(placements, mesh_shape):
        shape = p.global_shape(shape, k)
    return shape
