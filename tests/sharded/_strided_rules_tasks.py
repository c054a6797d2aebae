"""Rank tasks for test_strided_rules: a flatten that merges a shard after other dims gives a
_StridedShard with no collective (as DTensor), and mm keeps a strided row shard."""

from __future__ import annotations

import torch

from subclass_kit.sharded import Replicate, Shard, _StridedShard, distribute
from sharded._dtensor_api_tasks import _mesh
from sharded._dtensor_unit_ops2_tasks import mesh_2d
from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close


def flatten_to_strided() -> dict:
    mesh = _mesh()
    torch.manual_seed(0)
    out = {}
    g = torch.randn(6, 4, 3, requires_grad=True)
    x = distribute(g.detach(), mesh, [Shard(1)]).requires_grad_(True)
    with Comms() as c:
        y = x.view(24, 3)
    out["even"] = (y.placements, c.total(), tuple(y.to_local().shape))
    close(y.full_tensor(), g.view(24, 3))
    # the layout feeds the next ops (elementwise, a reduction) and autograd
    z = (y * 2 + 1).sum(0)
    close(z.full_tensor(), (g.view(24, 3) * 2 + 1).sum(0))
    z.sum().backward()
    (g.view(24, 3) * 2 + 1).sum().backward()
    close(x.grad.full_tensor(), g.grad)
    # uneven chunks of a dim merged after others, the trailing dims apart: each block of the
    # strided shard is chunked as the dim was (torch.chunk of 3 rows), nothing moved
    h = torch.randn(6, 3, 3)
    hd = distribute(h, mesh, [Shard(1)])
    with Comms() as c:
        u = hd.reshape(18, 3)
    out["uneven"] = (u.placements, c.total())
    close(u.full_tensor(), h.reshape(18, 3))
    return out


def mm_keeps_strided_rows() -> dict:
    mesh = _mesh()
    torch.manual_seed(0)
    a, w = torch.randn(8, 3), torch.randn(3, 5)
    x = distribute(a, mesh, [_StridedShard(0, split_factor=2)])
    out = {}
    wr = distribute(w, mesh, [Replicate()])
    with Comms() as c:
        y = torch.mm(x, wr)
    out["replicate"] = (y.placements, c.total())
    close(y.full_tensor(), a @ w)
    y = torch.mm(x, distribute(w, mesh, [Shard(1)]))  # not a replicated matrix: the rules' path
    out["sharded"] = y.placements
    close(y.full_tensor(), a @ w)
    return out


def flatten_2x2() -> dict:
    """[Shard(0), Shard(1)] of (8, 6) flattened: [Shard(0), _StridedShard(0, 4)] (the rows'
    shard first, then each rank's 4 rows' columns), as DTensor; a shard outside the merge
    ([Shard(1), Shard(2)] of (6, 4, 3) viewed (24, 3)) stays beside the strided one."""
    mesh = mesh_2d()
    torch.manual_seed(0)
    out = {}
    for name, g, spec, shape in (("S0,S1", torch.randn(8, 6), [Shard(0), Shard(1)], (48,)),
                                 ("S1,S2", torch.randn(6, 4, 3), [Shard(1), Shard(2)], (24, 3))):
        x = distribute(g, mesh, spec)
        with Comms() as c:
            y = x.reshape(shape)
        out[name] = (y.placements, c.total())
        close(y.full_tensor(), g.reshape(shape))
        close((y * 2).full_tensor(), g.reshape(shape) * 2)
    return out



def _roundtrip(cases) -> dict:
    out = {}
    for name, mesh, shape, spec, flat in cases:
        g = torch.arange(float(torch.Size(shape).numel())).view(shape)
        y = distribute(g, mesh, spec).view(flat)
        with Comms() as c:
            z = y.view(shape)
        out[name] = (z.placements, c.total())
        assert torch.equal(z.to_local(), distribute(g, mesh, spec).to_local()), name
        close((z * 2).full_tensor(), g * 2)
    return out


def unflatten_roundtrip() -> dict:
    """The flatten's _StridedShard viewed back into its dims: Shard again, nothing moved, each
    rank's local the one distribute gives the unflattened tensor (DTensor's); a split the
    strided blocks do not line up with is simplified first (the dense value either way)."""
    out = _roundtrip([("1d", _mesh(), (6, 4, 3), [Shard(1)], (24, 3))])
    g = torch.arange(36.0).view(36, 1)
    x = distribute(g, _mesh(), [_StridedShard(0, split_factor=6)])
    with Comms() as c:
        z = x.view(4, 9, 1)  # blocks of 6 rows across the 9s: not a shard of either dim
    close(z.full_tensor(), g.view(4, 9, 1))
    out["misaligned"] = (z.placements, c.total())
    return out


def unflatten_roundtrip_2x2() -> dict:
    """As unflatten_roundtrip on a 2 x 2 mesh: a strided shard beside a Shard, two strided
    shards of one dim ([_StridedShard(0, 6), _StridedShard(0, 12)]), one beside a Replicate."""
    return _roundtrip([("S1,S2", mesh_2d(), (6, 4, 4), [Shard(1), Shard(2)], (24, 4)),
                       ("S1,S2 merged", mesh_2d(), (6, 4, 4, 3), [Shard(1), Shard(2)], (96, 3)),
                       ("R,S1", mesh_2d(), (6, 4, 3), [Replicate(), Shard(1)], (24, 3))])
