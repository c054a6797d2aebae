"""Pointwise ops: every aten op tagged ``pointwise`` (in-place ones too), ``_to_copy``, ``clone``, ``copy_``, ``fill_``,
and the elementwise ops torch leaves untagged (``elu_backward`` and the other activations' gradients, ``log_sigmoid_forward``).

Rule, per mesh dim:

- an operand sharded on a dim of the output that it does not broadcast decides: the output
  is sharded there and every other operand is brought to the matching shard (a replicated
  one is chunked locally, for free);
- else Partial operands stay Partial where the op is linear in them: ``add``/``sub`` of
  operands Partial alike (a replicated one joins as a zero-masked operand under
  ``Partial('sum')``, unchanged under ``Partial('avg')``), ``mul``/``div``/``neg`` with one
  Partial operand and replicated factors, an activation's gradient with the incoming
  gradient Partial and the rest whole, ``maximum``/``minimum`` of ``Partial('max')``/``('min')``;
- everything else is reduced to Replicate first.

Plain tensor operands count as replicated (DTensor calls this implicit replication).
"""

from __future__ import annotations

import torch

from ... import _compat, fallbacks
from ...ctx import ctx_of
from ..placements import Partial, Placement, Replicate, Shard
from ..tensor import ShardedTensor, placements_of, sig_of, spec
from .generic import TAG_RULES, computed_whole
from ._common import (TensorMeta, aligned, check_writable, aten, global_meta, move, move_plain, fast_plan, on_locals,
                      plain_values, planned, spec_of, wrap_out)

__all__ = ["pointwise", "rule_for", "whole_view"]

# copy_ counts as a sum of one term: a Partial destination takes a Partial source as is
# (functionalization writes a mutated input back with copy_, e.g. a random fill of a
# Partial under compile), and a replicated source as a zero-masked operand.
_ADDITIVE = {aten.add.Tensor, aten.sub.Tensor, aten.add_.Tensor, aten.sub_.Tensor, aten.copy_.default}
_SCALING = {
    aten.mul.Tensor, aten.mul_.Tensor, aten.mul.Scalar, aten.mul_.Scalar,
    aten.div.Tensor, aten.div_.Tensor, aten.div.Scalar, aten.div_.Scalar,
    aten.neg.default, aten.neg_.default,
}
_LINEAR_PARTIAL = ("sum", "avg")
_ORDERED = {aten.maximum.default: "max", aten.minimum.default: "min"}

# The gradients of activations: elementwise, and torch does not tag them pointwise. Each is
# linear in its first operand (the incoming gradient times a factor of the input), so a
# Partial gradient stays Partial when the other operands are whole.
_ACTIVATION_BACKWARD = (
    aten.elu_backward.default, aten.hardtanh_backward.default, aten.leaky_relu_backward.default,
    aten.softplus_backward.default, aten.log_sigmoid_backward.default, aten.hardsigmoid_backward.default,
    aten.hardshrink_backward.default, aten.softshrink_backward.default, aten.rrelu_with_noise_backward.default,
)


def _operands(args, kwargs):
    """(where, tensor) for every tensor operand; where = index or kwarg name."""
    out = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return out


def _broadcasts(x_shape, d, out_shape, od) -> bool:
    return x_shape[d] == 1 and out_shape[od] != 1


# Copies and casts: linear in their operand between floating and complex dtypes (a cast to
# an integer or bool rounds each addend: not the sum's cast).
_COPIES = {aten._to_copy.default, aten.clone.default}


def _linear_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    return all(d.is_floating_point or d.is_complex for d in (src, dst))


