"""torch's ``test/distributed/tensor/test_math_ops.py`` (DistMathOpsTest), second half:
topk, svd, norms and distances, foreach over meshes, cumulative and partial reductions;
ported to the kit and run on DTensor alike (see _dtensor_unit_ops1_tasks for the pattern)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from sharded import _dtensor_unit_ops1_math_tasks as m1
from sharded._dtensor_unit_ops1_tasks import _count, _is_kit, _k, _mesh, _pls, _raises, _seed, close
from sharded._tp_upstream_tasks import Comms


def test_topk(L):
    mesh = _mesh()
    _seed()
    tensor = torch.randn(12, 8, 8, requires_grad=True)
    global_topk = tensor.topk(3, dim=0)
    out = {}
    for pl in (L.Shard(0), L.Shard(1), L.Shard(2), L.Replicate()):
        d = L.distribute(tensor.detach(), mesh, (pl,))
        with Comms() as c:
            out_dt = d.topk(3, dim=0)
        case = _pls(d)[0]
        out[case] = _count(L, c, 1, case) if case == "S0" else c.total()
        close(out_dt.values.full_tensor(), global_topk.values)
    return out


def test_shard0_svd(L):
    mesh = _mesh()
    torch.manual_seed(42)
    x = torch.randn(8, 8)
    sx = L.distribute(x, mesh, (L.Shard(0),))
    with Comms() as c:
        U, S, V = torch.linalg.svd(sx, full_matrices=False)
    for got, want in zip((U, S, V), torch.linalg.svd(x, full_matrices=False)):
        close(got.to_local(), want)
    assert set(c.counts) <= {"all_gather_into_tensor"}
    return {"svd": _count(L, c, 1, "svd")}


def test_vector_norm(L):
    _seed()
    grad = torch.randn(12, 8)
    sg = L.distribute(grad, _mesh(), [L.Shard(0)])
    close(torch.ops.aten.linalg_vector_norm(sg, 2).full_tensor(), torch.ops.aten.linalg_vector_norm(grad, 2))
    return {}


def test_vector_norm_partial(L):
    rank, k = dist.get_rank(), _k()
    local = torch.tensor([rank, 1], dtype=torch.float32)
    full = torch.tensor([sum(range(k)), k], dtype=torch.float32)
    pg = L.T.from_local(local, _mesh(), [L.Partial()])
    close(torch.ops.aten.linalg_vector_norm(pg, 2).full_tensor(), torch.ops.aten.linalg_vector_norm(full, 2))
    return {}


def test_dist(L):
    mesh = _mesh()
    _seed()
    a, b = torch.randn(12, 8), torch.randn(12, 8)
    for p in (1, 2, float("inf")):
        ref = torch.dist(a, b, p)
        d = torch.dist(L.distribute(a, mesh, [L.Shard(0)]), L.distribute(b, mesh, [L.Shard(0)]), p)
        # the kit (documented): p = 1 / inf give Partial('sum') / ('max'), another p gathers
        want_partial = not _is_kit(L) or p in (1, float("inf"))
        assert d.placements[0].is_partial() == want_partial, (p, _pls(d))
        close(d.full_tensor(), ref)
        r = torch.dist(L.distribute(a, mesh, [L.Replicate()]), L.distribute(b, mesh, [L.Replicate()]), p)
        close(r.full_tensor(), ref)
    c, dd = torch.randn(12, 8), torch.randn(12, 8)
    pc = L.distribute(c, mesh, [L.Shard(0)]).sum(dim=0, keepdim=True)
    pd = L.distribute(dd, mesh, [L.Shard(0)]).sum(dim=0, keepdim=True)
    assert pc.placements[0].is_partial() and pd.placements[0].is_partial()
    close(torch.dist(pc, pd, 2).full_tensor(), torch.dist(pc.full_tensor(), pd.full_tensor(), 2))
    return {}


def test_foreach_norm(L):
    _seed()
    g0, g1 = torch.randn(12, 8), torch.randn(8, 8)
    mesh = _mesh()
    s = torch.ops.aten._foreach_norm([L.distribute(g0, mesh, [L.Shard(0)]), L.distribute(g1, mesh, [L.Shard(0)])], 2)
    for o, so in zip(torch.ops.aten._foreach_norm([g0, g1], 2), s):
        close(so.full_tensor(), o)
    return {}


def test_foreach_norm_partial(L):
    rank, k = dist.get_rank(), _k()
    l0 = torch.tensor([rank, 1], dtype=torch.float32)
    l1 = torch.tensor([rank + 1, 2], dtype=torch.float32)
    g0 = torch.tensor([sum(range(k)), k], dtype=torch.float32)
    g1 = torch.tensor([sum(range(k)) + k, 2 * k], dtype=torch.float32)
    mesh = _mesh()
    po = torch.ops.aten._foreach_norm([L.T.from_local(l0, mesh, [L.Partial()]), L.T.from_local(l1, mesh, [L.Partial()])], 2)
    for o, p in zip(torch.ops.aten._foreach_norm([g0, g1], 2), po):
        close(p.full_tensor(), o)
    return {}


def _mesh_xy():
    m = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("x", "y"))
    return m["x"], m["y"]


def test_foreach_norm_different_mesh(L):
    mesh_x, mesh_y = _mesh_xy()
    _seed()
    g0, g1 = torch.randn(12, 8), torch.randn(8, 8)
    n0, n1 = torch.ops.aten._foreach_norm([L.T.from_local(g0, mesh_x, [L.Replicate()]),
                                          L.T.from_local(g1, mesh_y, [L.Replicate()])], 2)
    assert n0.device_mesh == mesh_x and n1.device_mesh == mesh_y
    close(n0.full_tensor(), g0.norm())
    close(n1.full_tensor(), g1.norm())
    return {}


def test_foreach_add_different_mesh(L):
    mesh_x, mesh_y = _mesh_xy()
    i00, i01, i10, i11 = torch.ones(4, 8) * 2, torch.ones(8, 8) * 3, torch.ones(4, 8) * 4, torch.ones(8, 8) * 3
    r00 = L.T.from_local(i00, mesh_x, [L.Shard(0)])
    r01 = L.T.from_local(i01, mesh_x, [L.Replicate()])
    r10 = L.T.from_local(i10, mesh_y, [L.Shard(0)])
    r11 = L.T.from_local(i11, mesh_y, [L.Replicate()])
    o0, o1 = torch.ops.aten._foreach_add([r00, r10], [r01, r11])
    assert o0.device_mesh == mesh_x and o1.device_mesh == mesh_y
    close(o0.full_tensor(), r00.full_tensor() + i01)
    close(o1.full_tensor(), r10.full_tensor() + i11)
    # operands of one position on different meshes: DTensor's RuntimeError, the kit's MeshError
    msg = _raises(lambda: torch.ops.aten._foreach_add([r00, r01], [r10, r11]), ValueError if _is_kit(L) else RuntimeError)
    if not _is_kit(L):
        assert "Sharding propagation failed" in msg, msg
    return {}


def test_linalg_eigh(L):
    _seed()
    A = torch.randn(2, 2, dtype=torch.float64)
    dA = L.distribute(A, _mesh(), [L.Replicate()])
    dA = dA + dA.mT
    dL, dQ = torch.linalg.eigh(dA)
    rec = dQ @ torch.diag(dL) @ dQ.mT
    close(torch.dist(rec, dA).full_tensor().item(), 0.0)
    return {}


def test_upsampling(L):
    inp = torch.arange(1, 5, dtype=torch.float32).view(1, 1, 2, 2)
    d = L.distribute(inp, _mesh(), [L.Shard(0)])
    for m in (torch.nn.UpsamplingBilinear2d(scale_factor=2), torch.nn.UpsamplingNearest2d(scale_factor=2),
              torch.nn.Upsample(scale_factor=2, mode="bicubic")):
        close(m(d).full_tensor(), m(inp))
    return {}


def _gather_dim_or_keep(L, fn, name):
    mesh = _mesh()
    _seed()
    inp = torch.rand(3, 5)
    d = L.distribute(inp, mesh, [L.Shard(0)])
    out = {}
    for dim in (0, 1):
        with Comms() as c:
            o = fn(d, dim=dim)
        if dim == 0:
            out[f"{name} {dim}"] = _count(L, c, 1, name)
            assert _pls(o) == ["R"], _pls(o)
        else:
            out[f"{name} {dim}"] = _count(L, c, 0, name)
            assert _pls(o) == ["S0"], _pls(o)
        close(o.full_tensor(), fn(inp, dim=dim))
    return out


def test_cumsum(L):
    return _gather_dim_or_keep(L, torch.cumsum, "cumsum")


def test_logsumexp(L):
    return _gather_dim_or_keep(L, torch.logsumexp, "logsumexp")


def test_conj_complex_dtensor(L):
    _seed()
    f = torch.randn(1, 1, dtype=torch.complex64)
    fd = L.distribute(f, _mesh(), [L.Replicate()])
    with Comms() as c:
        r = fd.conj() + 1
    close(r.full_tensor(), f.conj() + 1)
    return {"conj": _count(L, c, 0)}


def test_rotary_embedding_complex_ops(L):
    mesh = _mesh()
    _seed()

    def apply_rotary_emb(xq, freqs_cis):
        return torch.view_as_real(torch.view_as_complex(xq) * freqs_cis)

    xq = torch.randn(1, 1, 2, requires_grad=True)
    f = torch.randn(1, 1, dtype=torch.complex64)
    xq_dt = L.distribute(xq.detach(), mesh, [L.Replicate()]).requires_grad_(True)
    f_dt = L.distribute(f, mesh, [L.Replicate()])
    with Comms() as c:
        apply_rotary_emb(xq_dt, f_dt).sum().backward()
    apply_rotary_emb(xq, f).sum().backward()
    close(xq_dt.grad.full_tensor(), xq.grad)
    return {"rotary": _count(L, c, 0)}


def test_histc(L):
    mesh = _mesh()
    _seed()
    tensor = torch.randn(12, 8, 8)
    out = {}
    for mm in (True, False):
        for pl in (L.Shard(0), L.Shard(1), L.Shard(2), L.Replicate()):
            lo, hi = tensor.min().item(), tensor.max().item()
            want = tensor.histc(min=lo, max=hi) if mm else tensor.histc()
            d = L.distribute(tensor, mesh, (pl,))
            with Comms() as c:
                got = d.histc(min=lo, max=hi) if mm else d.histc()
            case = f"{mm},{_pls(d)[0]}"
            out[case] = _count(L, c, 1 if pl.is_shard() and not mm else 0, case)
            close(got.full_tensor(), want)
    return out


def test_partial_reduction_ops(L):
    mesh = _mesh()
    torch.manual_seed(dist.get_rank())
    for fn in (torch.norm, torch.max, torch.min):
        dt = L.T.from_local(torch.rand(3), mesh, [L.Partial("sum")])
        a = fn(dt)
        b = fn(dt.redistribute(mesh, [L.Replicate()]))
        close(a.full_tensor(), b.full_tensor())
    return {}


def test_matching_partial_reduction_ops(L):
    mesh = _mesh()
    torch.manual_seed(dist.get_rank())
    dt = L.T.from_local(torch.rand(3), mesh, [L.Partial("max")])
    a = torch.max(dt)
    b = torch.max(dt.redistribute(mesh, [L.Replicate()]))
    assert _pls(a) == ["P(max)"] and _pls(b) == ["R"], (_pls(a), _pls(b))
    close(a.full_tensor(), b.full_tensor())
    return {}


def test_std(L):
    mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
    g = torch.tensor([[-20.0, -18.0, -12.0, 0.0], [-20.0, -18.0, -8.0, 4.0]])
    dt = L.distribute(g, mesh, [L.Shard(0), L.Shard(1)])
    with Comms() as c:
        res = dt.std(dim=1)
    assert _pls(res) == ["S0", "R"], _pls(res)
    close(res.full_tensor(), torch.tensor([9.0, 11.0]))
    return {"std": _count(L, c, 1)}  # the kit: one all-gather of the statistics, not of the rows


PORTS = {
    2: [m1.test_linear_op_reductions, m1.test_mean, m1.test_softmax_fwd, m1.test_softmax_with_bwd,
        m1.test_nll_loss_and_cross_entropy, m1.test_layer_norm_bwd_req_grad, test_topk, test_shard0_svd,
        test_vector_norm, test_vector_norm_partial, test_dist, test_foreach_norm, test_foreach_norm_partial,
        test_linalg_eigh, test_upsampling, test_cumsum, test_conj_complex_dtensor,
        test_rotary_embedding_complex_ops, test_histc, test_logsumexp, test_partial_reduction_ops,
        test_matching_partial_reduction_ops],
    4: [m1.test_shard_math_ops, test_foreach_norm_different_mesh, test_foreach_add_different_mesh, test_std],
}

# Upstream tests not ported here, with the reason (so the count is auditable).
SKIPPED = {
    "test_layer_norm_fwd": "already ported: _dtensor_api_tasks.test_layer_norm_fwd_bwd (values, counts vs DTensor)",
    "test_layer_norm_bwd": "already ported: _dtensor_api_tasks.test_layer_norm_fwd_bwd (values, grads, counts)",
}
