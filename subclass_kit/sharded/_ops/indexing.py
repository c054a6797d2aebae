"""Ops that work along some dims (sort, topk, cumsum, flip, roll, tril, pad, index_select,
max/argmax over a dim, kthvalue/median/mode) and ops that index or scatter by a tensor of positions (index,
gather, scatter, index_put, index_add and the ``*_backward`` ops autograd emits for them).

- *Along dims*: a shard on a dim the op works along is gathered first; shards on the other
  dims stay where they are (their slices are independent), shifting past a dim the op
  removes (``max(dim)`` without ``keepdim``). Partial inputs are reduced first -- except
  through an op that only moves, copies or zeroes elements (flip, roll, repeat, tril, pad
  with zeros, index_select: ``_PASSES``), which keeps a pending reduction pending.
- *By positions*: the positions are global indices, so every operand is made whole
  (Replicate) and the op runs on every rank alike; the result is Replicate -- except that
  ``index_put`` into a Partial stays Partial (it is linear in both) with a value Partial
  alike or whole (which joins it: zero-masked past the first rank, no communication),
  ``gather`` of a size-1 index from a shard of the gather dim is a masked local lookup
  (``Partial('sum')``, see ``embedding``), and
  ``gather``/``scatter``/``scatter_add``/``scatter_reduce`` (positions along one dim, what
  the backward of ``max``/``kthvalue``/``median``/``mode`` over a dim runs) keep a shard of
  another dim that every operand has whole-sized. This is what
  DTensor's fallback strategy does for these ops. An in-place one writes into its first
  operand, which must already be whole: a shard would not receive the rows another rank
  owns (a named error says so, with the fix).
"""

from __future__ import annotations

import torch

from ..placements import Partial, Replicate, Shard
from ..tensor import ShardedTensor, placements_of, spec
from .generic import TAG_RULES
from ._common import (
    TensorMeta,
    aten,
    check_writable,
    fast_plan,
    global_meta,
    move,
    move_plain,
    on_locals,
    runner,
    planned,
    spec_of,
    wrap_out,
)

__all__ = ["along_dims", "repeat", "along_decide", "along_general", "along_one_dim", "by_positions", "by_positions_inplace",
           "triangle_inplace"]

_SEQ = (list, tuple)


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _one(d, nd):
    return {d % nd} if nd else set()


def _all(nd):
    return set(range(nd))


