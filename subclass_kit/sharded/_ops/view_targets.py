"""Where a shard lands through a reshape (``view``/``_unsafe_view``): the output dim a
sharded input dim becomes, kept whole, regrouped, or merged after other dims as a strided
shard; None when the view must gather it (see ``view``)."""

from __future__ import annotations

import math
from itertools import accumulate
from operator import mul

__all__ = ["view_target", "regroup_target", "strided_target", "split_layout"]


def view_target(in_shape, out_shape, d):
    before = 1
    for s in in_shape[:d]:
        before = before * s
    acc = 1
    for e, s in enumerate(out_shape):
        if acc == before and s == in_shape[d]:
            return e
        acc = acc * s
    return None


def regroup_target(in_shape, out_shape, d, k):
    """The output dim a shard on ``d`` moves to when the view merges ``d`` with the dims
    after it, splits ``d`` with the shard on the first part, or regroups them; None when it
    must gather.

    Chunks stay whole rows of the new dim only when they divide evenly: rows
    ``[r*n/k, (r+1)*n/k)`` of ``d`` are then rows ``[r*m/k, (r+1)*m/k)`` of the merged
    ``m = n * rest`` (or of the first split part, when ``k`` divides that part). Uneven
    chunks do not line up (5 rows over 2 ranks are 3 + 2; merged with a dim of 2 they are
    6 + 4, where torch.chunk of 10 gives 5 + 5). Concrete sizes only: under compile a
    symbolic size would need a divisibility guard, so that case keeps gathering.

    Example:
        >>> regroup_target((4, 3), (12,), 0, 2), regroup_target((12,), (4, 3), 0, 2)
        (0, 0)
        >>> regroup_target((5, 2), (10,), 0, 2) is None, regroup_target((3, 4), (12,), 1, 1) is None
        (True, True)
        >>> regroup_target((48, 35, 26), (24, 4, 35, 13), 0, 2), regroup_target((4, 5), (1, 20), 0, 2)
        (0, 1)
    """
    if any(type(s) is not int or s == 0 for s in (*in_shape, *out_shape)):
        return None
    n, before = in_shape[d], math.prod(in_shape[:d])
    for e, offset in enumerate(accumulate(out_shape[:-1], mul, initial=1)):
        if offset > before:
            return None
        if offset == before:
            # The dims from d on and from e on hold the same elements (the same offset, the
            # same total): rank r's rows [r*n/k, (r+1)*n/k) of d are one contiguous run of
            # them, which is rows [r*s/k, (r+1)*s/k) of e when k divides both sizes -- a
            # merge, a split, or a regrouping ((48, 35, 26) -> (24, 4, 35, 13)).
            s = out_shape[e]
            if s != n and n % k == 0 and s % k == 0:
                return e  # (else a dim of size 1 may come first: look on)
    return None


def strided_target(in_shape, out_shape, d, k):
    """``(e, split_factor)`` when the view merges ``d`` into output dim ``e`` after other
    dims (a flatten of ``(B, S, H)`` sharded on ``S`` into ``(B*S, H)``), else None.

    Each rank's rows of ``d`` then form, for each of the ``split_factor`` index tuples of
    the dims merged before it, one run of ``e``: torch's ``_StridedShard(e, split_factor)``,
    reached with no communication (as DTensor). Even chunks only (``k`` divides ``d``'s size:
    an uneven chunk of ``d`` times the trailing dims is not the strided chunk of their
    product) and concrete sizes.

    Example:
        >>> strided_target((6, 4, 3), (24, 3), 1, 2), strided_target((1, 1, 42, 24), (1008,), 3, 2)
        ((0, 6), (0, 42))
        >>> strided_target((6, 3, 3), (18, 3), 1, 2) is None, strided_target((6, 4), (4, 6), 1, 2) is None
        (True, True)
    """
    if any(type(s) is not int or s == 0 for s in (*in_shape, *out_shape)) or in_shape[d] % k:
        return None
    bounds = set(accumulate(in_shape, mul, initial=1))  # an input dim starts or ends at each
    lo_d, hi_d = math.prod(in_shape[:d]), math.prod(in_shape[:d + 1])
    for e, lo in enumerate(accumulate(out_shape[:-1], mul, initial=1)):
        hi = lo * out_shape[e]
        if lo <= lo_d and hi_d <= hi and lo < lo_d and lo in bounds and hi in bounds:
            return e, lo_d // lo
    return None


