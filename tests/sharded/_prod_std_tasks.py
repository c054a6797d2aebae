"""2-rank checks of ``Partial('product')`` and of ``var``/``std`` over a shard in one
collective (test_prod_std.py): values against the dense computation, collective counts
against torch's DTensor on the same mesh."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.tensor as dt
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

import subclass_kit.sharded as sk
from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close


def _mesh():
    return DeviceMesh("cpu", torch.arange(dist.get_world_size()))


def _locals(*shape, dtype=torch.float64):
    # Every rank draws every rank's operand: the dense product is known everywhere.
    g = torch.Generator().manual_seed(7)
    return [torch.rand(*shape, generator=g, dtype=dtype) + 0.5 for _ in range(dist.get_world_size())]


def partial_product():
    """Reduction, reduce-scatter, Replicate -> Partial('product'), and the rules that must
    reduce a product first (add, a replicated factor, a pad value other than 1)."""
    mesh, r = _mesh(), dist.get_rank()
    xs = _locals(4, 3)
    dense = xs[0] * xs[1]
    p = sk.ShardedTensor.from_local(xs[r], mesh, [sk.Partial("prod")])
    assert p.placements == (sk.Partial("product"),)
    close(p.full_tensor(), dense)
    with Comms() as c:
        s = p.redistribute(mesh, [sk.Shard(0)])
    assert dict(c.counts) == {"reduce_scatter_tensor": 1}, c.counts
    close(s.full_tensor(), dense)
    rep = sk.distribute(dense, mesh, [sk.Replicate()])
    for q in (rep.redistribute(mesh, [sk.Partial("product")]), sk.distribute(dense, mesh, [sk.Partial("product")])):
        assert q.placements == (sk.Partial("product"),)
        close(q.full_tensor(), dense)
    c3 = torch.full((4, 3), 3.0, dtype=torch.float64)
    close((p + p).full_tensor(), 2 * dense)
    close((p * sk.distribute(c3, mesh, [sk.Replicate()])).full_tensor(), dense * 3)
    close((p * 3.0).full_tensor(), dense * 3)
    one, two = F.pad(p, (1, 1), value=1.0), F.pad(p, (1, 1), value=2.0)
    assert one.placements == (sk.Partial("product"),) and two.placements == (sk.Replicate(),)
    close(one.full_tensor(), F.pad(dense, (1, 1), value=1.0))
    close(two.full_tensor(), F.pad(dense, (1, 1), value=2.0))
    close(torch.cat([p, rep]).full_tensor(), torch.cat([dense, dense]))
    close(torch.split(p, 2, 1)[1].full_tensor(), dense[:, 2:])
    return "ok"


def prod_over_a_shard():
    """``prod`` over a sharded dim is a ``Partial('product')`` with no collective, as DTensor."""
    mesh = _mesh()
    x = _locals(6, 5)[0]
    counts = {}
    for lib, mod in (("kit", sk), ("dtensor", dt)):
        d = mod.distribute_tensor(x, mesh, [mod.Shard(0)]) if lib == "dtensor" else sk.distribute(x, mesh, [sk.Shard(0)])
        with Comms() as c:
            a, b, e = d.prod(0), d.prod(), d.prod(1, keepdim=True)
        close(a.full_tensor(), x.prod(0))
        close(b.full_tensor(), x.prod())
        close(e.full_tensor(), x.prod(1, keepdim=True))
        counts[lib] = (c.total(), [str(t.placements[0]) for t in (a, b, e)])
    assert counts["kit"][0] <= counts["dtensor"][0], counts
    assert counts["kit"][1][:2] == ["Partial('product')"] * 2, counts
    return counts


def run():
    return {f.__name__: f() for f in (partial_product, prod_over_a_shard)}