def _padded(args, kwargs, nd):
    pad = _arg(args, kwargs, 1, "pad")
    return {nd - 1 - i for i in range(len(pad) // 2) if pad[2 * i] != 0 or pad[2 * i + 1] != 0}


def _repeated(args, kwargs, nd):
    """repeat's dims: those repeated, or all where it adds leading dims (a shard would shift)."""
    reps = _arg(args, kwargs, 1, "repeats")
    if len(reps) != nd:
        return _all(nd)
    return {d for d in range(nd) if reps[d] != 1}


def _reduced_dim(args, kwargs, nd):
    """(dims worked along, dims removed from the result) of max.dim / argmax & co."""
    dim = _arg(args, kwargs, 1, "dim")
    keepdim = _arg(args, kwargs, 2, "keepdim", False)
    dims = _all(nd) if dim is None else _one(dim, nd)
    return dims, (set() if keepdim else dims)


def _select_dim(args, kwargs, nd, at):
    """(dims worked along, dims removed) of kthvalue / mode: ``dim`` (default -1) at ``at``,
    ``keepdim`` after it."""
    dim = _one(_arg(args, kwargs, at, "dim", -1), nd)
    return dim, (set() if _arg(args, kwargs, at + 1, "keepdim", False) else dim)


# op -> (args, kwargs, ndim) -> dims the op works along, or (those dims, dims it removes)
_ALONG = {
    aten.roll.default: lambda a, k, nd: {d % nd for d in _arg(a, k, 2, "dims", ())} or _all(nd),
    aten.flip.default: lambda a, k, nd: {d % nd for d in _arg(a, k, 1, "dims")},
    aten.cumsum.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    aten.cumprod.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    aten.logcumsumexp.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    aten.cummax.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    aten.cummin.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    aten.sort.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim", -1), nd),
    aten.sort.stable: lambda a, k, nd: _one(k.get("dim", -1), nd),
    aten.topk.default: lambda a, k, nd: _one(_arg(a, k, 2, "dim", -1), nd),
    aten.index_select.default: lambda a, k, nd: _one(_arg(a, k, 1, "dim"), nd),
    # the diagonal's position depends on global row and column numbers
    aten.tril.default: lambda a, k, nd: {nd - 2, nd - 1},
    aten.triu.default: lambda a, k, nd: {nd - 2, nd - 1},
    aten.constant_pad_nd.default: _padded,
    aten.max.dim: _reduced_dim,
    aten.min.dim: _reduced_dim,
    aten.argmax.default: _reduced_dim,
    aten.argmin.default: _reduced_dim,
    # order statistics along a dim: the k-th, the median, the most frequent value
    aten.kthvalue.default: lambda a, k, nd: _select_dim(a, k, nd, 2),
    aten.mode.default: lambda a, k, nd: _select_dim(a, k, nd, 1),
    aten.median.dim: _reduced_dim,
    aten.nanmedian.dim: _reduced_dim,
    aten.median.default: lambda a, k, nd: (_all(nd), _all(nd)),
    aten.nanmedian.default: lambda a, k, nd: (_all(nd), _all(nd)),
    aten.repeat.default: _repeated,
}


def _moves(a, k, op) -> bool:
    # Each result element is one input element, or a zero every rank writes: the pending
    # reduction of the ranks' addends is the same op of their results (a reduction of zeros
    # is zero), for sum, avg, max, min and product alike.
    return True


def _pad_value(a, k, op) -> bool:
    # Every rank pads with the value: max/min/avg of it over the ranks is the value, a sum
    # counts it once per rank (so only 0 passes), a product raises it to the ranks' power
    # (so only 1 passes).
    if op in ("sum", "product"):
        return _arg(a, k, 2, "value", 0) == (0 if op == "sum" else 1)
    return True


# op -> (args, kwargs, the Partial's op) -> whether a Partial of the first operand passes
# through the op, the result keeping it pending with no communication (as DTensor does).
_PASSES = {
    aten.flip.default: _moves,
    aten.roll.default: _moves,
    aten.repeat.default: _moves,
    aten.index_select.default: _moves,
    aten.tril.default: _moves,
    aten.triu.default: _moves,
    aten.constant_pad_nd.default: _pad_value,
}


def _schema_dims(func):
    """``(args, kwargs, ndim) -> (dims, removed)`` read from a reduction's schema: its ``dim``
    argument (none, ``None`` or ``[]``: every dim) and ``keepdim``."""
    names = [a.name for a in func._schema.arguments]
    di = names.index("dim") if "dim" in names else None
    ki = names.index("keepdim") if "keepdim" in names else None

    def dims(a, k, nd):
        dim = None if di is None else _arg(a, k, di, "dim")
        keep = False if ki is None else _arg(a, k, ki, "keepdim", False)
        if dim is None or (type(dim) in _SEQ and len(dim) == 0):
            worked = _all(nd)
        else:
            worked = {d % nd for d in (dim if type(dim) in _SEQ else (dim,))} if nd else set()
        return worked, (set() if keep else worked)

    return dims


def reduction_rule(func):
    """The along-dims rule for an op torch tags ``reduction`` (var, std, var_mean, nansum,
    logsumexp, prod, all, any, norm, vector_norm, aminmax, count_nonzero, ...): shards on
    the reduced dims are gathered, the others stay. One entry per op, derived from the schema."""
    if torch.Tag.reduction not in func.tags or torch.Tag.out in func.tags:
        return None
    if not func._schema.arguments or func._schema.arguments[0].name != "self":
        return None
    _ALONG[func] = _schema_dims(func)
    return along_dims


TAG_RULES.append(reduction_rule)


def along_decide(func, args, kwargs):
    """The along-dims rule's decisions for one call: ``(meta, target, out_pl, mesh, coord,
    fast)``, ``fast(args, kwargs)`` the op on the local when nothing moves, else None."""
    x = args[0]
    mesh, cur, coord = spec(x)
    got = _ALONG[func](args, kwargs, x.dim())
    dims, gone = got if type(got) is tuple else (got, set())
    passes = _PASSES.get(func)
    target = tuple(
        Replicate()
        if (p.is_partial() and (passes is None or not passes(args, kwargs, getattr(p, "op", None))))
        or (p.is_shard() and p.dim in dims) else p
        for p in cur
    )
    out_pl = tuple(Shard(p.dim - sum(d < p.dim for d in gone)) if p.is_shard() else p for p in target)
    meta = global_meta(func, args, kwargs)
    fast = None
    if target == cur and not any(isinstance(a, torch.Tensor) or type(a) in _SEQ and any(
            isinstance(b, torch.Tensor) for b in a) for a in (*args[1:], *kwargs.values())):
        # Nothing moves and the other arguments are numbers or dims: the op on the local and
        # the result built from what the plan knows (as the pointwise fast path). The plan's
        # key pins the keyword arguments (var's correction=, keepdim=), so they pass as given.
        fast = fast_plan(func, meta, mesh, out_pl, coord, args, kwargs)
        if fast is not None:
            op, make = fast

            def fast(args, kwargs, op=op, make=make):
                return make(op(args[0].local, *args[1:], **kwargs))
        elif type(meta) in _SEQ:
            # Several results (max/min over a dim, topk, cummax, var_mean): each built from
            # what the plan knows, every one in the output layout.
            run = runner(func, meta, mesh, (out_pl,) * len(meta), coord, args, kwargs)
            if run is not None and kwargs:
                fast = run
            elif run is not None:
                def fast(args, kwargs, run=run):
                    return run(args)
    return meta, target, out_pl, mesh, coord, fast


_along_plan = planned(along_decide)


def _wrap_all(res, meta, mesh, pl, coord):
    if type(res) in _SEQ:
        return type(res)(_wrap_all(r, m, mesh, pl, coord) for r, m in zip(res, meta))
    return wrap_out(res, meta, mesh, pl, coord)


def _whole(a, rep):
    """An operand as its whole value on this rank (plain tensors are whole already)."""
    if type(a) is ShardedTensor:
        return move(a, rep)
    if type(a) in _SEQ:
        return type(a)(_whole(b, rep) for b in a)
    return a


@ShardedTensor.implements(*(f for f in _ALONG if f is not aten.repeat.default))
def along_dims(func, types, args, kwargs):
    """Gather the shards on the dims the op works along; keep the others."""
    plan = _along_plan(func, args, kwargs)
    fast = plan[-1]
    if fast is not None:
        return fast(args, kwargs)
    return along_general(plan, func, args, kwargs)


def along_general(plan, func, args, kwargs):
    """The along-dims rule's general path for the decisions ``plan`` (``along_decide``):
    the operands moved, the op, the results wrapped."""
    meta, target, out_pl, mesh, coord, _ = plan
    rep = (Replicate(),) * len(target)
    rest = [_whole(a, rep) for a in args[1:]]
    res = func(move(args[0], target), *rest, **{k: _whole(v, rep) for k, v in kwargs.items()})
    return _wrap_all(res, meta, mesh, out_pl, coord)


@ShardedTensor.implements(aten.repeat.default)
def repeat(func, types, args, kwargs):
    """``repeat`` (and ``tile``, which is repeat): a shard of a dim repeated once stays, moved
    past the leading dims the repeats add (as DTensor); a repeated shard is gathered first."""
    x = args[0]
    reps = list(_arg(args, kwargs, 1, "repeats"))
    lead = len(reps) - x.dim()
    if lead <= 0 or type(x) is not ShardedTensor:
        return along_dims(func, types, args, kwargs)
    mesh, cur, coord = spec(x)
    target = tuple(Replicate() if p.is_shard() and reps[p.dim + lead] != 1 else p for p in cur)
    out_pl = tuple(Shard(p.dim + lead) if p.is_shard() else p for p in target)
    return wrap_out(func(move(x, target), reps), global_meta(func, args, kwargs), mesh, out_pl, coord)


@ShardedTensor.implements(aten.tril_.default, aten.triu_.default)
def triangle_inplace(func, types, args, kwargs):
    """``tril_``/``triu_`` in place: zeroing by global row and column numbers is local where
    neither of the last two dims is sharded (a Partial too: every rank zeroes the same
    entries); a shard of them is computed whole and written back."""
    x = args[0]
    if type(x) is ShardedTensor and x._gathered_view is None and not any(
            p.is_shard() and p.shard_dim() in (x.dim() - 2, x.dim() - 1) for p in placements_of(x)):
        func(x.local, *args[1:], **kwargs)
        return x
    from .generic import computed_whole

    return computed_whole(func, types, args, kwargs)


_BY_POSITIONS = (
    aten.index.Tensor, aten.take_along_dim.default, aten.masked_select.default,
    aten.index_add.default, aten.index_copy.default, aten.index_fill.int_Scalar,
    aten.unfold_backward.default, aten.masked_scatter.default,
)


def _data_dependent(func, args) -> bool:
    """The result's size depends on the values (a boolean mask): no meta kernel can say it."""
    if func is aten.masked_select.default:
        return True
    return func is aten.index.Tensor and any(
        i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]
    )


def _whole_meta(res):
    # Every operand was whole, so the local result is the global value; its metadata is
    # the global metadata up to strides (taken only where the size is data-dependent).
    if type(res) in _SEQ:
        return type(res)(_whole_meta(r) for r in res)
    return TensorMeta(tuple(res.shape), tuple(res.stride()), res.dtype, res.storage_offset())


@ShardedTensor.implements(*_BY_POSITIONS)
def by_positions(func, types, args, kwargs):
    """Make every operand whole, run the op alike on every rank; the result is Replicate."""
    mesh, coord = spec_of(func, args, kwargs)
    rep = (Replicate(),) * mesh.ndim
    res = func(*_whole(args, rep), **{k: _whole(v, rep) for k, v in kwargs.items()})
    meta = _whole_meta(res) if _data_dependent(func, args) else global_meta(func, args, kwargs)
    return _wrap_all(res, meta, mesh, rep, coord)


@ShardedTensor.implements(aten.index_put.default)
def index_put(func, types, args, kwargs):
    """``index_put(x, indices, v)`` is linear in ``(x, v)`` together (accumulated or not): with
    ``x`` Partial (sum/avg) and ``v`` Partial alike or whole (a whole ``v`` joins the Partial:
    zero-masked under 'sum', no communication) it runs on the operands and stays Partial (as
    DTensor's); else by positions."""
    x, v = args[0], args[2]
    pl = placements_of(x) if type(x) is ShardedTensor else None
    if pl and all(p.is_partial() and p.op in ("sum", "avg") for p in pl) and (
            placements_of(v) in (pl, (Replicate(),) * len(pl)) if type(v) is ShardedTensor else isinstance(v, torch.Tensor)):
        mesh, coord = spec_of(func, args, kwargs)
        idx = [None if i is None else _whole(i, (Replicate(),) * mesh.ndim) for i in args[1]]
        lv = move(v, pl) if type(v) is ShardedTensor else move_plain(v, mesh, coord, pl)
        return wrap_out(func(x.local, idx, lv, *args[3:], **kwargs), global_meta(func, args, kwargs), mesh, pl, coord)
    return by_positions(func, types, args, kwargs)


# Positions along one dim (``dim``): self at 0, the index at 2, a source at 3. Every other
# dim is positional -- element i of the index addresses element i of self and of the source
# there -- so a shard of another dim stays when the operands have one size at it (the index
# covers the whole dim: a rank's rows of it address its rows). What autograd emits for
# max/kthvalue/median/mode over a dim (scatter into zeros) and for gather.
_ALONG_ONE_DIM = (aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
                  aten.scatter_reduce.two)


def _one_dim_decide(func, args, kwargs):
    mesh, coord = spec_of(func, args, kwargs)
    x = args[0]
    nd = x.dim()
    d = args[1] % nd if nd else 0
    at = tuple(i for i in (0, 2, 3) if i < len(args) and isinstance(args[i], torch.Tensor))
    tensors = [args[i] for i in at]
    lay: list = []
    if all(t.dim() == nd for t in tensors):
        for m in range(mesh.ndim):
            pick = Replicate()
            for t in tensors:
                k = placements_of(t)[m].shard_dim() if type(t) is ShardedTensor else None
                if k is not None and k != d and all(q.shard_dim() != k for q in lay) and \
                        len({u.shape[k] for u in tensors}) == 1:
                    pick = Shard(k)
                    break
            lay.append(pick)
    layout = tuple(lay) if lay else (Replicate(),) * mesh.ndim
    as_laid = [placements_of(t) == layout if type(t) is ShardedTensor else all(p.is_replicate() for p in layout)
               for t in tensors]
    if all(p.is_replicate() for p in layout) and not all(as_laid):
        return None
    meta = global_meta(func, args, kwargs)
    fast = None
    if not kwargs and all(as_laid):
        # Nothing moves (every operand whole, or on the kept shard): the op on the locals,
        # the result built from what the plan knows.
        fp = fast_plan(func, meta, mesh, layout, coord, args)
        fast = None if fp is None else on_locals(*fp, args)
    return layout, at, meta, mesh, coord, fast


_one_dim_plan = planned(_one_dim_decide)


@ShardedTensor.implements(*_ALONG_ONE_DIM)
def along_one_dim(func, types, args, kwargs):
    """``gather``/``scatter``/``scatter_add``/``scatter_reduce`` by positions along ``dim``:
    shards of the other dims stay (each rank runs the op on its locals); else by positions."""
    plan = _one_dim_plan(func, args, kwargs)
    if plan is None:
        from .embedding import gather_masked

        masked = gather_masked(args, kwargs) if func is aten.gather.default else None
        return by_positions(func, types, args, kwargs) if masked is None else masked
    layout, at, meta, mesh, coord, fast = plan
    if fast is not None:
        return fast(args)
    new = list(args)
    for i in at:
        a = args[i]
        new[i] = move(a, layout) if type(a) is ShardedTensor else move_plain(a, mesh, coord, layout)
    rep = (Replicate(),) * mesh.ndim
    return wrap_out(func(*new, **{k: _whole(v, rep) for k, v in kwargs.items()}), meta, mesh, layout, coord)


_BY_POSITIONS_INPLACE = (
    aten.scatter_.src, aten.scatter_.value, aten.scatter_add_.default, aten.scatter_reduce_.two,
    aten.index_add_.default, aten.index_copy_.default, aten.index_fill_.int_Scalar,
    aten.index_put_.default, aten._index_put_impl_.default, aten.masked_scatter_.default,
)


@ShardedTensor.implements(*_BY_POSITIONS_INPLACE)
def by_positions_inplace(func, types, args, kwargs):
    """Write by global positions into a whole (Replicate) tensor, on every rank alike."""
    dst = args[0]
    mesh, coord = spec_of(func, args, kwargs)
    rep = (Replicate(),) * mesh.ndim
    if type(dst) is ShardedTensor:
        check_writable(func, args, kwargs, dst)
        if placements_of(dst) != rep:
            # A shard (or a pending reduction) holds only part of the positions written:
            # computed whole, and each rank keeps its part (the generic fallback's write-back).
            from .generic import computed_whole

            return computed_whole(func, types, args, kwargs)
        func(dst.local, *_whole(args[1:], rep), **{k: _whole(v, rep) for k, v in kwargs.items()})
        return dst
    func(dst, *_whole(args[1:], rep), **{k: _whole(v, rep) for k, v in kwargs.items()})
    return dst

