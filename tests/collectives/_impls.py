"""The two implementations the collectives tests hold side by side, and local references.

``IMPLS["kit"]`` is subclass_kit.collectives; ``IMPLS["torch"]`` is torch's own
``torch.distributed._functional_collectives`` behind the same small interface, so a test
parametrized over both holds the kit to torch's behaviour where the two should agree.

References compute a collective's result locally from every rank's input: each rank can
regenerate every other rank's input from a seed (:func:`rank_input`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import subclass_kit.collectives as kit


@dataclass(frozen=True)
class Impl:
    name: str
    act_type: type
    all_reduce: Callable
    all_gather: Callable          # (t, gather_dim, group)
    reduce_scatter: Callable      # (t, op, scatter_dim, group)
    all_to_all: Callable          # (t, out_splits, in_splits, group)
    broadcast: Callable           # (t, src, group)
    wait: Callable
    all_reduce_ag: Callable       # autograd variants
    all_gather_ag: Callable
    reduce_scatter_ag: Callable
    all_to_all_ag: Callable


def _world(g):
    # torch's functional collectives need an explicit group; the kit takes None.
    return dist.group.WORLD if g is None else g


IMPLS = {
    "kit": Impl(
        "kit",
        kit.AsyncCollectiveTensor,
        lambda t, op, g=None: kit.all_reduce(t, op, g),
        lambda t, d, g=None: kit.all_gather_tensor(t, d, g),
        lambda t, op, d, g=None: kit.reduce_scatter_tensor(t, op, d, g),
        lambda t, o, i, g=None: kit.all_to_all_single(t, o, i, g),
        lambda t, s, g=None: kit.broadcast(t, s, g),
        kit.wait_tensor,
        lambda t, op, g=None: kit.all_reduce_autograd(t, op, g),
        lambda t, d, g=None: kit.all_gather_tensor_autograd(t, d, g),
        lambda t, op, d, g=None: kit.reduce_scatter_tensor_autograd(t, op, d, g),
        lambda t, o, i, g=None: kit.all_to_all_single_autograd(t, o, i, g),
    ),
    "torch": Impl(
        "torch",
        funcol.AsyncCollectiveTensor,
        lambda t, op, g=None: funcol.all_reduce(t, op, _world(g)),
        lambda t, d, g=None: funcol.all_gather_single(t, d, _world(g)),
        lambda t, op, d, g=None: funcol.reduce_scatter_single(t, op, d, _world(g)),
        lambda t, o, i, g=None: funcol.all_to_all_single(t, o, i, _world(g)),
        lambda t, s, g=None: funcol.broadcast(t, s, _world(g)),
        funcol.wait_tensor,
        # torch 2.13's all_reduce is differentiable (sum only).
        lambda t, op, g=None: funcol.all_reduce(t, op, _world(g)),
        lambda t, d, g=None: funcol.all_gather_single_autograd(t, d, _world(g)),
        lambda t, op, d, g=None: funcol.reduce_scatter_single_autograd(t, op, d, _world(g)),
        lambda t, o, i, g=None: funcol.all_to_all_single_autograd(t, o, i, _world(g)),
    ),
}


def plain(t: torch.Tensor) -> torch.Tensor:
    """A waited, plain copy of any collective result (either implementation's wrapper)."""
    if isinstance(t, (kit.AsyncCollectiveTensor, funcol.AsyncCollectiveTensor)):
        t = t.trigger_wait()
    return t.detach().clone()


def rank_input(rank: int, shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Rank ``rank``'s deterministic input; any rank can rebuild any other's."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g).to(dtype)


def reduce(xs, op: str) -> torch.Tensor:
    s = torch.stack(xs)
    return {
        "sum": lambda: s.sum(0),
        "avg": lambda: s.mean(0),
        "product": lambda: s.prod(0),
        "max": lambda: s.amax(0),
        "min": lambda: s.amin(0),
    }[op]()


def ref_reduce_scatter(xs, op, dim, rank):
    return torch.chunk(reduce(xs, op), len(xs), dim=dim)[rank]


def uneven_splits(n: int):
    """(input_splits[s], output_splits[r]) with rank s sending 1 + (s + 2r) % 3 rows to r."""
    k = [[1 + (s + 2 * r) % 3 for r in range(n)] for s in range(n)]
    return [k[s] for s in range(n)], [[k[s][r] for s in range(n)] for r in range(n)]


def ref_all_to_all(xs, in_splits, rank):
    return torch.cat([torch.split(x, in_splits[s])[rank] for s, x in enumerate(xs)])
