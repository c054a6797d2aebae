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


def var_std_one_collective():
    """var/std/var_mean/std_mean over a shard (even and uneven, a large common offset that a
    sum-of-squares form would lose in float32): values equal dense, collectives no more than
    DTensor's, the rows never gathered (the kit's largest message is the statistics')."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(3)
    base = torch.randn(15, 5, generator=g)  # uneven: 8 + 7 rows
    counts = {}
    for name, x in (("plain", base), ("offset", base * 0.01 + 1e4)):
        for lib, mod in (("kit", sk), ("dtensor", dt)):
            d = sk.distribute(x, mesh, [sk.Shard(0)]) if lib == "kit" else dt.distribute_tensor(x, mesh, [dt.Shard(0)])
            with Comms() as c:
                v, s = torch.var(d, 0), torch.std(d, dim=(0, 1), correction=0)
                vm, sm = torch.var_mean(d, 0, keepdim=True), torch.std_mean(d, 0)
            # the kit against float64: at 1e4 float32's own dense std is 1.3% off (the kit's
            # 0.1%), a float32 sum-of-squares form has no correct digit left; DTensor gathers
            # the rows and runs the dense float32 op
            kit_offset = lib == "kit" and name == "offset"
            x64, tol = (x.double(), {"rtol": 5e-3, "atol": 1e-6}) if kit_offset else (x, {})

            def want(f, *a, **k):
                r = f(x64, *a, **k)
                return tuple(t.float() for t in r) if isinstance(r, tuple) else r.float()

            close(v.full_tensor(), want(torch.var, 0), **tol)
            close(s.full_tensor(), want(torch.std, dim=(0, 1), correction=0), **tol)
            for got, w in ((vm, want(torch.var_mean, 0, keepdim=True)), (sm, want(torch.std_mean, 0))):
                close(got[0].full_tensor(), w[0], **tol)
                close(got[1].full_tensor(), w[1])
            counts[(name, lib)] = (c.total(), c.largest["all_gather_into_tensor"])
        assert counts[(name, "kit")][0] <= counts[(name, "dtensor")][0], counts
    # the kit sends the statistics (4 x 5), not the rows (8 x 5) as DTensor
    assert counts[("plain", "kit")][1] == 4 * 5 < counts[("plain", "dtensor")][1], counts
    return {str(k): v for k, v in counts.items()}


def run():
    return {f.__name__: f() for f in (partial_product, prod_over_a_shard, var_std_one_collective)}
