"""In-place random fills (``bernoulli_``, ``uniform_``, ``normal_``) and ``native_dropout``:
what dropout runs (eagerly ``empty_like(x).bernoulli_(1 - p)``, under torch.compile
``native_dropout``), so dropout under ``SequenceParallel`` gives the dense model's mask.

Each rank draws the values of the whole tensor from its own generator and keeps its part
(a chunk for a Shard, the whole for a Replicate, the whole on the first rank of a
``Partial('sum')`` and zeros on the others): no communication, and with equal seeds on every
rank (``torch.manual_seed``, as a training script does) the result is what the dense op
gives, shard by shard, and every rank's generator advances alike. Drawing the whole tensor
costs the dense op's random numbers on every rank; DTensor instead offsets a Philox
generator per shard, which this CPU generator cannot do.
"""

from __future__ import annotations

import torch

from ..placements import Replicate
from .._redistribute import redistribute_local
from ..tensor import ShardedTensor, spec
from ._common import aten, check_writable

__all__ = ["fill_random_", "native_dropout"]


@ShardedTensor.implements(aten.bernoulli_.float, aten.uniform_.default, aten.normal_.default)
def fill_random_(func, types, args, kwargs):
    """Fill a ShardedTensor in place with the dense op's values for its part."""
    x, rest = args[0], args[1:]
    check_writable(func, args, kwargs, x)
    mesh, pl, coord = spec(x)
    whole = func(torch.empty(x.shape, dtype=x.dtype, device=x.local.device), *rest, **kwargs)
    x.local.copy_(redistribute_local(whole, mesh, coord, (Replicate(),) * mesh.ndim, pl, x.shape))
    return x


@ShardedTensor.implements(aten.native_dropout.default)
def native_dropout(func, types, args, kwargs):
    """``(output, mask)``: the mask drawn as the in-place fill above (the dense mask for each
    shard), laid out like the input; its backward (``native_dropout_backward``) is pointwise."""
    x, p, train = (list(args) + [kwargs.get("train")])[:3]
    if train is False:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = torch.empty_like(x).bernoulli_(1 - p)
    return x * keep * (1.0 / (1 - p) if p < 1 else 0.0), keep != 0