def split_layout(in_shape, out_shape, placements, mesh_shape, coord):
    """``(placements, local out shape)`` of a view that splits (or keeps) every sharded dim
    of a layout with strided or nested shards, with no communication; None otherwise.

    Mesh dim by mesh dim (each splits the local the ones before it left): a
    ``_StridedShard(d, sf)`` holds chunk ``c`` of each of ``sf`` blocks of ``d``; when the
    view splits ``d`` into dims whose product before output dim ``e`` is ``lo`` (``lo``
    dividing ``sf``), those blocks are ``q = sf // lo`` blocks of each row run of ``e``,
    so the chunks are ``_StridedShard(e, q)`` of ``e`` -- ``Shard(e)`` when ``q == 1`` (the
    inverse of the flatten that made it). A ``Shard`` is the ``sf == 1`` case. Even chunks,
    but for the last sharding mesh dim when ``e`` ends where ``d`` does (each block is then
    chunked as that dim is); concrete sizes.

    Example:
        >>> from ..placements import Shard, _StridedShard
        >>> split_layout((36, 3), (6, 6, 3), (_StridedShard(0, split_factor=6),), (2,), (0,))
        ((Shard(1),), (6, 3, 3))
        >>> split_layout((36, 3), (2, 18, 3), (_StridedShard(0, split_factor=6),), (2,), (0,))
        ((_StridedShard(dim=1, sf=3),), (2, 9, 3))
        >>> split_layout((36, 3), (4, 9, 3), (_StridedShard(0, split_factor=6),), (2,), (0,)) is None
        True
        >>> split_layout((36, 3), (6, 6, 3), (_StridedShard(0, split_factor=6),), (4,), (3,))
        ((Shard(1),), (6, 0, 3))
        >>> split_layout((24, 36), (864,), (Shard(1), Shard(0)), (2, 2), (0, 0))  # a merge too
        ((_StridedShard(dim=0, sf=24), Shard(0)), (216,))
    """
    from .._layout import strided_local_size
    from ..placements import Shard, _StridedShard

    if any(type(s) is not int or s == 0 for s in (*in_shape, *out_shape)):
        return None
    last_shard = max((i for i, p in enumerate(placements) if p.is_shard()), default=-1)
    lin, lout = list(in_shape), list(out_shape)
    out = []
    for i, (p, k, c) in enumerate(zip(placements, mesh_shape, coord)):
        if not p.is_shard():
            out.append(p)
            continue
        d = p.shard_dim()
        sf = getattr(p, "split_factor", 1)
        if lin[d] % sf:
            return None
        # d's chunks: chunk c of each of the start * sf equal blocks of the whole tensor;
        # out dim e with pos rows before it holds them as _StridedShard(e, q) when the same
        # blocks are q runs of its rows each (pos * q == start * sf), k dividing their rows
        start, hit = math.prod(lin[:d]), None
        even = lin[d] % (sf * k) == 0
        for e, pos in enumerate(accumulate(lout[:-1], mul, initial=1)):
            s = lout[e]
            if pos > start * sf or (start * sf) % pos or s % ((start * sf) // pos):
                continue
            q = start * sf // pos
            # Uneven chunks: when e ends where d does, each block is chunked alike in rows of
            # either; only for the last sharding mesh dim (no later one sees uneven sizes).
            last = pos * s == start * lin[d]
            if (even and (s // q) % k == 0) or (i == last_shard and last):
                hit = e, q
                break
        if hit is None:
            return None
        e, q = hit
        out.append(Shard(e) if q == 1 else _StridedShard(e, split_factor=q))
        lin[d] = strided_local_size(lin[d], k, c, sf)
        lout[e] = strided_local_size(lout[e], k, c, q)
    return tuple(out), tuple(lout)
