"""PyTorch's DTensor unit tests, ``test_redistribute.py`` (``RedistributeTest``), the 2-rank
ports, as _dtensor_unit_core_tasks: the same body on the kit and on torch's DTensor, the
collectives counted on both (``Comms``; upstream's ``CommDebugMode`` counts are asserted on
both). Parametrized tests: one port per parameter (``[float32]``, ``[cfloat]``).

Replicate -> Partial: DTensor refuses it in ``redistribute`` and does it through its private
``Redistribute.apply``; the kit allows it in ``redistribute`` (docs/sharded.md, "Where it
differs from DTensor"), so the ports move to Partial through ``_to_partial``.
"""

from __future__ import annotations

import torch

from sharded._dtensor_unit_core_tasks import _is_dt, _k, _mesh, _pl, _rank, close
from sharded._tp_upstream_tasks import Comms

AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"

SKIPPED = {
    "test_all_gather_view_optimization_batch1": "DTensor's private op choice (view vs split+cat, via DebugMode) "
                                                "on a 200 MB tensor",
    "test_all_gather_no_optimization_gather_dim_not_1": "as test_all_gather_view_optimization_batch1",
    "test_all_gather_split_cat_fallback_batch_gt_1": "as test_all_gather_view_optimization_batch1",
    "test_shard_dim_alltoall (float32, cfloat)": "DTensor's private shard_dim_alltoall collective helper",
    "test_redistribute_shard_dim_multi_dim_mesh": "a (2, 2, 2) mesh: 8 ranks",
    "DistributeWithDeviceOrderTest (8 of its 9 tests)": "DTensor's private shard_order / redistribute_cost / "
                                                        "_StridedShard API, 8 ranks (its "
                                                        "test_redistribute_partial_to_different_partial_not_supported "
                                                        "is ported through the public redistribute)",
    "TransformInfoTest.test_comm_type_key": "DTensor's private _TransformInfo",
    "OptimizeFlattenedReductionsTest (8 tests)": "DTensor's private _optimize_transform_infos (fake PG)",
    "MultiDimRedistributeOptimizationTest.test_multi_dim_redistribute": "8 ranks; flattened-mesh merging",
    "FlattenedReductionIntegrationTest.test_merging_reductions": "8 ranks; flattened-mesh merging",
}


def _sizes():
    w = _k()
    return [((w * 3, 3), 0), ((w * 3 + 1, 3), 0), ((w * 3 + 2, 3), 0),
            ((3, w * 3), 1), ((3, w * 3 + 1), 1), ((3, w * 3 + 2), 1)]


def _to_partial(L, d, mesh, placements):
    if _is_dt(L):
        from torch.distributed.tensor._redistribute import Redistribute

        cfg = {"op_dtype": d.dtype, "out_dtype": d.dtype,
               "backward_options": {"op_dtype": d.dtype, "out_dtype": d.dtype}}
        return Redistribute.apply(d, mesh, placements, False, cfg)
    return d.redistribute(mesh, placements)


def _shard_to_replicate(L, dtype):
    mesh = _mesh()
    for size, sd in _sizes():
        want = torch.randn(size, requires_grad=True, dtype=dtype)
        d = L.distribute(want, mesh, [L.Shard(sd)])
        with Comms() as c:
            r = d.redistribute(mesh, [L.Replicate()])
        assert r.size() == torch.Size(size)
        close(want, r.to_local())
        assert c.counts[AG] == 1, dict(c.counts)
        with Comms() as c:
            r.backward(torch.ones_like(r))
        assert _pl(d.grad) == [f"S{sd}"] and c.total() == 0, (_pl(d.grad), dict(c.counts))
        close(d.grad.to_local(), torch.ones(d.to_local().size(), dtype=dtype))
    return "ok"


def test_shard_to_replicate_forward_backward_float32(L):
    return _shard_to_replicate(L, torch.float32)


def test_shard_to_replicate_forward_backward_cfloat(L):
    return _shard_to_replicate(L, torch.cfloat)


