"""torch's ``test/distributed/tensor/test_tensor_ops.py``, second half (indexing, index_put,
slicing, split/unbind, argmax/argmin), ported to the kit and run on DTensor alike; see
_dtensor_unit_ops1_tasks for the pattern."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from sharded._dtensor_unit_ops1_tasks import _count, _is_kit, _k, _mesh, _mesh2d, _pls, _raises, _seed, close
from sharded._tp_upstream_tasks import Comms


def _test_op(L, op_call, *args):
    from sharded._dtensor_unit_ops1_tensor_tasks import _test_op as t

    return t(L, op_call, *args)


def test_index(L):
    _seed()
    r = torch.randint
    # upstream's shapes scaled down (16, 32, 16[, 12] -> 8, 8, 6[, 6]) and the sharding
    # combinations a pairwise cover (every two operands' placements meet), to fit CI's budget
    x3, x4 = (lambda: torch.randn(8, 8, 6)), (lambda: torch.randn(8, 8, 6, 6))
    cases = [
        (lambda x, y: x[y], x3(), r(5, (2, 4))),
        (lambda x, y: x.index_select(1, y), x3(), r(5, (4,))),
        (lambda x, y: x.index_select(0, y), x3(), r(5, (4,))),
        (lambda x, y: x[y], x3(), r(5, (6,))),
        (lambda x, y: x[:, y], x3(), r(5, (2, 4))),
        (lambda x, y: x[..., y], x3(), r(5, (2, 6))),
        (lambda x, y: x[..., y], x3(), r(5, (2, 4, 6))),
        (lambda x, y, z: x[z, y], x3(), r(5, (4, 2, 4)), r(2, (4, 2, 4))),
        (lambda x, y, z: x[z, :, y], x3(), r(5, (4, 2, 4)), r(2, (4, 2, 4))),
        (lambda x, y, z: x[:, z, :, y], x4(), r(5, (4, 2, 4)), r(2, (4, 2, 4))),
        (lambda x, y, z: x[:, z, :, y], x4(), r(5, (4, 2, 4)), r(2, (4, 1, 4))),
        (lambda x, y, z: x[:, z, :, y], x4(), r(5, (4, 2, 4)), r(2, (2, 4))),
        (lambda x, y, z: x[z, y, :, :], x4(), r(2, (2, 4)), r(5, (4, 2, 4))),
        (lambda x, y, z: x[z, :, y, :], x4(), r(2, (2, 4)), r(5, (4, 2, 4))),
        (lambda x, y, z: x[z, :, :, y], x4(), r(2, (2, 1)), r(5, (4, 2, 4))),
    ]
    for c in cases:
        _test_op(L, *c)
    return {}


def test_index_put_scalar(L):
    mesh = _mesh2d()
    _seed()
    gi = torch.randn(2, 4, 8)
    gx = [torch.randint(gi.shape[i], size=()) for i in range(3)]
    gv = torch.randn(size=())
    v = L.distribute(gv, mesh, [L.Replicate(), L.Replicate()])
    for i, j in itertools.product((L.Shard(0), L.Shard(1), L.Replicate()), repeat=2):
        o = torch.index_put(L.distribute(gi, mesh, [i, j]), gx, v)
        assert isinstance(o, L.T) and _pls(o) == ["R", "R"], _pls(o)
        close(o.full_tensor(), torch.index_put(gi, gx, gv))
    return {}


def test_index_put_tensor(L):
    mesh = _mesh2d()
    _seed()
    gi = torch.randn(2, 4, 8)
    gx = [torch.randint(gi.shape[0], size=())]
    gv = torch.zeros(4, 8)
    v = L.distribute(gv, mesh, [L.Shard(1), L.Replicate()])
    i = L.distribute(gi, mesh, [L.Shard(0), L.Replicate()])
    for acc in (True, False):
        o = torch.index_put(i, gx, v, acc)
        assert isinstance(o, L.T)
        assert all(p.dim in (1, 2) for p in o.placements if p.is_shard()), _pls(o)
        close(o.full_tensor(), torch.index_put(gi, gx, gv, acc))
    return {}


def test_index_put_requires_replicated_index(L):
    m = _mesh()
    _seed()
    gi, gv, idx = torch.randn(4, 8), torch.zeros(8), torch.tensor([0, 1])
    o = torch.index_put(L.distribute(gi, m, [L.Replicate()]), [L.distribute(idx, m, [L.Shard(0)])],
                        L.distribute(gv, m, [L.Replicate()]))
    close(o.full_tensor(), torch.index_put(gi, [idx], gv))
    return {}


def test_index_put_no_shard_on_indexed_dim(L):
    m = _mesh()
    _seed()
    gi, gv, gx = torch.randn(4, 8), torch.zeros(8), [torch.tensor(0)]
    o = torch.index_put(L.distribute(gi, m, [L.Shard(0)]), gx, L.distribute(gv, m, [L.Replicate()]))
    assert all(p.dim != 0 for p in o.placements if p.is_shard()), _pls(o)
    close(o.full_tensor(), torch.index_put(gi, gx, gv))
    return {}


def test_index_put_partial_numerics(L):
    m = _mesh()
    _seed()
    gi, gx, gv = torch.randn(4, 8), [torch.tensor(1)], torch.randn(8)
    i = L.T.from_local(gi / _k(), m, [L.Partial()], run_check=False)
    v = L.T.from_local(gv / _k(), m, [L.Partial()], run_check=False)
    for acc in (True, False):
        o = torch.index_put(i, gx, v, acc)
        assert isinstance(o, L.T) and _pls(o) == ["P(sum)"], _pls(o)
        close(o.full_tensor(), torch.index_put(gi, gx, gv, acc))
    return {}


def test_index_put_duplicated_indices(L):
    m = _mesh()
    gi, idx, gv = torch.zeros(4, 8), torch.tensor([1, 1, 2]), torch.ones(3, 8)
    i = L.distribute(gi, m, [L.Shard(1)])
    x = L.distribute(idx, m, [L.Replicate()])
    v = L.distribute(gv, m, [L.Shard(1)])
    for acc in (False, True):
        close(torch.index_put(i, [x], v, accumulate=acc).full_tensor(), torch.index_put(gi, [idx], gv, accumulate=acc))
    return {}


def test_where_type_promotion(L):
    _seed()
    for spec in ([L.Shard(0)], [L.Replicate()]):
        g = torch.randn(12, 8)
        mat = L.distribute(g, _mesh(), spec)
        close(torch.where(mat > 0, 1, 0).full_tensor(), torch.where(g > 0, 1, 0))
    return {}


def test_dtensor_dtype_conversion(L):
    # upstream's sharding-propagation cache counts (DTensor internals) are left out
    _seed()
    bf = L.T.from_local(torch.randn(2, 8, dtype=torch.bfloat16), _mesh(), [L.Shard(0)])
    assert bf.dtype == bf.to_local().dtype == torch.bfloat16
    f = bf.float()
    assert f.dtype == f.to_local().dtype == torch.float32
    b1 = f.type_as(bf)
    assert b1.dtype == b1.to_local().dtype == torch.bfloat16
    close(b1.full_tensor(), bf.full_tensor())
    return {}


def test_slice(L):
    m = _mesh()
    _seed()
    g = torch.randn(8, 16, requires_grad=True)
    s = L.distribute(g.detach(), m, [L.Shard(1)]).requires_grad_(True)
    want = g[:, 8:]
    with Comms() as c:
        so = s[:, 8:]
    out = {"fwd": _count(L, c, 1, "fwd")}
    want.backward(gradient=torch.ones_like(want))
    with Comms() as c:
        so.backward(gradient=L.ones(so.shape, device_mesh=m, placements=[L.Shard(1)]))
    out["bwd"] = _count(L, c, 1, "bwd")
    close(so.full_tensor(), want)
    close(s.grad.full_tensor(), g.grad)
    return out


def test_slice_full_size_on_sharded_dim(L):
    _seed()
    g = torch.randn(2, 4)
    s = L.distribute(g, _mesh(), [L.Shard(1)])
    for f in (lambda t: t[:, :2], lambda t: t[:, 2:], lambda t: t[:, :4], lambda t: t[:, :8], lambda t: t[:2, :]):
        close(f(s).full_tensor(), f(g))
    return {}


def test_split_on_partial(L):
    """run_subtests over reduce_op x split_size x split_dim."""
    m = _mesh()
    n = 0
    for op, size, dim in itertools.product(("sum", "avg", "product", "min", "max"), (2, 3, 4), (0, 1)):
        _seed(dist.get_rank())
        pd = L.T.from_local(torch.randn(8, 8), m, [L.Partial(op)])
        want = torch.split(pd.full_tensor().detach().clone(), size, dim=dim)
        got = torch.split(pd, size, dim=dim)
        close([g.full_tensor() for g in got], list(want))
        n += 1
    return {"subtests": n}


def test_unbind(L):
    _seed()
    t = torch.randn(4, 8, requires_grad=True)
    out = {}
    for sd, ud in itertools.product((0, 1), (0, 1)):
        d = L.distribute(t.detach(), _mesh(), (L.Shard(sd),))
        if sd == ud and not _is_kit(L):
            assert "Sharding propagation failed" in _raises(lambda: d.unbind(dim=ud))
            continue
        # the kit (documented): unbind along the sharded dim gathers it and gives the dense parts
        with Comms() as c:
            parts = d.unbind(dim=ud)
        out[f"{sd},{ud}"] = c.total()
        if sd != ud:
            ns = sd if sd < ud else sd - 1
            assert all(_pls(e) == [f"S{ns}"] for e in parts), [_pls(e) for e in parts]
        for x, y in zip(parts, t.unbind(dim=ud)):
            close(x.full_tensor(), y)
    return out


_SAMPLE = [[0, 2, 1, 11, 5, 9, -2, -23], [3, 5, 7, 9, 0, -1, 4, 2], [8, 4, 6, -5, -10, 12, 7, 1],
           [13, 6, 9, -5, 0, 4, 2, 8], [4, 9, 2, 1, -6, -3, 5, 7], [0, -4, -2, 8, 6, 3, 12, -7],
           [20, 6, -3, 1, -8, 4, 2, 0], [5, 9, 11, -1, -4, 2, 3, 8]]


def test_argmax_argmin_with_placements(L):
    mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
    t = torch.tensor(_SAMPLE)
    for pls in ([L.Partial(), L.Shard(1)], [L.Partial(), L.Shard(0)], [L.Shard(0), L.Shard(1)],
                [L.Replicate(), L.Shard(0)], [L.Replicate(), L.Shard(1)]):
        d = L.distribute(t, mesh, pls)
        for op in (torch.argmax, torch.argmin):
            close(op(d, dim=1).full_tensor(), op(t, dim=1))
    return {}
