"""Focused 2-rank checks of the kit changes the DTensor unit-test ports asked for
(test_port_fixes.py): ``from_local(run_check=True)`` compares strides, a factory on a
sub-mesh gives the ranks outside an empty local, ``distribute`` takes the ``with mesh:``
mesh, ``multinomial`` with replacement keeps row shards, and a Partial gradient of a
Partial -> Partial ``redistribute`` stays Partial (no collective)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

import subclass_kit.sharded as sk
from sharded._tp_upstream_tasks import Comms


def _mesh(ranks=None):
    return DeviceMesh("cpu", torch.arange(dist.get_world_size()) if ranks is None else ranks)


def run_check_stride():
    local = torch.randn(4, 3).t() if dist.get_rank() == 0 else torch.randn(3, 4)
    try:
        sk.ShardedTensor.from_local(local, _mesh(), [sk.Shard(0)], run_check=True)
    except sk.ShardMetadataError as e:
        return "stride" in str(e) and isinstance(e, ValueError)
    return False


def factory_outside_sub_mesh():
    d = sk.zeros(8, 3, device_mesh=_mesh([0]), placements=[sk.Shard(0)])
    return tuple(d.shape), tuple(d.to_local().shape)


def distribute_ambient_mesh():
    with _mesh():
        d = sk.distribute(torch.arange(8.0).reshape(4, 2), None, [sk.Shard(0)])
    return tuple(d.to_local().shape), d.full_tensor().tolist() == torch.arange(8.0).reshape(4, 2).tolist()


def multinomial_replacement_rows():
    torch.manual_seed(0)
    probs = torch.rand(6, 4)
    d = sk.distribute(probs, _mesh(), [sk.Shard(0)])
    torch.manual_seed(3)
    s = torch.multinomial(d, 5, replacement=True)
    torch.manual_seed(3)
    ref = torch.multinomial(probs, 5, replacement=True)
    return s.placements == (sk.Shard(0),), torch.equal(s.full_tensor(), ref)


def partial_grad_stays_partial():
    d = sk.distribute(torch.ones(4, 3, requires_grad=True), _mesh(), [sk.Partial()])
    r = d.redistribute(d.device_mesh, [sk.Partial()])
    grad = sk.ShardedTensor.from_local(torch.ones(4, 3), d.device_mesh, [sk.Partial()])
    with Comms() as c:
        r.backward(grad)
    e = d.new_empty_strided((4, 3), (3, 1))
    return d.grad.placements, c.total(), e.placements, torch.equal(d.grad.to_local(), torch.ones(4, 3))


def run():
    return {f.__name__: f() for f in (run_check_stride, factory_outside_sub_mesh, distribute_ambient_mesh,
                                      multinomial_replacement_rows, partial_grad_stays_partial)}