def test_replicate_to_replicate_forward_backward(L):
    mesh = _mesh()
    local = torch.randn(12, 3, requires_grad=True)
    d = L.distribute(local, mesh, [L.Replicate()])
    with Comms() as c:
        r = d.redistribute(mesh, [L.Replicate()])
    assert d.size() == local.size() and c.total() == 0
    close(d.full_tensor(), r.full_tensor())
    with Comms() as c:
        r.backward(torch.ones_like(r))
    assert _pl(d.grad) == ["R"] and c.total() == 0
    close(d.grad.to_local(), torch.ones(12, 3))
    return "ok"


def _partial_to_partial(L, dtype):
    mesh = _mesh()
    local = torch.ones(12, 3, requires_grad=True, dtype=dtype)
    d = L.distribute(local, mesh, [L.Partial()])
    with Comms() as c:
        r = d.redistribute(mesh, [L.Partial()])
    assert d.size() == local.size() and c.total() == 0
    close(d.to_local(), r.to_local())
    grad = L.T.from_local(torch.ones(12, 3, dtype=dtype), mesh, [L.Partial()])
    with Comms() as c:
        r.backward(grad)
    assert _pl(d.grad) == ["P"] and c.total() == 0
    close(d.grad.to_local(), torch.ones(12, 3, dtype=dtype))
    return "ok"


def test_partial_to_partial_forward_backward_float32(L):
    return _partial_to_partial(L, torch.float32)


def test_partial_to_partial_forward_backward_cfloat(L):
    return _partial_to_partial(L, torch.cfloat)


def _replicate_to_local_partial_grad(L, dtype):
    d = L.distribute(torch.randn(12, 3, requires_grad=True, dtype=dtype), _mesh(), [L.Replicate()])
    with Comms() as c:
        out = d.redistribute(placements=[L.Replicate()]).to_local(grad_placements=[L.Partial()])
        out.backward(torch.ones_like(out))
    assert c.total() == 1 and c.counts[AR] == 1, dict(c.counts)
    return "ok"


def test_replicate_to_local_partial_grad_float32(L):
    return _replicate_to_local_partial_grad(L, torch.float32)


def test_replicate_to_local_partial_grad_cfloat(L):
    return _replicate_to_local_partial_grad(L, torch.cfloat)


def test_replicate_to_shard_forward_backward(L):
    mesh = _mesh()
    for size, sd in _sizes():
        rep = torch.randn(size, requires_grad=True)
        mine = list(torch.chunk(rep, _k(), dim=sd))[_rank()]
        d = L.distribute(rep, mesh, [L.Replicate()])
        with Comms() as c:
            s = d.redistribute(mesh, [L.Shard(sd)])
        assert s.size() == d.size() and _pl(s) == [f"S{sd}"] and c.total() == 0
        close(s.to_local(), mine)
        with Comms() as c:
            s.backward(torch.ones_like(s))
        assert _pl(d.grad) == ["R"] and c.total() == 1 and c.counts[AG] == 1, dict(c.counts)
        close(d.grad.to_local(), torch.ones(size))
    return "ok"


def _partial_to_replicate(L, dtype):
    mesh = _mesh()
    local = torch.ones(12, 3, requires_grad=True, dtype=dtype)
    p = L.T.from_local(local, mesh, [L.Partial()])
    with Comms() as c:
        r = p.redistribute(mesh, [L.Replicate()])
    assert p.size() == local.size() and c.counts[AR] == 1, dict(c.counts)
    close(local * _k(), r.to_local())
    with Comms() as c:
        r.backward(torch.ones_like(r))
    assert local.grad is not None and local.grad.size() == local.size() and c.total() == 0
    close(local.grad, torch.ones_like(local, dtype=dtype))
    return "ok"


def test_partial_to_replicate_forward_backward_float32(L):
    return _partial_to_replicate(L, torch.float32)


def test_partial_to_replicate_forward_backward_cfloat(L):
    return _partial_to_replicate(L, torch.cfloat)


_DTYPES = list(zip([torch.bfloat16, torch.bfloat16, torch.float32, torch.float32, torch.bfloat16, torch.float32,
                    None, None],
                   [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32, None, None, torch.bfloat16,
                    torch.float32]))


