"""Rank tasks for test_decompose_replicated: ops the kit runs as torch's decomposition, on
all-Replicate operands (one call on the locals) and on a shard (the decomposition)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from subclass_kit.sharded import Replicate, Shard, ShardedTensor
from sharded._meshes import strides as _strides

aten = torch.ops.aten


class _Seen(TorchDispatchMode):
    """The aten ops that reach ShardedTensor's dispatch while active (each let through)."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, ShardedTensor) for t in types):
            self.ops.append(str(func.overloadpacket.__name__))
            return NotImplemented
        return func(*args, **(kwargs or {}))


# name -> (fn, dense operands); each op is in decompose._DECOMPOSED.
CASES = {
    # the default reduction ('mean') is left out of the dispatched arguments
    "smooth_l1_loss": (lambda a, b: F.smooth_l1_loss(a, b), (8, 4), (8, 4)),
    "binary_cross_entropy": (lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid()), (8, 4), (8, 4)),
    "addr": (lambda m, v, w: torch.addr(m, v[:, 0], w[0], beta=0.5, alpha=2.0), (8, 4), (8, 4), (8, 4)),
    "view_copy": (lambda a: torch.view_copy(a, [4, 8]), (8, 4)),
    "mv": (lambda m, v: torch.mv(m, v[0]), (8, 4), (8, 4)),
}


def values_and_paths() -> dict:
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, (fn, *shapes) in CASES.items():
        dense = [torch.randn(s, generator=g) for s in shapes]
        want = fn(*dense)
        for label, pl in (("R", Replicate()), ("S", Shard(0))):
            xs = [ShardedTensor.from_local(d.chunk(2)[dist.get_rank()] if label == "S" else d, mesh, [pl],
                                           shape=d.shape, stride=_strides(d.shape)) for d in dense]
            with _Seen() as seen:
                got = fn(*xs)
            full = got.full_tensor()
            out[f"{name} {label}"] = {
                "close": bool(torch.allclose(full, want, atol=1e-5)) and full.shape == want.shape,
                "placements": str(got.placements) if label == "R" else None,
                "ops": seen.ops,
            }
    return out


def compiled_matches_eager() -> bool:
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(1)
    a, b = (ShardedTensor.from_local(torch.randn(8, 4, generator=g), mesh, [Replicate()]) for _ in range(2))

    def f(a, b):
        return F.smooth_l1_loss(a, b) + torch.addr(a, a[:, 0], b[0]).sum()

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(a, b)
    return bool(torch.allclose(got.full_tensor(), f(a, b).full_tensor()))
