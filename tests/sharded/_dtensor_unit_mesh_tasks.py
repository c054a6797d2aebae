"""PyTorch's DTensor unit tests that need a 2-D (2 x 2) mesh or a sub-mesh of several ranks
(``test_dtensor.py``, ``test_init.py``, ``test_redistribute.py``), ported to one 4-rank
world, as _dtensor_unit_core_tasks: the same body on the kit and on torch's DTensor.
Upstream's 8-rank (2, 4) meshes become (2, 2); its (2, 2, 2) mesh becomes (2, 2, 1).
"""

from __future__ import annotations

import itertools

import torch

from sharded._dtensor_unit_core_tasks import _k, _mesh, _pl, _rank, close
from sharded._dtensor_unit_redist_tasks import shard_dim_change


def _m2():
    return _mesh(torch.arange(_k()).reshape(2, _k() // 2))


def _names(placements) -> list:
    return _pl(type("P", (), {"placements": placements}))


def _in_sub(ranks, exp_in, exp_out, got):
    exp = exp_in if _rank() in ranks else exp_out
    if isinstance(exp, list):
        assert len(exp) == len(got)
        for e, g in zip(exp, got):
            close(g, e)
    elif isinstance(exp, bool):
        assert exp == got, (exp, got)
    else:
        close(got, exp)


# ---- test_dtensor.py ------------------------------------------------------------------------------
def test_shard_tensor_2d(L):
    full = torch.arange(_k()).reshape(2, _k() // 2)
    mesh = _mesh(full)
    d = L.distribute(full, mesh, [L.Shard(0), L.Shard(1)], src_data_rank=None)
    assert d.size() == torch.Size([2, _k() // 2]) and _pl(d) == ["S0", "S1"]
    assert d.to_local().item() == _rank()
    return "ok"


def test_dtensor_api_device_mesh_context_manager(L):
    w = _k()
    with _mesh() as mesh:
        d = L.T.from_local(torch.randn(3, 3), mesh, [L.Shard(0)])
    with _mesh():
        d = L.T.from_local(torch.randn(3, 3), placements=[L.Shard(0)])
        r = d.redistribute(placements=[L.Replicate()])
        assert r.size() == torch.Size([3 * w, 3])
    with _mesh():
        g = torch.randn(3 * w, 3)
        assert L.distribute(g, None, [L.Shard(0)]).to_local().shape == (3, 3)
        with _m2():
            assert L.distribute(g, None, [L.Shard(0), L.Replicate()]).to_local().shape == (3 * w // 2, 3)
        assert L.distribute(g, None, [L.Shard(0)]).to_local().shape == (3, 3)
    return "ok"


def test_dtensor_2d_mesh(L):
    mesh = _m2()
    d = L.T.from_local(torch.randn(3, 3), mesh, [L.Shard(0), L.Shard(1)])
    assert d.size() == torch.Size([3 * mesh.size(0), 3 * mesh.size(1)])
    assert d.device.type == "cpu" and d.to_local().device.type == "cpu"
    d = L.T.from_local(torch.randn(3, 3), mesh, [L.Shard(0), L.Shard(0)])
    assert d.size() == torch.Size([3 * _k(), 3])
    return "ok"


def test_device_mesh_nd(L):
    # upstream's (2, 2, 2) mesh: (2, 2, 1)
    mesh = _mesh(torch.arange(_k()).reshape(2, 2, 1))
    d = L.T.from_local(torch.randn(3, 3, 3), mesh, [L.Shard(0), L.Shard(1), L.Shard(2)])
    assert d.size() == torch.Size([6, 6, 3]) and d.to_local().device.type == "cpu"
    d = L.T.from_local(torch.randn(3, 3, 3), mesh, [L.Shard(0), L.Shard(0), L.Shard(2)])
    assert d.size() == torch.Size([12, 3, 3]) and d.device.type == "cpu"
    return "ok"


def test_dtensor_spec_local_shard_offset(L):
    # upstream compares DTensor's private compute_local_shape_and_global_offset with the
    # expected offsets; here each local is the logical tensor at that offset
    mesh = _m2()
    n = 3 * _k()
    logical = torch.randn(n, n)
    coord = mesh.get_coordinate()
    for placements in ([L.Shard(0), L.Replicate()], [L.Shard(1), L.Replicate()],
                       [L.Replicate(), L.Shard(0)], [L.Replicate(), L.Shard(1)]):
        d = L.distribute(logical, mesh, placements)
        md = 0 if placements[0].is_shard() else 1
        td = placements[md].dim
        size = n // mesh.size(md)
        want = logical.narrow(td, size * coord[md], size)
        close(d.to_local(), want)
    return "ok"


def test_from_local_sub_mesh(L):
    ranks = [0, 2]
    mesh = _mesh(ranks)
    d = L.T.from_local(torch.ones(3, 4), mesh, [L.Shard(0)])
    assert d.size() == torch.Size([6, 4])
    _in_sub(ranks, torch.ones(3, 4), torch.tensor([]), d.to_local())
    d = d + 2
    _in_sub(ranks, torch.ones(3, 4) + 2, torch.tensor([]), d.to_local())
    return "ok"


def test_default_value_sub_mesh(L):
    ranks = [0, 2]
    mesh = _mesh(ranks)
    d1 = L.T.from_local(torch.ones(4, 3), mesh, [L.Shard(0)])
    d2 = L.T.from_local(torch.ones(4, 3), mesh, [L.Shard(0)])
    _in_sub(ranks, True, True, d1.equal(d2))
    s = L.T.from_local(torch.ones(4, 3), mesh, [L.Shard(0)]).sum()
    _in_sub(ranks, torch.tensor(12.0), torch.tensor(0.0), s.to_local())
    parts = L.T.from_local(torch.ones(3, 4), mesh, [L.Shard(0)]).split([2, 2], dim=1)
    _in_sub(ranks, [torch.ones(3, 2)] * 2, [torch.tensor([])] * 2, [p.to_local() for p in parts])
    return "ok"


def test_redistribute_sub_mesh(L):
    ranks = [0, 2]
    mesh = _mesh(ranks)
    s = L.T.from_local(torch.ones(4, 3), mesh, [L.Shard(0)])
    r = s.redistribute(placements=[L.Replicate()])
    _in_sub(ranks, torch.ones(8, 3), torch.tensor([]), r.to_local())
    again = r.redistribute(placements=[L.Shard(0)])
    _in_sub(ranks, torch.ones(4, 3), torch.tensor([]), again.to_local())
    return "ok"


# ---- test_init.py ------------------------------------------------------------------------------------
def test_zeros_submesh(L):
    rank = _rank()
    # every mesh is made first (its groups are made by every rank), then the checks
    meshes = {tuple(r): _mesh(r) for r in ([0, 3], [0, 1, 3])}
    m2 = _mesh([[0], [3]])
    for ranks in ([0, 3], [0, 1, 3]):
        d = L.zeros([32, 3], device_mesh=meshes[tuple(ranks)], placements=[L.Shard(0)])
        assert d.size() == torch.Size([32, 3])
        if rank in ranks:
            rows = list(torch.zeros(32).chunk(len(ranks)))[ranks.index(rank)].numel()
            assert d.to_local().shape == (rows, 3) and torch.equal(d.to_local(), torch.zeros(rows, 3))
        else:
            assert d.to_local().shape == (0,)
    d = L.zeros([32, 3], device_mesh=m2, placements=[L.Shard(0), L.Shard(1)])
    assert d.size() == torch.Size([32, 3])
    want = torch.zeros(16, 3) if rank in (0, 3) else torch.tensor([])
    assert d.to_local().shape == want.shape and torch.equal(d.to_local(), want)
    return "ok"


# ---- test_redistribute.py ---------------------------------------------------------------------------
def test_redistribute_uneven_sharding(L):
    mesh = _m2()
    for t in (torch.randn(10, 5), torch.randn(9, 5), torch.randn(3, 5), torch.randn(1, 3)):
        for placements in ([L.Shard(0), L.Shard(0)], [L.Shard(0), L.Shard(1)]):
            close(L.distribute(t, mesh, placements).full_tensor(), t)
    return "ok"


def _shard_dim_change_2d(L, dtype):
    """The 2-D half of test_redistribute_shard_dim_change; returns the collectives per case
    (upstream's counts are for its all-to-all; the test compares the kit's with DTensor's)."""
    S = L.Shard
    pairs = [([S(0), S(1)], [S(0), S(0)]), ([S(0), S(1)], [S(1), S(0)]), ([S(0), S(0)], [S(1), S(1)])]
    extra = [([S(0), S(2)], [S(1), S(0)]), ([S(1), S(1)], [S(1), S(2)])]
    return shard_dim_change(L, _m2(), dtype, lambda x: pairs + (extra if x.ndim > 2 else []))


def test_redistribute_shard_dim_change_2d_float32(L):
    return _shard_dim_change_2d(L, torch.float32)


def test_redistribute_shard_dim_change_2d_cfloat(L):
    return _shard_dim_change_2d(L, torch.cfloat)


def _to_partial_cases(L, cases):
    """Per case "ok" (redistributed, placements as asked, value kept), "refused"
    (RuntimeError "Can not redistribute") or the error."""
    mesh = _m2()
    t = torch.randn(12, 8)
    out = {}
    for name, make in cases:
        try:
            src, dst = make(L.Partial, L.Shard, L.Replicate)
            d = L.T.from_local(t, mesh, src)
            o = d.redistribute(mesh, dst)
            assert _pl(o) == _names(dst), (name, _pl(o))
            if "prod" not in name or L.T.__name__ == "ShardedTensor":  # (DTensor cannot reduce Partial("prod"))
                close(o.full_tensor(), d.full_tensor())
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 (recorded per case; DTensor refuses Partial('prod') -> Partial('sum'))
            out[name] = "refused" if "Can not redistribute" in str(e) else f"error: {type(e).__name__}: {e}"[:200]
    return out


def test_redistribute_to_partial(L):
    return _to_partial_cases(L, [
        ("P,S0->P,S0", lambda P, S, R: ([P(), S(0)], [P(), S(0)])),
        ("P,S0->P,S1", lambda P, S, R: ([P(), S(0)], [P(), S(1)])),
        ("S0,P->R,P", lambda P, S, R: ([S(0), P()], [R(), P()])),
        ("S0,R->S0,P", lambda P, S, R: ([S(0), R()], [S(0), P()])),
        ("S0,R->R,P", lambda P, S, R: ([S(0), R()], [R(), P()])),
        ("S0,S1->R,P", lambda P, S, R: ([S(0), S(1)], [R(), P()])),
    ])


def test_redistribute_to_partial_prod(L):
    """test_redistribute_to_partial's two Partial('prod') cases."""
    return _to_partial_cases(L, [
        ("S0,Pprod->R,Pprod", lambda P, S, R: ([S(0), P("prod")], [R(), P("prod")])),
        ("S0,Pprod->R,Psum", lambda P, S, R: ([S(0), P("prod")], [R(), P("sum")])),
    ])


def test_multi_dim_mesh(L):
    # upstream's (4, 2) mesh of 8 ranks: (2, 2)
    mesh = _m2()
    full = torch.randn(16, 24) if _rank() == 0 else torch.ones(16, 24)
    poss = [L.Replicate(), L.Shard(0), L.Shard(1)]
    for inputs in itertools.product(poss + [L.Partial()], repeat=2):
        repl = [L.Replicate() if p.is_partial() else p for p in inputs]
        d = L.distribute(full, mesh, repl)
        if repl != list(inputs):
            d = L.T.from_local(d.to_local(), mesh, list(inputs), run_check=False)
        sums = 2 ** sum(p.is_partial() for p in inputs)
        for outputs in itertools.product(poss, repeat=2):
            got = d.redistribute(mesh, list(outputs)).full_tensor()
            if _rank() == 0:
                assert got.shape == full.shape
                close(got, sums * full)
    return "ok"


PORTS = {
    "test_dtensor.py": [test_shard_tensor_2d, test_dtensor_api_device_mesh_context_manager, test_dtensor_2d_mesh,
                        test_device_mesh_nd, test_dtensor_spec_local_shard_offset, test_from_local_sub_mesh,
                        test_default_value_sub_mesh, test_redistribute_sub_mesh],
    "test_init.py": [test_zeros_submesh],
    "test_redistribute.py": [test_redistribute_uneven_sharding, test_redistribute_shard_dim_change_2d_float32,
                             test_redistribute_shard_dim_change_2d_cfloat, test_redistribute_to_partial,
                             test_redistribute_to_partial_prod,
                             test_multi_dim_mesh],
}