def test_replicate_to_replicate_forward_backward_datatype_conversion(L):
    mesh = _mesh()
    for fwd, bwd in _DTYPES:
        local = torch.randn(12, 3, requires_grad=True)
        d = L.distribute(local, mesh, [L.Replicate()])
        with Comms() as c:
            r = d.redistribute(mesh, [L.Replicate()], forward_dtype=fwd, backward_dtype=bwd)
        assert d.size() == local.size() and c.total() == 0
        close(d.to(fwd).full_tensor(), r.full_tensor())
        with Comms() as c:
            r.backward(torch.ones_like(r))
        assert _pl(d.grad) == ["R"] and c.total() == 0
        close(d.grad.to_local(), torch.ones(12, 3))
    return "ok"


def test_shard_to_replicate_forward_backward_datatype_conversion(L):
    mesh = _mesh()
    for fwd, bwd in _DTYPES:
        for size, sd in _sizes():
            want = torch.randn(size, requires_grad=True)
            d = L.distribute(want, mesh, [L.Shard(sd)])
            with Comms() as c:
                r = d.redistribute(mesh, [L.Replicate()], forward_dtype=fwd, backward_dtype=bwd)
            assert r.size() == torch.Size(size) and c.counts[AG] == 1, dict(c.counts)
            close(want.to(fwd), r.to_local())
            with Comms() as c:
                r.backward(torch.ones_like(r))
            assert _pl(d.grad) == [f"S{sd}"] and c.total() == 0
            close(d.grad.to_local(), torch.ones(d.to_local().size()))
    return "ok"