def _partial_kind(func, i, ops, has_scalars, out_dtype=None) -> Partial | None:
    """The Partial the output may keep on mesh dim ``i``, or None (reduce to Replicate)."""
    partial = [placements_of(x)[i] for _, x in ops if type(x) is ShardedTensor and placements_of(x)[i].is_partial()]
    if not partial:
        return None
    p = partial[0]
    if func in _ORDERED:
        # max(max_r a_r, b) = max_r max(a_r, b): a maximum keeps Partial('max') whatever
        # the other operand is (and a minimum Partial('min')), as DTensor's.
        return p if p.op == _ORDERED[func] and all(q == p for q in partial) else None
    if p.op not in _LINEAR_PARTIAL or any(q != p for q in partial):
        return None
    if func in _ADDITIVE:
        plain = any(type(x) is not ShardedTensor and x.dim() > 0 for _, x in ops)
        if p.op == "sum" and (has_scalars or plain):
            return None  # a constant would be added once per rank
        return p
    if func in _COPIES:
        return p if len(ops) == 1 and out_dtype is not None and _linear_cast(ops[0][1].dtype, out_dtype) else None
    if func in _ACTIVATION_BACKWARD:
        first = ops[0][1]
        if len(partial) == 1 and type(first) is ShardedTensor and placements_of(first)[i].is_partial():
            return p
        return None
    if func in _SCALING:
        if len(partial) > 2:
            return None
        # A product of two sums is not the sum of products: with two Partial operands the
        # second is reduced (one all-reduce, as DTensor) and the first stays Partial.
        first = ops[0][1]
        if func.overloadpacket in (aten.div, aten.div_) and not (
            type(first) is ShardedTensor and placements_of(first)[i].is_partial()
        ):
            return None  # 1 / sum is not the sum of 1 / operands
        return p
    return None


def _choose(func, mesh, ops, out_shape, has_scalars, out_dtype=None) -> tuple:
    out_nd = len(out_shape)
    taken: set = set()
    out = []
    for i in range(mesh.ndim):
        pick: Placement | None = None
        for _, x in ops:
            if type(x) is not ShardedTensor:
                continue
            p = placements_of(x)[i]
            sd = p.shard_dim()
            if sd is not None:
                od = sd + out_nd - x.dim()
                if od not in taken and not _broadcasts(x.shape, sd, out_shape, od):
                    pick = Shard(od)
                    break
        if pick is None:
            pick = _partial_kind(func, i, ops, has_scalars, out_dtype) or Replicate()
        picked_dim = pick.shard_dim()
        if picked_dim is not None:
            taken.add(picked_dim)
        out.append(pick)
    return tuple(out)


def _target(x, out_shape, out_pl, additive: bool) -> tuple:
    t = aligned(tuple(x.shape), out_shape, out_pl)
    if type(x) is not ShardedTensor:
        # A plain operand is replicated: a factor of a Partial product, or a term of a
        # Partial('avg') sum (a Partial('sum') add with a plain term is reduced first).
        return tuple(p.settled() for p in t)
    cur = placements_of(x)
    res = []
    for p, c in zip(t, cur):
        if p.is_partial():
            # Keep the operand's own Partial; a replicated operand of an add under 'sum'
            # becomes a zero-masked operand, a replicated factor of a product stays as is.
            res.append(c if c.is_partial() else (p if p.op == "sum" and additive else Replicate()))
        else:
            res.append(p)
    return tuple(res)


def _written_meta(args, ops):
    """An in-place op's result metadata without running its meta kernel: the written
    tensor's own, when every tensor operand has its shape (no broadcast to check; a dtype
    the written tensor cannot hold fails in the op on the locals, with torch's message).
    An optimizer's first step plans a handful of such ops per parameter shape."""
    self_ = args[0] if args else None
    if type(self_) is not ShardedTensor:
        return None
    shape = tuple(self_.shape)
    # Static sizes only: comparing symbolic ones would add guards the meta kernel may not.
    for _, x in ops:
        got = tuple(x.shape)
        if not all([type(n) is int for n in got]) or got != shape:
            return None
    return TensorMeta(shape, tuple(self_.stride()), self_.dtype, self_.storage_offset())


