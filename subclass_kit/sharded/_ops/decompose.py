"""Ops that run as torch's own decomposition (``torch._decomp``) into ops with rules.

A loss, a matrix-vector product or a gated activation is a few pointwise ops, reductions
and matrix products, each of which already has a sharding rule: running torch's
decomposition on the ShardedTensors lets every step keep its shards (``mse_loss`` of two
Shard(0) operands is a local sum of squares and a ``Partial``, never a gather). One entry
per op in ``_DECOMPOSED``; a step that has no rule still takes the generic fallback, so the
result is dense-correct either way.

When every ShardedTensor operand is Replicate there is nothing to keep sharded: the op runs
once on the locals, as DTensor runs it, instead of as its decomposition -- several dispatches
through the rules plus torch's reference wrappers, 10 to 100 times DTensor's time per call
(``coverage_table.py --time``). The decision is cached per op and argument signature.
"""

from __future__ import annotations

import torch

from ... import _compat
from ..placements import Replicate
from ..tensor import ShardedTensor, placements_of
from ._common import fast_plan, global_meta, on_locals, planned, spec_of
from .generic import TAG_RULES

__all__ = ["decomposed", "composed", "composite_rule"]

aten = torch.ops.aten

# The *_copy forms of views whose view has a rule: the view, then a contiguous clone (what
# torch's reference does, whose view is prims' reshape: a dozen dispatches per call).
_COPY_OF_VIEW = {
    aten.view_copy.default: aten.view.default, aten.permute_copy.default: aten.permute.default,
    aten.t_copy.default: aten.t.default, aten.transpose_copy.int: aten.transpose.int,
    aten.unsqueeze_copy.default: aten.unsqueeze.default, aten.squeeze_copy.default: aten.squeeze.default,
    aten.squeeze_copy.dim: aten.squeeze.dim, aten.squeeze_copy.dims: aten.squeeze.dims,
    aten.expand_copy.default: aten.expand.default, aten.alias_copy.default: aten.alias.default,
    aten.diagonal_copy.default: aten.diagonal.default, aten.unbind_copy.int: aten.unbind.int,
    aten.split_with_sizes_copy.default: aten.split_with_sizes.default,
    aten.unfold_copy.default: aten.unfold.default,
}


_DECOMPOSED = (
    # products with a vector, a batch, an outer product
    aten.dot.default, aten.vdot.default, aten.mv.default, aten.addmv.default,
    aten.addr.default,
    # losses with their reductions, and their backward
    aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default,
    aten.huber_loss.default, aten.huber_loss_backward.default,
    aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default,
    aten.soft_margin_loss.default, aten.soft_margin_loss_backward.default,
    # activations and small compositions
    aten.hardswish.default, aten.hardswish_backward.default,
    aten._prelu_kernel.default, aten._prelu_kernel_backward.default,
    aten.rsub.Tensor, aten.floor_divide.default,
    aten.masked_fill.Tensor, aten.trace.default,
    # batch norm: the statistics are sums over the batch and spatial dims, so a shard there
    # costs one all-gather of per-channel statistics (see reduction.moments), a channel shard nothing
    aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit_functional.default,
    aten._batch_norm_with_update.default, aten._batch_norm_with_update_functional.default,
    aten._batch_norm_no_update.default,
    aten.native_batch_norm_backward.default, aten.batch_norm_backward.default,
    # gated activations, losses and softmax variants made of rules
    aten.glu.default, aten.glu_backward.default, aten.binary_cross_entropy_with_logits.default,
    aten._safe_softmax.default, aten.dist.default, aten.renorm.default,
    # cdist's matrix-product form (p=2 past 25 rows): norms, a cat and one matmul
    aten._euclidean_dist.default,
    # vectors and complex numbers by parts
    aten.linalg_cross.default, aten.polar.default, aten.complex.default,
    # the *_copy forms of views (the view's rule, then a clone; the rest by torch's reference)
    *_COPY_OF_VIEW, aten.narrow_copy.default, aten.as_strided_copy.default,
    aten.unsafe_split.Tensor, aten._chunk_cat.default, aten.rot90.default,
    aten.fill.Scalar, aten.index_fill.int_Tensor,
    # blocks on a diagonal, ranges whose ends are 0-d tensors
    aten.block_diag.default, aten.linspace.Tensor_Scalar, aten.linspace.Tensor_Tensor,
    aten.linspace.Scalar_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Tensor_Tensor,
)


