"""Functional collectives and ``AsyncCollectiveTensor`` on a real process group.

Run on two CPU processes (gloo)::

    torchrun --standalone --nproc-per-node 2 examples/collectives_act.py

Every rank checks its results against a dense reference it computes itself (each rank can
rebuild every other rank's input), and rank 0 prints a final ``OK`` line.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from subclass_kit.collectives import (
    AsyncCollectiveTensor,
    all_gather_tensor,
    all_reduce,
    all_reduce_autograd,
    reduce_scatter_tensor,
    wait_tensor,
)


def rank_input(rank: int) -> torch.Tensor:
    """What rank ``rank`` contributes: any rank can rebuild any other rank's input."""
    return torch.arange(12.0).reshape(4, 3) * (rank + 1)


@torch.compile(backend="aot_eager", fullgraph=True)
def block(h: torch.Tensor) -> torch.Tensor:
    """A compiled block. Given a pending result, it waits first: the graph starts with
    ``_c10d_functional.wait_tensor`` (see docs/collectives.md, "In compiled regions")."""
    return torch.nn.functional.gelu(h * 0.5).sum(0)


@torch.compile(backend="aot_eager", fullgraph=True)
def reduce_then_scale(x: torch.Tensor) -> torch.Tensor:
    """A collective inside a compiled region: dynamo traces it, no group named."""
    return all_reduce(x, "sum") * 2


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        inputs = [rank_input(r) for r in range(world)]
        x = inputs[rank]
        total = torch.stack(inputs).sum(0)  # the dense reference for a sum all_reduce

        # 1. all_reduce returns at once; views stay pending; the first real use waits, once.
        y = all_reduce(x, "sum")
        assert isinstance(y, AsyncCollectiveTensor), type(y)
        flat = y.view(12)
        assert isinstance(flat, AsyncCollectiveTensor) and not y.completed
        doubled = flat * 2  # compute on the data: waits, returns a plain tensor
        assert type(doubled) is torch.Tensor and y.completed and flat.completed
        assert torch.equal(doubled, total.view(12) * 2)

        # 2. all_gather along dim 0 and reduce_scatter, each against the dense reference.
        gathered = all_gather_tensor(x, 0)
        assert torch.equal(wait_tensor(gathered), torch.cat(inputs, 0))
        stacked = torch.cat(inputs, 0)  # every rank reduces the same (world*4, 3) tensor
        mine = reduce_scatter_tensor(stacked, "sum", 0)
        assert torch.equal(mine + 0, torch.chunk(stacked * world, world, 0)[rank])

        # 3. A pending result handed to a compiled block: the block waits inside its graph.
        pending = all_reduce(x, "sum")
        assert not pending.completed
        out = block(pending)
        assert torch.allclose(out, torch.nn.functional.gelu(total * 0.5).sum(0))

        # 4. A collective traced into a compiled region.
        assert torch.equal(reduce_then_scale(x), total * 2)

        # 5. Gradients: the adjoint of all_reduce(sum) sums every rank's gradient.
        w = x.clone().requires_grad_(True)
        all_reduce_autograd(w, "sum").pow(2).sum().backward()
        assert torch.allclose(w.grad, 2 * total * world)

        dist.barrier()
        if rank == 0:
            print(f"OK collectives_act: world size {world}, all results match the dense reference")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