def _plan(func, args, kwargs):
    """Decisions for one call, from metadata only (cached per signature by ``planned``)."""
    mesh, coord = spec_of(func, args, kwargs)
    ops = _operands(args, kwargs)
    has_scalars = any(isinstance(a, (int, float, bool, complex)) and not isinstance(a, torch.Tensor) for a in args[1:])
    writes = ShardedTensor.op_aliasing(func).writes
    written = bool(writes)
    # Only an op that writes its first argument (``add_``), not an ``out=`` one: there the
    # result takes the out tensor's dtype, not the input's.
    meta = _written_meta(args, ops) if written and writes[0][0] == 0 else None
    if meta is None:
        meta = global_meta(func, args, kwargs)
    m0 = meta if type(meta) is TensorMeta else meta[0]
    if written:
        self_ = args[0]
        if type(self_) is not ShardedTensor:
            return _WHOLE  # computed whole, written back (see generic)
        out_pl = placements_of(self_)
        for i, p in enumerate(out_pl):
            if p.is_partial() and _partial_kind(func, i, ops, has_scalars) != p:
                return _WHOLE  # computed whole, written back (see generic)
    else:
        out_pl = _choose(func, mesh, ops, m0.shape, has_scalars, m0.dtype)
    additive = func in _ADDITIVE
    moves = []
    kept: set = set()  # mesh dims whose Partial an operand of a product already keeps
    for where, x in ops:
        if x.dim() == 0 and type(x) is not ShardedTensor:
            continue
        target = _target(x, m0.shape, out_pl, additive)
        if func in _SCALING and any(p.is_partial() for p in target):
            target = tuple(Replicate() if p.is_partial() and i in kept else p for i, p in enumerate(target))
            kept.update(i for i, p in enumerate(target) if p.is_partial())
        if written and where == 0 and target != out_pl:
            return _WHOLE  # computed whole, written back (see generic)
        moves.append((where, target))
    # The fast path, when nothing moves and nothing is written: the op on the locals, and
    # the result built from what the plan already knows (see pointwise below).
    fast = None
    # (Keyword arguments that are plain values -- a cast's dtype=, rounding_mode=,
    # decimals= -- pass on as given: the plan's key pins their names.)
    if not written and plain_values(kwargs) and all(type(a) is not list and type(a) is not tuple for a in args) and all(
        (placements_of(args[w]) == t) if type(args[w]) is ShardedTensor else all(p.is_replicate() for p in t)
        for w, t in moves
    ):
        fast = fast_plan(func, meta, mesh, out_pl, coord, args, kwargs)
        if fast is not None:
            fast = on_locals(*fast, args, kwargs)
    return fast, meta, out_pl, tuple(moves), written, mesh, coord


_planned = planned(_plan, numbers_by_type=True)


# The plan of an in-place op whose written operand cannot keep its placements through the
# op (a nonlinear update of a Partial, a shard written with a broadcast source): the generic
# fallback computes it whole and writes each shard's part back.
_WHOLE = ("whole",)


def pointwise(func, types, args, kwargs):
    """Run a pointwise op on the local shards (see the module docstring for the rule)."""
    plan = _planned(func, args, kwargs)
    if plan is _WHOLE:
        return computed_whole(func, types, args, kwargs)
    if plan[0] is not None:
        return plan[0](args, kwargs) if kwargs else plan[0](args)
    _, meta, out_pl, moves, written, mesh, coord = plan
    if written and args[0]._gathered_view is not None:
        check_writable(func, args, kwargs, args[0])
    new_args = list(args)
    new_kwargs = dict(kwargs) if kwargs else kwargs
    for where, target in moves:
        x = args[where] if type(where) is int else kwargs[where]
        local = move(x, target) if type(x) is ShardedTensor else move_plain(x, mesh, coord, target)
        if type(where) is int:
            new_args[where] = local
        else:
            new_kwargs[where] = local
    res = func(*new_args, **new_kwargs)
    if written:
        return args[0]
    if type(meta) is not TensorMeta:
        return type(res)(wrap_out(r, m, mesh, out_pl, coord) for r, m in zip(res, meta))
    return wrap_out(res, meta, mesh, out_pl, coord)


def rule_for(func):
    """The rule for an op found by tag (pointwise), or None."""
    schema = func._schema
    if (
        _compat.POINTWISE_TAG in func.tags
        and not any(a.kwarg_only and a.name == "out" for a in schema.arguments)
        # aten.equal is tagged pointwise but answers one bool for the whole tensor.
        and all(isinstance(r.type, torch.TensorType) for r in schema.returns)
    ):
        return pointwise
    return None


