"""A tensor-parallel MLP with ``ShardedTensor``: ``parallelize`` with Colwise/Rowwise styles,
checked against the same dense MLP, eager and compiled, forward, backward and one step.

Run on two CPU processes (gloo)::

    torchrun --standalone --nproc-per-node 2 examples/sharded_mlp.py

Every rank holds the same dense model and input (same seed) and checks the parallel one
against it; rank 0 prints a final ``OK`` line.
"""

from __future__ import annotations

import copy
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from subclass_kit.sharded import ColwiseParallel, Replicate, RowwiseParallel, Shard, ShardedTensor, parallelize


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (world,))
        dense = mlp()
        # Layer 0 column-wise (each rank: a slice of the 64 hidden features), layer 2
        # row-wise (each rank: the matching slice of its inputs, outputs all-reduced).
        tp = parallelize(copy.deepcopy(dense), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        placements = {name: p.placements for name, p in tp.named_parameters()}
        assert placements == {
            "0.weight": (Shard(0),), "0.bias": (Shard(0),),
            "2.weight": (Shard(1),), "2.bias": (Replicate(),),
        }, placements
        w0 = tp[0].weight
        assert isinstance(w0, ShardedTensor) and w0.to_local().shape == (64 // world, 16)
        assert torch.equal(w0.full_tensor(), dense[0].weight)

        torch.manual_seed(1)
        x = torch.randn(8, 16)  # the same replicated input on every rank

        # Forward, eager and compiled (the compiled graph holds the all_reduce and its wait).
        assert torch.allclose(tp(x), dense(x), atol=1e-5)
        compiled = torch.compile(tp, backend="aot_eager", fullgraph=True)
        assert torch.allclose(compiled(x), dense(x), atol=1e-5)

        # Backward through the compiled module: sharded gradients, gathered, equal dense ones.
        compiled(x).pow(2).sum().backward()
        dense(x).pow(2).sum().backward()
        for (name, p), q in zip(tp.named_parameters(), dense.parameters()):
            assert isinstance(p.grad, ShardedTensor) and p.grad.placements == p.placements, name
            assert torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-4), name

        # One SGD step on each: the parallel model still computes the dense one.
        for model in (tp, dense):
            torch.optim.SGD(model.parameters(), lr=0.01).step()
        assert torch.allclose(compiled(x), dense(x), atol=1e-5)

        dist.barrier()
        if dist.get_rank() == 0:
            print(f"OK sharded_mlp: world size {world}, tensor-parallel MLP matches the dense one "
                  "(eager, compiled, gradients, one SGD step)")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
