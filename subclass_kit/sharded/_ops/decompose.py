"""Ops that run as torch's own decomposition (``torch._decomp``) into ops with rules.

A loss, a matrix-vector product or a gated activation is a few pointwise ops, reductions
and matrix products, each of which already has a sharding rule: running torch's
decomposition on the ShardedTensors lets every step keep its shards (``mse_loss`` of two
Shard(0) operands is a local sum of squares and a ``Partial``, never a gather). One entry
per op in ``_DECOMPOSED``; a step that has no rule still takes the generic fallback, so the
result is dense-correct either way.
"""

from __future__ import annotations

import torch

from ... import _compat
from ..tensor import ShardedTensor
from .generic import TAG_RULES

__all__ = ["decomposed", "composite_rule"]

aten = torch.ops.aten

_DECOMPOSED = (
    # products with a vector, a batch, an outer product
    aten.dot.default, aten.vdot.default, aten.mv.default, aten.addmv.default,
    aten.baddbmm.default, aten.addr.default,
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
    # costs an all-reduce of per-channel sums (see reduction.moments), a channel shard nothing
    aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit_functional.default,
    aten._batch_norm_with_update.default, aten._batch_norm_with_update_functional.default,
    aten._batch_norm_no_update.default,
    aten.native_batch_norm_backward.default, aten.batch_norm_backward.default,
)


@ShardedTensor.implements(*_DECOMPOSED)
def decomposed(func, types, args, kwargs):
    """Run torch's decomposition of ``func`` on the ShardedTensors (each step by its rule)."""
    return _compat.decomposition(func)(*args, **kwargs)


def _composite(func, types, args, kwargs):
    return func.decompose(*args, **kwargs)


def composite_rule(func):
    """An op with a CompositeImplicitAutograd kernel that still reaches the wrapper (``to``
    called inside a decomposition): its own decomposition, step by step through the rules."""
    return _composite if _compat.is_composite_implicit(func) else None


TAG_RULES.append(composite_rule)
