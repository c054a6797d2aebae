"""``embedding`` and its backward without a gather; ``embedding_bag`` of a vocab-parallel
table (``embedding_bag_vocab``, the shared-dims rule's first try).

Per mesh dim, by the weight's placement:

- ``Replicate``: each rank looks up its own indices; the result keeps the indices' shard
  (a Partial index is reduced first);
- ``Shard(0)`` (vocab-parallel, as torchtitan shards the token embedding), with the indices
  whole on that mesh dim: each rank looks up the indices that fall in its rows, zeros for the
  others, and the result is a ``Partial('sum')``;
- ``Shard(1)`` (the embedding dim): a local lookup, the result sharded on its last dim;
- several mesh dims sharding the vocabulary: the weight is gathered first.

The backward (``embedding_dense_backward``), per mesh dim, with the indices whole unless said:

- indices and incoming gradient sharded alike (not ``scale_grad_by_freq``, whose counts are
  global): each rank scatters its rows' gradients into a whole-size zero gradient, a
  ``Partial('sum')``;
- the gradient sharded on its last dim (a ``Shard(1)`` table's): a ``Shard(1)`` gradient;
- otherwise on whole operands, a ``Replicate`` gradient. (A ``Partial`` gradient is reduced
  first: its size is the tokens', where a pending gradient of the table would be the
  vocabulary's. DTensor keeps it ``Partial``.)

The gradient of a ``Shard(0)`` (vocab-parallel) table looked up by whole indices arrives
``Replicate`` (so does DTensor's): autograd saves only the indices and the row count for
this op, so the table's placement is not visible to it. ``RowwiseParallel`` on an
``nn.Embedding`` looks up the local shard and its gradient is ``Shard(0)``; for a table used
directly, ``to_local``/``from_local`` around a local lookup do the same, or
``redistribute(w.grad, w.mesh, w.placements)`` after backward (free: each rank keeps its rows).
"""

from __future__ import annotations

import torch

from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from ._common import aten, fast_plan, global_meta, move, move_plain, on_locals, planned, spec_of, stays, wrap_out

__all__ = ["embedding", "embedding_backward", "embedding_bag_vocab"]


def _pl(a, n):
    return placements_of(a) if type(a) is ShardedTensor else (Replicate(),) * n