def test_replicate_to_partial(L):
    """The value on the mesh (the sum of the operands) is the replicated one, with no
    communication, on the 1-D mesh and on the (k/2, 2) mesh's sub-groups. Returns rank 0's
    local / the value (DTensor: 1/k; the kit: 1, the other ranks holding 0)."""
    mesh = _mesh()
    local = torch.randn(12, 3, requires_grad=True)
    r = L.distribute(local, mesh, [L.Replicate()])
    refused = None
    try:
        r.redistribute(mesh, [L.Partial()])
        refused = False
    except RuntimeError as e:
        refused = "Can not redistribute" in str(e)
    with Comms() as c:
        p = _to_partial(L, r, mesh, [L.Partial()])
    assert p.size() == local.size() and c.total() == 0 and _pl(p) == ["P"]
    close(p.full_tensor(), r.to_local())
    share = (p.to_local() / r.to_local()).mean().item()
    m2 = _mesh(torch.arange(_k()).reshape(_k() // 2, 2))
    r2 = L.distribute(torch.randn(12, 3), m2, [L.Replicate(), L.Replicate()])
    with Comms() as c:
        p2 = _to_partial(L, r2, m2, [L.Partial(), L.Partial()])
    assert p2.size() == r2.size() and c.total() == 0
    close(p2.full_tensor(), r2.to_local())
    return {"refused": refused, "rank share": round(share, 4) if _rank() == 0 else None}


def _partial_to_shard(L, dtype):
    mesh = _mesh()
    w = _k()
    for size, sd in _sizes():
        p = L.T.from_local(torch.ones(size, dtype=dtype), mesh, [L.Partial()], run_check=False)
        chunk = (size[sd] + w - 1) // w
        shape = list(size)
        shape[sd] = max(min(size[sd], chunk * (_rank() + 1)) - chunk * _rank(), 0)
        with Comms() as c:
            s = p.redistribute(mesh, [L.Shard(sd)])
        assert s.size() == p.size() and _pl(s) == [f"S{sd}"]
        close(s.to_local(), torch.ones(shape, dtype=dtype) * w)
        assert c.counts[RS] == 1, dict(c.counts)
    return "ok"


def test_partial_to_shard_float32(L):
    return _partial_to_shard(L, torch.float32)


def test_partial_to_shard_cfloat(L):
    return _partial_to_shard(L, torch.cfloat)


def test_redistribute_negative_shard_dim(L):
    mesh = _mesh()
    s = L.distribute(torch.randn(12, 3, requires_grad=True), mesh, [L.Shard(1)])
    assert s.placements[0].dim == 1
    assert s.redistribute(mesh, [L.Shard(-1)]).placements[0].dim == 1
    return "ok"


def shard_dim_change(L, mesh, dtype, pairs_for) -> dict:
    """test_redistribute_shard_dim_change's loop: each (src, dst) placements pair that
    ``pairs_for(x)`` gives, on upstream's five shapes; the placements and locals equal a
    direct ``distribute`` to dst. Returns the collectives per case."""
    counts = {}
    for shape in ((8, 8), (8, 8, 8), (8, 5), (5, 8), (5, 5)):
        x = torch.randn(shape, dtype=dtype)
        for src, dst in pairs_for(x):
            want = L.distribute(x.clone(), mesh, dst)
            d = L.distribute(x, mesh, src)
            with Comms() as c:
                out = d.redistribute(mesh, dst)
            assert _pl(out) == _pl(want)
            close(out.to_local(), want.to_local())
            counts[f"{shape} {_pl(d)}->{_pl(out)}"] = c.total()
    return counts


def _shard_dim_change_1d(L, dtype):
    """The 1-D half of test_redistribute_shard_dim_change (the 2-D half: the 4-rank ports;
    upstream: one all-gather on CPU)."""
    S = L.Shard
    return shard_dim_change(L, _mesh(), dtype, lambda x: [([S(0)], [S(1)]), ([S(1)], [S(0)])])


def test_redistribute_shard_dim_change_1d_float32(L):
    return _shard_dim_change_1d(L, torch.float32)


def test_redistribute_shard_dim_change_1d_cfloat(L):
    return _shard_dim_change_1d(L, torch.cfloat)


def test_one_chunk_mesh(L):
    # upstream's (4, 1) mesh: (k, 1)
    mesh = _mesh(torch.arange(_k()).reshape(_k(), 1))
    for src in (L.Shard(1), L.Replicate(), L.Partial()):
        for dst in (L.Shard(0), L.Shard(1), L.Replicate()):
            d = L.T.from_local(torch.randn(16, 8), mesh, [L.Shard(0), src])
            with Comms() as c:
                out = d.redistribute(mesh, [L.Shard(0), dst])
            assert c.total() == 0, (src, dst, dict(c.counts))
            assert _pl(out) == _pl(type("P", (), {"placements": [L.Shard(0), dst]}))
    return "ok"


def test_redistribute_partial_to_different_partial_not_supported(L):
    """Upstream calls DTensor's private redistribute_local_tensor(Partial('sum') ->
    Partial('avg')) and expects an error; through the public redistribute: returns whether
    it raised, or the value if it did not."""
    mesh = _mesh()
    p = L.T.from_local(torch.randn(4, 4), mesh, [L.Partial("sum")])
    try:
        out = p.redistribute(mesh, [L.Partial("avg")])
    except (RuntimeError, AssertionError, ValueError) as e:
        return f"raised {type(e).__name__}"
    close(out.full_tensor(), p.full_tensor())
    return "value kept"


PORTS = [
    test_shard_to_replicate_forward_backward_float32, test_shard_to_replicate_forward_backward_cfloat,
    test_replicate_to_replicate_forward_backward,
    test_partial_to_partial_forward_backward_float32, test_partial_to_partial_forward_backward_cfloat,
    test_replicate_to_local_partial_grad_float32, test_replicate_to_local_partial_grad_cfloat,
    test_replicate_to_shard_forward_backward,
    test_partial_to_replicate_forward_backward_float32, test_partial_to_replicate_forward_backward_cfloat,
    test_replicate_to_replicate_forward_backward_datatype_conversion,
    test_shard_to_replicate_forward_backward_datatype_conversion,
    test_replicate_to_partial, test_partial_to_shard_float32, test_partial_to_shard_cfloat,
    test_redistribute_negative_shard_dim, test_redistribute_shard_dim_change_1d_float32,
    test_redistribute_shard_dim_change_1d_cfloat, test_one_chunk_mesh,
    test_redistribute_partial_to_different_partial_not_supported,
]