# The plan of an op that is not all-Replicate (or whose fast path does not apply): decompose.
_DECOMPOSE = ("decompose",)


def _replicated(func, args, kwargs):
    """``run(args, kwargs)`` when every operand is whole on every rank and the op has one
    result and writes nothing (batch norm's running statistics go through the
    decomposition); else ``_DECOMPOSE``."""
    if func is aten.as_strided_copy.default or ShardedTensor.op_aliasing(func).writes:
        return _DECOMPOSE  # as_strided's offsets name the global storage, not the local's
    for a in (*args, *kwargs.values()):
        if type(a) is ShardedTensor:
            if not all(p.is_replicate() for p in placements_of(a)):
                return _DECOMPOSE
        elif (type(a) is list or type(a) is tuple) and any(isinstance(b, torch.Tensor) for b in a):
            return _DECOMPOSE  # tensors in a list (block_diag, _chunk_cat): not unwrapped below
    mesh, coord = spec_of(func, args, kwargs)
    fast = fast_plan(func, global_meta(func, args, kwargs), mesh, (Replicate(),) * mesh.ndim, coord)
    if fast is None:
        return _DECOMPOSE
    # The OpOverload, not fast_plan's Python binding: the arguments come from dispatch, which
    # leaves out those at their defaults, and the nn losses' bindings default ``reduction``
    # to 0 ('none') where the schema says Mean.
    op, make = _compat.raw_op(func), fast[1]
    if not kwargs:
        positional = on_locals(op, make, args)
        return lambda args, kwargs: positional(args)

    def run(args, kwargs):
        return make(op(*[a.local if type(a) is ShardedTensor else a for a in args],
                       **{k: v.local if type(v) is ShardedTensor else v for k, v in kwargs.items()}))

    return run


_replicated_plan = planned(_replicated)




@ShardedTensor.implements(*_DECOMPOSED)
def decomposed(func, types, args, kwargs):
    """Run torch's decomposition of ``func`` on the ShardedTensors (each step by its rule),
    or, all operands Replicate, ``func`` itself on the locals."""
    run = _replicated_plan(func, args, kwargs)
    if run is not _DECOMPOSE:
        return run(args, kwargs)
    view = _COPY_OF_VIEW.get(func)
    if view is not None:
        out = view(*args, **kwargs)
        if type(out) in (list, tuple):
            return [o.clone(memory_format=torch.contiguous_format) for o in out]
        return out.clone(memory_format=torch.contiguous_format)
    return _compat.decomposition(func)(*args, **kwargs)


def _addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    # torch has no Python decomposition of addbmm: the sum over the batch of bmm, scaled and
    # added (a shared batch shard is a local bmm and a Partial sum).
    prod = aten.sum.dim_IntList(aten.bmm.default(batch1, batch2), [0])
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:  # input is ignored (its NaNs too), as torch does
        return prod.expand(torch.broadcast_shapes(input.shape, prod.shape)).clone()
    return (input if beta == 1 else input * beta) + prod


_OWN = {aten.addbmm.default: _addbmm}


@ShardedTensor.implements(*_OWN)
def composed(func, types, args, kwargs):
    """Run the kit's own composition of ``func`` (torch has none) on the ShardedTensors."""
    return _OWN[func](*args, **kwargs)


def _composite(func, types, args, kwargs):
    return func.decompose(*args, **kwargs)


def composite_rule(func):
    """An op with a CompositeImplicitAutograd kernel that still reaches the wrapper (``to``
    called inside a decomposition): its own decomposition, step by step through the rules."""
    return _composite if _compat.is_composite_implicit(func) else None


TAG_RULES.append(composite_rule)