def _decide_forward(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    w, idx = args[0], args[1]
    n = mesh.ndim
    wp, ip = _pl(w, n), _pl(idx, n)
    vocab = [i for i, p in enumerate(wp) if p.is_shard(0)]
    w_to, i_to, out = [], [], []
    for i in range(n):
        p, q = wp[i], ip[i]
        q = q if q.is_shard() else Replicate()
        if p.is_shard(0) and len(vocab) == 1:
            w_to.append(p), i_to.append(Replicate()), out.append(Partial("sum"))
        elif p.is_shard(1) and not q.is_shard():
            w_to.append(p), i_to.append(q), out.append(Shard(idx.dim()))
        else:
            w_to.append(Replicate()), i_to.append(q), out.append(q)
    masked = None
    if len(vocab) == 1 and wp[vocab[0]] == w_to[vocab[0]]:
        d = vocab[0]
        k, c = mesh.shape[d], coord[d]
        start = Shard(0).offset(w.shape[0], k, c)
        rows = Shard(0).local_shape(tuple(w.shape), k, c)[0]
        masked = (start, rows)
    meta = global_meta(func, args, kwargs)
    w_to, i_to, out = tuple(w_to), tuple(i_to), tuple(out)
    fast = None
    if masked is None and not kwargs and stays(w, w_to) and stays(idx, i_to):
        # Nothing moves (a Replicate table, the indices' shard kept): a local lookup.
        fp = fast_plan(func, meta, mesh, out, coord, args)
        fast = None if fp is None else on_locals(*fp, args)
    return meta, w_to, i_to, out, mesh, coord, masked, fast


_forward_plan = planned(_decide_forward)


@ShardedTensor.implements(aten.embedding.default)
def embedding(func, types, args, kwargs):
    """Look up each rank's indices in its part of the table; see the module docstring."""
    meta, w_to, i_to, out, mesh, coord, masked, fast = _forward_plan(func, args, kwargs)
    if fast is not None:
        return fast(args)
    w, idx = args[0], args[1]
    lw = move(w, w_to) if type(w) is ShardedTensor else move_plain(w, mesh, coord, w_to)
    li = move(idx, i_to) if type(idx) is ShardedTensor else move_plain(idx, mesh, coord, i_to)
    rest = list(args[2:])
    if masked is None:
        r = func(lw, li, *rest, **kwargs)
    else:
        start, rows = masked
        outside = (li < start) | (li >= start + rows)
        local_idx = torch.where(outside, torch.zeros_like(li), li - start)
        if rest and rest[0] >= 0:  # padding_idx: only the rank holding that row knows it
            rest[0] = rest[0] - start if start <= rest[0] < start + rows else -1
        r = func(lw, local_idx, *rest, **kwargs)
        r = r.masked_fill(outside.unsqueeze(-1), 0)
    return wrap_out(r, meta, mesh, out, coord)


def _decide_backward(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    g, idx = args[0], args[1]
    n = mesh.ndim
    gp, ip = _pl(g, n), _pl(idx, n)
    scale = args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False)
    emb_dim = g.dim() - 1
    g_to, i_to, out = [], [], []
    for i in range(n):
        p, q = gp[i], ip[i]
        if q.is_shard() and p == q and not scale:
            g_to.append(q), i_to.append(q), out.append(Partial("sum"))
        elif q.is_shard():
            g_to.append(Replicate()), i_to.append(Replicate()), out.append(Replicate())
        elif p.is_shard(emb_dim):
            # A Shard(1) table's gradient: its columns come from the gradient's last dim.
            g_to.append(p), i_to.append(Replicate()), out.append(Shard(1))
        else:
            g_to.append(Replicate()), i_to.append(Replicate()), out.append(Replicate())
    return global_meta(func, args, kwargs), tuple(g_to), tuple(i_to), tuple(out), mesh, coord


_backward_plan = planned(_decide_backward)


@ShardedTensor.implements(aten.embedding_dense_backward.default)
def embedding_backward(func, types, args, kwargs):
    """Scatter each rank's rows' gradients; see the module docstring."""
    meta, g_to, i_to, out, mesh, coord = _backward_plan(func, args, kwargs)
    g, idx = args[0], args[1]
    lg = move(g, g_to) if type(g) is ShardedTensor else move_plain(g, mesh, coord, g_to)
    li = move(idx, i_to) if type(idx) is ShardedTensor else move_plain(idx, mesh, coord, i_to)
    return wrap_out(func(lg, li, *args[2:], **kwargs), meta, mesh, out, coord)


# ---- embedding_bag with a vocab-parallel table ---------------------------------------------------
_MAX_MODE = 2


def embedding_bag_vocab(func, args, kwargs):
    """``_embedding_bag`` of a table sharded on its rows (vocab-parallel) on one mesh dim,
    ``'sum'`` or ``'mean'`` mode: each rank looks up the indices in its rows (zeros for the
    others, as ``embedding``), then pools those rows bag by bag -- the op itself, run on the
    looked-up rows as a table of one row per index (a zero row standing for ``padding_idx``),
    so that offsets, per-sample weights, bag sizes and means are torch's. The pooled result is
    a ``Partial('sum')``; the bag bookkeeping is the same on every rank (Replicate). None
    where it does not apply (``'max'`` mode: an argmax per column is no sum)."""
    w = args[0]
    mode = args[4] if len(args) > 4 else 0
    if type(w) is not ShardedTensor or kwargs or mode == _MAX_MODE or w.dim() != 2 or args[1].dim() != 1:
        return None
    mesh, coord = spec_of(func, args, kwargs)
    wp = placements_of(w)
    vocab = [i for i, p in enumerate(wp) if p.is_shard(0)]
    if len(vocab) != 1 or any(not p.is_replicate() for i, p in enumerate(wp) if i != vocab[0]):
        return None
    whole = (Replicate(),) * mesh.ndim
    idx, offsets = (move(a, whole) if type(a) is ShardedTensor else a for a in args[1:3])
    psw = args[6] if len(args) > 6 else None
    if type(psw) is ShardedTensor:
        psw = move(psw, whole)
    scale = args[3] if len(args) > 3 else False
    last = args[7] if len(args) > 7 else False
    pad = args[8] if len(args) > 8 else -1
    d = vocab[0]
    start = Shard(0).offset(w.shape[0], mesh.shape[d], coord[d])
    rows = w.local.shape[0]
    own = (idx >= start) & (idx < start + rows)
    padding = idx == pad if pad >= 0 else torch.zeros_like(own)
    looked = w.local.index_select(0, torch.where(own & ~padding, idx - start, 0))
    looked = looked.masked_fill(~own.unsqueeze(-1), 0)
    n = idx.numel()
    table = torch.cat([looked, looked.new_zeros(1, looked.shape[1])])
    positions = torch.where(padding, n, torch.arange(n, device=idx.device))
    local_psw = None if psw is None else torch.where(own, psw, 0)
    res = func(table, positions, offsets, scale, mode, False, local_psw, last, n if pad >= 0 else -1)
    meta = global_meta(func, args, kwargs)
    pooled = tuple(Partial("sum") if i == d else Replicate() for i in range(mesh.ndim))
    return tuple(wrap_out(r, m, mesh, pooled if i == 0 else whole, coord) for i, (r, m) in enumerate(zip(res, meta)))


def gather_masked(args, kwargs):
    """``gather(x, d, index)`` of an ``x`` sharded on ``d`` over one mesh dim (whole on the
    others), the index whole with size 1 on ``d``: each rank gathers the positions in its rows
    and zeros the others, a ``Partial('sum')`` with no communication (DTensor's masked
    partial; the lookup above, along any dim). An index sharded on ``d`` into a whole ``x``
    keeps its shard. None where neither applies."""
    x, d, idx = args[0], args[1], args[2]
    if kwargs or len(args) > 3 or idx.dim() != x.dim():
        return None
    d %= x.dim()
    if type(idx) is ShardedTensor and all(type(p) is Shard and p.dim == d or p.is_replicate() for p in placements_of(idx)) \
            and (type(x) is not ShardedTensor or all(p.is_replicate() for p in placements_of(x))):
        # the index sharded on the gathered dim, the input whole: a position there only
        # addresses the input's rows, so each rank gathers its part of the output
        mesh, coord = spec_of(aten.gather.default, args, kwargs)
        out = torch.gather(x.local if type(x) is ShardedTensor else x, d, idx.local)
        return wrap_out(out, global_meta(aten.gather.default, args, kwargs), mesh, placements_of(idx), coord)
    if type(x) is not ShardedTensor:
        return None
    pl = placements_of(x)
    on = [i for i, p in enumerate(pl) if type(p) is Shard and p.dim == d]
    rest_whole = all(p.is_replicate() for i, p in enumerate(pl) if i not in on)
    if len(on) != 1 or not rest_whole or idx.shape[d] != 1 or (
            type(idx) is ShardedTensor and not all(p.is_replicate() for p in placements_of(idx))):
        return None
    mesh, coord = spec_of(aten.gather.default, args, kwargs)
    m = on[0]
    start = Shard(d).offset(x.shape[d], mesh.shape[m], coord[m])
    local, li = x.local, idx.local if type(idx) is ShardedTensor else idx
    n = local.shape[d]
    rel = li - start
    hit = (rel >= 0) & (rel < n)
    if n:
        out = torch.where(hit, torch.gather(local, d, rel.clamp(0, n - 1)), 0)
    else:
        out = torch.zeros(li.shape, dtype=local.dtype, device=local.device)
    out_pl = tuple(Partial("sum") if i == m else Replicate() for i in range(mesh.ndim))
    return wrap_out(out, global_meta(aten.gather.default, args, kwargs), mesh, out_pl, coord)
