"""Random ops (``normal_``, ``uniform_``, ``bernoulli_``/``bernoulli``, ``native_dropout`` ...)
without gathering, consistent with dense.

A rank draws the random values of the *whole* global tensor from its generator -- exactly the
draw the dense op makes for that shape and dtype -- and keeps its own part: a shard holds the
values the dense op gives for it under the same seed, and a Replicate result is equal on
every rank (given one seed on every rank, as ``torch.manual_seed`` in a training script, or
DTensor's seed broadcast, gives). This is the offset idea of DTensor's RNG tracker on a
CPU generator, which cannot skip ahead: the draw costs a dense tensor's worth of random
numbers on each rank, never communication. So dropout under SequenceParallel keeps its
shard and matches dense.

The fill ops write a fresh draw into their first operand (its values are not read); the
``*_like`` ops draw a new tensor laid out as their operand (a Partial one's result is
Replicate, as for the other factories); dropout and ``bernoulli(p=)`` compute on theirs.

Under ``torch.compile`` the draws are the same with ``aot_eager`` (the graph calls the same
ops on the same generator); inductor generates its own random numbers, for dense tensors and
DTensor alike, unless ``torch._inductor.config.fallback_random = True``.
"""

from __future__ import annotations

import torch

from ..placements import Partial, Replicate
from .._redistribute import redistribute_local
from ..tensor import ShardedTensor, placements_of, spec
from ._common import check_writable, global_meta, spec_of, wrap_out
from .generic import computed_whole

__all__ = ["random_fill", "random_like", "dropout", "multinomial"]

aten = torch.ops.aten

# In-place draws that ignore the values they overwrite (their other arguments are numbers).
_FILLS = (
    aten.normal_.default, aten.uniform_.default, aten.bernoulli_.float, aten.exponential_.default,
    aten.geometric_.default, aten.log_normal_.default, aten.cauchy_.default, aten.random_.default,
    getattr(aten.random_, "from"), aten.random_.to,
)


def _mine(whole: torch.Tensor, x: ShardedTensor) -> torch.Tensor:
    """This rank's part of a whole value, under ``x``'s placements (no communication)."""
    mesh, pl, coord = spec(x)
    return redistribute_local(whole, mesh, coord, (Replicate(),) * len(pl), pl, x.shape)


@ShardedTensor.implements(*_FILLS)
def random_fill(func, types, args, kwargs):
    """Draw the whole tensor, keep this rank's part (see the module docstring)."""
    x = args[0]
    if type(x) is not ShardedTensor or any(isinstance(a, torch.Tensor) for a in args[1:]):
        return computed_whole(func, types, args, kwargs)
    check_writable(func, args, kwargs, x)
    local = x.local
    if local.is_contiguous() and all(p.is_replicate() for p in placements_of(x)):
        # The local is the whole tensor, laid out as the dense one: draw into it.
        func(local, *args[1:], **kwargs)
        return x
    whole = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.local.device)
    func(whole, *args[1:], **kwargs)
    # Partial('sum'): the value on the first rank, zeros elsewhere (sums to the draw).
    x.local.copy_(_mine(whole, x))
    return x


_LIKE = tuple(
    getattr(op, name)
    for op, names in ((aten.rand_like, ("default", "generator")), (aten.randn_like, ("default", "generator")),
                      (aten.randint_like, ("default", "low_dtype", "generator", "low_generator_dtype")))
    for name in names if hasattr(op, name)
)


@ShardedTensor.implements(*_LIKE)
def random_like(func, types, args, kwargs):
    """Draw a whole tensor of the operand's global shape, keep this rank's part (a shard holds
    the dense op's values for it; Replicate is equal on every rank)."""
    x = args[0]
    mesh, pl, coord = spec(x)
    meta = global_meta(func, args, kwargs)
    whole = func(torch.empty(tuple(x.shape), dtype=x.dtype, device=x.local.device), *args[1:], **kwargs)
    out_pl = tuple(p.settled() for p in pl)
    mine = redistribute_local(whole, mesh, coord, (Replicate(),) * len(pl), out_pl, x.shape)
    return wrap_out(mine, meta, mesh, out_pl, coord)


@ShardedTensor.implements(aten.native_dropout.default, aten.bernoulli.p)
def dropout(func, types, args, kwargs):
    """Dropout's mask (and ``bernoulli``'s draw) from the whole tensor's draw; this rank keeps its
    part. ``native_dropout`` returns ``(x * mask * scale, mask)``. (``bernoulli(x)`` draws with
    ``x``'s values as probabilities, so it needs them whole: the generic fallback does that.)"""
    x = args[0]
    mesh, coord = spec_of(func, args, kwargs)
    if type(x) is not ShardedTensor or any(p.is_partial() for p in placements_of(x)):
        return computed_whole(func, types, args, kwargs)
    meta = global_meta(func, args, kwargs)
    pl = placements_of(x)
    ones = torch.ones(tuple(x.shape), dtype=x.dtype, device=x.local.device)
    if func is aten.bernoulli.p:
        return wrap_out(_mine(func(ones, *args[1:], **kwargs), x), meta, mesh, pl, coord)
    scaled, mask = func(ones, *args[1:], **kwargs)  # scaled = mask * 1 / (1 - p)
    out = x.local * _mine(scaled, x)
    return (wrap_out(out, meta[0], mesh, pl, coord), wrap_out(_mine(mask, x), meta[1], mesh, pl, coord))



@ShardedTensor.implements(aten.multinomial.default)
def multinomial(func, types, args, kwargs):
    """Rows of probabilities sharded (the categories whole): each rank samples its rows, with
    torch's own draw for the whole tensor. Without replacement (or one sample) CPU's
    ``multinomial`` is ``topk(p / q)`` with ``q`` an ``Exp(1)`` draw of the probabilities'
    shape: the rank draws the whole ``q`` and keeps its rows, so its samples are the dense op's
    under the same seed and the result keeps the rows' shard (DTensor: the same placement,
    from its own stream). With replacement (more than one sample) the draw is made on the
    gathered probabilities and the rank keeps its rows: the dense op's samples, the rows'
    shard kept (as DTensor's placement)."""
    x = args[0]
    n = args[1] if len(args) > 1 else kwargs.get("num_samples")
    replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
    gen = kwargs.get("generator")
    if type(x) is not ShardedTensor or x.dim() != 2 or x.local.device.type != "cpu":
        return computed_whole(func, types, args, kwargs)
    mesh, pl, coord = spec(x)
    if any(p.is_partial() or p.is_shard(1) for p in pl):
        return computed_whole(func, types, args, kwargs)
    meta = global_meta(func, args, kwargs)
    if replacement and n != 1:
        whole = redistribute_local(x.local, mesh, coord, pl, (Replicate(),) * len(pl), x.shape)
        res = func(whole, *args[1:], **kwargs)
        return wrap_out(redistribute_local(res, mesh, coord, (Replicate(),) * len(pl), pl, res.shape), meta, mesh,
                        pl, coord)
    q = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.local.device).exponential_(1, generator=gen)
    q = x.local / _mine(q, x)
    local = q.argmax(-1, keepdim=True) if n == 1 else q.topk(n).indices
    return wrap_out(local, meta, mesh, pl, coord)
