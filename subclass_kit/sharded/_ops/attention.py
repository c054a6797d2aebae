"""Attention on CPU (``_scaled_dot_product_flash_attention_for_cpu`` and its backward, what
``F.scaled_dot_product_attention`` runs on CPU), and ``aten.linear`` where it arrives whole.

Attention is independent per batch element and per head, so ``(batch, heads, seq, dim)``
operands sharded on the batch (dim 0) or the heads (dim 1) -- as tensor parallelism leaves
them after a Colwise ``wq``/``wk``/``wv`` -- run locally and give results sharded alike, as
DTensor shards heads. Per mesh dim the rule picks the heads or batch shard one operand
already has (others follow, moving the least), else replicates. A mask follows the operands
where it has more than one batch/head row, and is replicated where it broadcasts.

``aten.linear`` reaches the table whole only where autograd is off (``torch.inference_mode``):
it then decomposes (``t`` + ``addmm``/``matmul``), so the matrix rules shard it.
"""

from __future__ import annotations

from ..placements import Placement, Replicate, Shard
from ..tensor import ShardedTensor, placements_of
from ._common import aten, global_meta, move, move_plain, spec_of, wrap_out

__all__ = ["flash_attention_cpu", "flash_attention_cpu_backward", "linear"]

_FWD = aten._scaled_dot_product_flash_attention_for_cpu.default
_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _choose(operands, mesh_ndim: int) -> tuple:
    """Per mesh dim: Shard(1) (heads) or Shard(0) (batch) when an operand is so sharded
    (heads first), else Replicate."""
    out = []
    for i in range(mesh_ndim):
        have = [placements_of(x)[i] for x in operands if type(x) is ShardedTensor]
        pick: Placement = Replicate()
        for cand in (Shard(1), Shard(0)):
            if cand in have and cand not in out:
                pick = cand
                break
        out.append(pick)
    return tuple(out)


def _local(x, mesh, coord, target):
    if x is None:
        return None
    return move(x, target) if type(x) is ShardedTensor else move_plain(x, mesh, coord, target)


def _mask_target(mask, target: tuple) -> tuple:
    # A mask dim of size 1 broadcasts over every rank's batch/heads: replicated.
    return tuple(p if p.is_shard() and mask.shape[p.dim] != 1 else Replicate() for p in target)


def _run(func, args, kwargs, tensors: tuple, n_out: int):
    mesh, coord = spec_of(func, args, kwargs)
    target = _choose(tensors, mesh.ndim)
    new = [_local(a, mesh, coord, target) if i < len(tensors) else a for i, a in enumerate(args)]
    kw = dict(kwargs)
    if kw.get("attn_mask") is not None:
        kw["attn_mask"] = _local(kw["attn_mask"], mesh, coord, _mask_target(kw["attn_mask"], target))
    metas = global_meta(func, args, kwargs)
    outs = func(*new, **kw)
    return tuple(wrap_out(o, m, mesh, target, coord) for o, m in zip(outs[:n_out], metas[:n_out])) + tuple(outs[n_out:])


@ShardedTensor.implements(_FWD)
def flash_attention_cpu(func, types, args, kwargs):
    """``(output, logsumexp)`` of q, k, v sharded on batch or heads, sharded alike."""
    return _run(func, args, kwargs, tuple(args[:3]), 2)


@ShardedTensor.implements(_BWD)
def flash_attention_cpu_backward(func, types, args, kwargs):
    """``(grad_q, grad_k, grad_v)``: grad_out, q, k, v, out and logsumexp on one batch/heads
    shard, the gradients sharded alike."""
    return _run(func, args, kwargs, tuple(args[:6]), 3)


@ShardedTensor.implements(aten.linear.default)
def linear(func, types, args, kwargs):
    """``x @ w.T + b`` through its decomposition (the matrix rules)."""
    return func.decompose(*args, **kwargs)