# clone too: the kit's built-in clone keeps the outer strides, but clone(memory_format=...)
# (what contiguous() runs) must give the global strides the dense clone would have.
ShardedTensor.implements(aten._to_copy.default, aten.fill_.Scalar, aten.copy_.default, aten.clone.default)(pointwise)
# In-place forms torch tags only ``inplace`` (their out-of-place forms are tagged pointwise).
ShardedTensor.implements(aten.zero_.default, aten.masked_fill_.Scalar, aten.masked_fill_.Tensor, aten.fill_.Tensor)(pointwise)
# Elementwise ops torch does not tag pointwise: the activations' gradients, and
# log_sigmoid's forward (its second result, the CPU kernel's buffer, is elementwise too).
ShardedTensor.implements(*_ACTIVATION_BACKWARD, aten.log_sigmoid_forward.default)(pointwise)


TAG_RULES.append(rule_for)


def conj_view(func, types, args, kwargs):
    """``conj()`` of a complex tensor is a view with the conjugate bit set; the bit belongs to
    the wrapper in dense code (kernels resolve it when they see it), which a wrapper's local
    cannot show them. The conjugate is materialized instead (every placement keeps, a sum of
    conjugates being the conjugate of the sum), and marked as a copy: a write into it raises
    rather than miss the base."""
    x = args[0]
    mesh, pl, coord = spec(x)
    out = wrap_out(torch.conj_physical(x.local), global_meta(func, args, kwargs), mesh, pl, coord)
    out._gathered_view = x._gathered_view or func
    return ShardedTensor.correct_aliasing(func, args, kwargs, out)


def whole_view(func, types, args, kwargs):
    """A view op no rule claims (``narrow`` reached inside a decomposition): of a whole
    (all-Replicate) operand it is the same view of the local, as the kit's built-in view
    handler makes it, but with the result's own signature number: the built-in shares its
    base's declared state with a view, and a view of another shape under its base's number
    would be served its base's cached plans (a wrong global shape). Other layouts take the
    fallback (``narrow`` decomposes into ``slice``, which has a rule)."""
    x = args[0]
    if type(x) is not ShardedTensor or not all(p.is_replicate() for p in placements_of(x)):
        return _fallback_handler(func)(func, types, args, kwargs)
    out = fallbacks.map_inner(func, types, args, kwargs)
    if type(out) is ShardedTensor and not _laid_out_as_local(x):
        # A gathered view (its local a compact copy, its global offset and strides the
        # dense view's): the local's geometry would be another view's. The dense view's
        # instead, which AOTAutograd replays a compiled output view of an input at.
        m = global_meta(func, args, kwargs)
        mesh, pl, coord = spec(x)
        view = wrap_out(out.local, m, mesh, pl, coord)
        view._gathered_view = x._gathered_view
        return ShardedTensor.correct_aliasing(func, args, kwargs, view)
    for r in (out if type(out) in (list, tuple) else (out,)):
        if type(r) is ShardedTensor:
            r._sig = sig_of(ctx_of(r), tuple(r.shape), tuple(r.stride()), r.storage_offset())
    return out


def _fallback_handler(func):
    """The handler ``ShardedTensor.__fallback__`` resolves for ``func``, resolved once per op
    (``to`` of a Partial inside a decomposition reaches ``whole_view`` on every call, and the
    resolution asks every rule family). Kept in the class's dispatch cache, which a
    registration clears."""
    cache = ShardedTensor.__kit__.cache
    key = ("whole_view fallback", func)
    h = cache.get(key)
    if h is None:
        fb = ShardedTensor.__fallback__
        resolve = getattr(fb, "resolve_op", None)
        h = (resolve(func) if resolve is not None else None) or fb
        cache[key] = h
    return h


def _laid_out_as_local(x) -> bool:
    local = x.local
    return _compat.known_equal(x.storage_offset(), local.storage_offset()) and all(
        _compat.known_equal(a, b) for a, b in zip(x.stride(), local.stride()))


# Chosen by the class's op classification (consulted before the kit's built-in view
# handler, which would keep the conjugate bit on the local) rather than registered: torch
# calls _conj only on complex tensors (conj() of a real tensor is the tensor itself), and a
# registered op is one the conformance checker calls on every sample, real ones included.
def _op_handler(cls, func):
    if func is aten._conj.default:
        return conj_view
    if func.is_view and func is not aten._neg_view.default:
        return whole_view  # an unregistered view (registered ones never get here)
    return None


ShardedTensor.__op_handler__ = classmethod(_op_handler)  # type: ignore[method-assign,assignment]  # installed where its rule lives
