"""The generic fallback: an op no family claims runs densely on the gathered operands.

Every ShardedTensor operand is redistributed to ``Replicate`` on every mesh dim (shards
gathered, Partials reduced), the op runs on those locals -- which are then the global
tensors, so the local result *is* the dense result -- and each tensor result comes back as
a ``Replicate`` ShardedTensor. That is correct for any op with a dense meaning, and slow
(a full gather), so each op that takes this path is logged once, at WARNING, through the
``subclass_kit.sharded`` logger: a user sees which ops gather and can add a rule.

Writes are kept honest:

- an in-place or ``out=`` op writing into a ShardedTensor computes the dense result, then
  each written ShardedTensor keeps its own placements: this rank's part of the result is
  copied into its local (a chunk of a Shard, the value on the first rank of a
  ``Partial('sum')`` and zeros elsewhere), with no more communication;
- an op that changes a ShardedTensor's shape or storage in place (``resize_``, ``set_``;
  ``t_``, ``squeeze_`` ... where the out-of-place view would move data) raises ``UnsupportedOpError``: a wrapper's global shape is
  fixed;
- a view op on a sharded operand returns a copy (its local came from a gather), marked as
  such so that a later write into it raises instead of missing the base (as the view
  family's gathered views do); on all-Replicate operands it is a true view.

Random ops draw their values on the whole tensor from each rank's generator: with equal
seeds (``torch.manual_seed`` on every rank, as a training script does) a Replicate result
is the same on every rank and a shard is what the dense op gives for it.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from ...pytree import tree_leaves

from ... import _compat
from ... import fallbacks
from ...ctx import ctx_of
from ..placements import Replicate
from .._redistribute import redistribute_local
from ..tensor import ShardedTensor, placements_of, sig_of, spec, wrap
from ._common import TensorMeta, check_writable, global_meta, move, spec_of, unsupported

__all__ = ["generic", "computed_whole", "gathered_ops", "whole_ops", "GATHER_LOG", "TAG_RULES", "fallback"]

#: The logger each op that gathers is reported to, once per op and process.
GATHER_LOG = logging.getLogger("subclass_kit.sharded")

_LOGGED: set = set()
_WHOLE_LOGGED: set = set()
_CALLS: Counter = Counter()
_WHOLE_CALLS: Counter = Counter()
_SEQ = (list, tuple)


def gathered_ops() -> Counter:
    """How many times each aten overload ran through the generic fallback -- the path of an
    op with no sharding rule -- in this process (a live Counter; ``.clear()`` it to start a
    new count). Rules that compute whole for some placements count in :func:`whole_ops`.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import MeshRef, Shard, distribute
        >>> x = distribute(torch.arange(4.), MeshRef.local(), [Shard(0)])
        >>> gathered_ops().clear()
        >>> _ = torch.histc(x)  # a histogram has no sharding rule: it gathers
        >>> sorted(map(str, gathered_ops()))
        ['aten.histc.default']
    """
    return _CALLS


def whole_ops() -> Counter:
    """How many times a rule handed an op to the whole-tensor path for placements it cannot
    keep (a nonlinear in-place update of a Partial, a write by positions into a shard, a
    random draw that reads a Partial ...), per aten overload (a live Counter)."""
    return _WHOLE_CALLS


def _note(func, calls: Counter = _CALLS) -> None:
    calls[func] += 1
    logged = _LOGGED if calls is _CALLS else _WHOLE_LOGGED
    if func not in logged:
        logged.add(func)
        if calls is _CALLS:
            GATHER_LOG.warning(
                "ShardedTensor computes %s on whole tensors: its operands are gathered to Replicate "
                "and it runs densely on every rank (logged once per op). Register a rule with "
                "@ShardedTensor.implements(%s) to keep it sharded.", func, func,
            )
        else:
            # The op has a rule; these placements are the ones it cannot keep, so the hint to
            # register a rule would send the user after one that exists.
            GATHER_LOG.warning(
                "ShardedTensor computes %s on whole tensors for these placements: its rule cannot "
                "keep them, so its operands are gathered to Replicate (logged once per op). "
                "Redistribute the operands first to choose where it runs.", func,
            )


def _gather(a, full):
    t = type(a)
    if t is ShardedTensor:
        return move(a, full)
    if t in _SEQ:
        return t(_gather(b, full) for b in a)
    return a


def _mutated(func) -> tuple:
    """``(position, name)`` of every argument the schema marks as written (``Tensor(a!)``),
    returned or not (``batch_norm``'s running stats are written but not returned)."""
    hit = _MUTATED.get(func)
    if hit is None:
        hit = _MUTATED[func] = tuple(
            (i, a.name) for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
    return hit


_MUTATED: dict = {}


def _arg(args, kwargs, i, name):
    if i < len(args):
        return args[i]
    return kwargs.get(name)


def _written(func, args, kwargs):
    """The ShardedTensors ``func`` writes into, with their gathered stand-ins' positions."""
    out = []
    for i, name in _mutated(func):
        t = _arg(args, kwargs, i, name)
        if type(t) is ShardedTensor:
            out.append((i, name, t))
        elif type(t) in _SEQ and any(type(b) is ShardedTensor for b in t):
            unsupported(func, args, kwargs, f"it writes into a list of tensors ({name}=), which the generic fallback does not write back;")
    return out


def _write_back(func, args, kwargs, local_args, local_kwargs, written, mesh, coord) -> None:
    for i, name, t in written:
        dense = _arg(local_args, local_kwargs, i, name)
        if tuple(dense.shape) != tuple(t.shape):
            unsupported(
                func, args, kwargs,
                f"it resized the written tensor {name}= from {tuple(t.shape)} to {tuple(dense.shape)}, "
                "and a ShardedTensor's global shape is fixed (pass an out= of the result's shape);",
            )
        pl = placements_of(t)
        mine = redistribute_local(dense, mesh, coord, (Replicate(),) * len(pl), pl, t.shape)
        if mine is not t.local:
            t.local.copy_(mine)


def _wrap_outputs(func, args, kwargs, res, mesh, coord, full, gathered_view):
    metas = None
    if func is _VIEW_DTYPE and args[0].dtype.itemsize == res.dtype.itemsize:
        # Reinterpreted in place: the input's global geometry, also while tracing (where the
        # local's offset would name other elements when AOTAutograd replays the output).
        x = args[0]
        metas = TensorMeta(tuple(x.shape), tuple(x.stride()), res.dtype, x.storage_offset())
    elif not _compat.tracing_symbolically():
        try:
            metas = global_meta(func, args, kwargs)
        except Exception:  # data-dependent shapes, or no meta kernel: the local result knows
            metas = None

    def one(r, m):
        if not isinstance(r, torch.Tensor):
            return r
        shape, stride, offset = tuple(r.shape), tuple(r.stride()), r.storage_offset()
        if type(m) is TensorMeta and m.shape == shape:
            # The dense op's strides and offset on the global operands (a gathered local is
            # compact, the global tensor may be transposed; a view's offset is where it sits
            # in the global storage, what AOTAutograd replays an output view of an input at).
            stride, offset = m.stride, m.offset
        out = wrap(r, mesh, full, coord, shape, stride, r.dtype, offset)
        if gathered_view is not None:
            out._gathered_view = gathered_view
        return out

    if isinstance(res, torch.Tensor):
        return one(res, metas)
    if type(res) in _SEQ:
        ms = metas if type(metas) in _SEQ and len(metas) == len(res) else (None,) * len(res)
        return type(res)(
            (type(r)(one(x, None) for x in r) if type(r) in _SEQ else one(r, m)) for r, m in zip(res, ms)
        )
    return res


_VIEW_DTYPE = torch.ops.aten.view.dtype


def _inplace_view(func, args, kwargs, plan, calls):
    """``t_``, ``squeeze_``, ``transpose_`` ... in place. On Replicate the local and the
    wrapper's sizes change together. On a shard or a Partial the out-of-place view's rule
    says what the placements become (``squeeze_(0)`` of a ``Shard(1)`` is a ``Shard(0)``):
    when it moves no data, the instance takes that view's placements and geometry in place
    (``correct_aliasing`` adopts it); when it would (a shard dim squeezed or reshaped), raise."""
    x = args[0]
    if func._schema.name in _RESIZING:
        unsupported(func, args, kwargs, "it resizes a ShardedTensor in place, and its global shape is fixed;")
    if type(x) is not ShardedTensor:
        unsupported(func, args, kwargs, "its operand is not a ShardedTensor;")
    if any(not p.is_replicate() for p in placements_of(x)) or x._gathered_view is not None:
        view = _out_of_place(func)
        out = view(*args, **kwargs) if view is not None and x._gathered_view is None else None
        if out is None or out._gathered_view is not None or not _same_data(out.local, x.local):
            unsupported(
                func, args, kwargs,
                "on this layout its out-of-place form moves data, so the sharded tensor cannot change in place "
                "(the out-of-place form, e.g. squeeze() for squeeze_(), works);",
            )
        res = ShardedTensor.correct_aliasing(func, args, kwargs, out)  # x takes out's placements and sizes
        x._sig = sig_of(ctx_of(x), tuple(x.shape), tuple(x.stride()), x.storage_offset())
        return res
    func(x.local, *args[1:], **kwargs)  # nothing gathered: not noted as a fallback
    out = ShardedTensor.correct_aliasing(func, args, kwargs, x)  # the wrapper's sizes follow
    x._sig = sig_of(ctx_of(x), tuple(x.shape), tuple(x.stride()), x.storage_offset())
    return out


def _out_of_place(func):
    """``aten.squeeze.dim`` for ``aten.squeeze_.dim`` (None when there is none)."""
    name = func._schema.name.split("::")[-1]
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
    if packet is None:
        return None
    # Overload names differ between the forms (transpose_.default, transpose.int): match types.
    want = [str(a.type) for a in func._schema.arguments]
    for ov in packet.overloads():
        op = getattr(packet, ov)
        if [str(a.type) for a in op._schema.arguments] == want:
            return op
    return None


def _same_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


_RESIZING = {"aten::resize_", "aten::resize_as_", "aten::set_", "aten::resize_as_sparse_", "aten::sparse_resize_"}


def generic(func, types, args, kwargs):
    """The fallback of an op without a rule: run ``func`` densely on the operands gathered
    to Replicate; results are Replicate, written operands keep their placements."""
    if func.__name__.startswith("_foreach_") and _several_meshes(args):
        return _foreach_apart(func, args, kwargs)
    return _whole(func, args, kwargs, _CALLS)


def _several_meshes(args) -> bool:
    lists = [a for a in args if isinstance(a, (list, tuple))]
    return bool(lists) and len(lists[0]) > 1 and len(
        {spec(x)[0] for x in tree_leaves(list(args)) if type(x) is ShardedTensor}) > 1


def _foreach_apart(func, args, kwargs):
    # A _foreach op's lists may hold tensors of several meshes (an optimizer's parameters
    # of a 2-D model): each position runs on its own mesh, as DTensor's; operands of one
    # position on different meshes still raise MeshError.
    n = len(next(a for a in args if isinstance(a, (list, tuple))))
    outs = [func(*[[a[i]] if isinstance(a, (list, tuple)) else a for a in args], **kwargs) for i in range(n)]
    return None if outs[0] is None else [o[0] for o in outs]


def computed_whole(func, types, args, kwargs):
    """The same whole-tensor computation, for a rule whose placements cannot be kept (counted
    in :func:`whole_ops`, not as a fallback)."""
    return _whole(func, args, kwargs, _WHOLE_CALLS)


def _whole(func, args, kwargs, calls):
    mesh, coord = spec_of(func, args, kwargs)
    plan = ShardedTensor.op_aliasing(func)
    if plan.inplace_view:
        return _inplace_view(func, args, kwargs, plan, calls)
    written = _written(func, args, kwargs)
    for _, _, t in written:
        check_writable(func, args, kwargs, t)
    layout = _compat.non_strided_result(func)
    if layout is not None:
        # Refused before anything is gathered (or logged as gathering).
        unsupported(func, args, kwargs, f"its result is a {layout} tensor, and a ShardedTensor holds "
                    "dense strided shards.", fix=f"Convert a plain tensor instead: the whole value "
                    f"(x.full_tensor().{func.overloadpacket.__name__.lstrip('_')}()) or this rank's shard "
                    "(x.to_local()).")
    _note(func, calls)
    full = (Replicate(),) * mesh.ndim
    local_args = _gather(args, full)
    local_kwargs = {k: _gather(v, full) for k, v in kwargs.items()} if kwargs else kwargs
    res = func(*local_args, **local_kwargs)
    for r in tree_leaves(res):
        if isinstance(r, torch.Tensor) and r.layout is not torch.strided:
            unsupported(func, args, kwargs, f"its result is a {r.layout} tensor, and a ShardedTensor holds dense strided shards;")
    if written:
        _write_back(func, args, kwargs, local_args, local_kwargs, written, mesh, coord)
    if plan.functional:
        return _wrap_outputs(func, args, kwargs, res, mesh, coord, full, None)
    if plan.writes:
        # In-place and out= ops return the arguments they wrote.
        return ShardedTensor.correct_aliasing(func, args, kwargs, None)
    # A view: a true view when no operand had to move, else a copy that must not be written.
    src = args[0] if args else None
    moved = type(src) is ShardedTensor and placements_of(src) != full
    gathered_view = (src._gathered_view or func) if type(src) is ShardedTensor and (moved or src._gathered_view) else None
    out = _wrap_outputs(func, args, kwargs, res, mesh, coord, full, gathered_view)
    return ShardedTensor.correct_aliasing(func, args, kwargs, out)


#: Rules found from torch's own op metadata, tried in order for an op with no registered
#: rule: each is ``rule_for(func) -> handler or None`` (the pointwise family claims ops
#: tagged ``pointwise``, the along-dims family ops tagged ``reduction`` by their ``dim``
#: and ``keepdim`` arguments, the random family ops tagged ``nondeterministic_seeded``).
TAG_RULES: list = []


def handler_for(func):
    """The handler for an op with no registered rule: the first a family finds from the op's
    tags and schema, else the generic gathering fallback (resolved once per op)."""
    return next((r for r in (rule(func) for rule in TAG_RULES) if r is not None), generic)


#: ``ShardedTensor.__fallback__``; installed here, with the resolution order: ShardedTensor
#: (the lower layer) does not import its op table. ``subclass_kit.sharded`` imports this
#: package before any op can run.
fallback = fallbacks.per_op(handler_for)
ShardedTensor.__fallback__ = staticmethod(fallback)
