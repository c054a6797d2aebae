"""torch's ``test_matrix_ops.py`` (``DistMatrixOpsTest``), ported to the kit: each port runs
on the kit and on DTensor (see _dtensor_unit_ops2_tasks), asserts upstream's values, and
returns the placements and collectives per case for the side-by-side assertions."""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from sharded._dtensor_unit_ops2_tasks import Comms, _spec, close, mesh_1d, mesh_2d, pl, record


def test_addmm(L):
    """Every case of addmm_single_dim_strategy: bias 1-D, 2-D, scalar, (1, N), (M, 1)."""
    mesh = mesh_1d()
    torch.manual_seed(0)
    M, K, N = 12, 8, 4
    m1, m2 = torch.randn(M, K), torch.randn(K, N)
    biases = {"1d": torch.randn(N), "2d": torch.randn(M, N), "scalar": torch.randn(()),
              "1n": torch.randn(1, N), "m1": torch.randn(M, 1)}
    R, S0, S1, P = L.Replicate(), L.Shard(0), L.Shard(1), L.Partial()
    cases = [("1d", R, S0, R, "S0"), ("2d", S0, S0, R, "S0"), ("1d", S0, R, S1, "S1"), ("2d", S1, R, S1, "S1"),
             ("1d", P, S1, S0, "P(sum)"), ("2d", P, S1, S0, "P(sum)"), ("1d", R, R, R, "R"), ("2d", R, R, R, "R"),
             ("scalar", R, S0, R, "S0"), ("scalar", R, R, S1, "S1"), ("1n", R, S0, R, "S0"),
             ("1n", S1, R, S1, "S1"), ("m1", S0, S0, R, "S0"), ("m1", R, R, S1, "S1")]
    r: dict = {}
    for b, pb, p1, p2, want_pl in cases:
        d = [L.distribute(t, mesh, [p]) for t, p in ((biases[b], pb), (m1, p1), (m2, p2))]
        with Comms() as c:
            y = torch.addmm(*d)
        close(y.full_tensor(), torch.addmm(biases[b], m1, m2))
        assert pl(y) == [want_pl], (b, pl(y), want_pl)
        record(r, f"{b}:{','.join(pl(x)[0] for x in d)}", y, c)
    # not upstream's: every placement of a 2-D bias and both matrices, beta 0.8 (the bias
    # counted in the plan: no more collectives than DTensor; placements may differ)
    for s in itertools.product((S0, S1, R), repeat=3):
        d = [L.distribute(t, mesh, [p]) for t, p in zip((biases["2d"], m1, m2), s)]
        with Comms() as c:
            y = torch.addmm(*d, beta=0.8)
        close(y.full_tensor(), torch.addmm(biases["2d"], m1, m2, beta=0.8))
        record(r, f"all:{','.join(pl(x)[0] for x in d)}", None, c)
    return r


def test_addmm_empty_operand(L):
    mesh = mesh_1d()
    a, b, bias = torch.randn(12, 0), torch.randn(0, 4), torch.randn(4)
    d = torch.addmm(L.distribute(bias, mesh, [L.Replicate()]), L.distribute(a, mesh, [L.Shard(0)]),
                    L.distribute(b, mesh, [L.Replicate()]))
    close(d.full_tensor(), torch.addmm(bias, a, b))
    return {"pl": {"addmm": pl(d)}}


def test_addmm_auto_redistribute(L):
    mesh = mesh_1d()
    torch.manual_seed(0)
    t1, t0, bias = (torch.randn(*s, requires_grad=True) for s in ((12, 8), (8, 4), (4,)))
    m1, m2 = L.distribute(t1, mesh, [L.Shard(1)]), L.distribute(t0, mesh, [L.Shard(0)])
    inp = L.distribute(bias, mesh, [L.Replicate()])
    want = torch.addmm(bias, t1, t0)
    with Comms() as c:
        y = torch.addmm(inp, m1, m2)
    assert isinstance(y, L.T) and pl(y) == ["P(sum)"], pl(y)
    full = y.full_tensor()
    close(full, want)
    full.sum().backward()
    want.sum().backward()
    assert m2.grad is not None
    close(m2.grad.full_tensor(), t0.grad)
    r: dict = {}
    record(r, "addmm", y, c)
    return r


def _product_pairs(L, op, t1, t2, specs, grad_of_first=None):
    """``op`` of every pair of placements of ``t1`` and ``t2``: replicated, the result equals
    dense; its backward reaches the first operand (equal to ``grad_of_first`` if given)."""
    mesh, want, r = mesh_1d(), op(t1, t2), {}
    for p1, p2 in itertools.product(specs, specs):
        d1, d2 = L.distribute(t1, mesh, [p1]), L.distribute(t2, mesh, [p2])
        with Comms() as c:
            y = op(d1, d2)
        record(r, f"{pl(d1)[0]}@{pl(d2)[0]}", y, c)
        y = y.redistribute(mesh, [L.Replicate()])
        close(y.to_local(), want)
        y.backward(torch.ones_like(y))
        assert d1.grad is not None
        if grad_of_first is not None:
            close(d1.grad.redistribute(mesh, [L.Replicate()]).to_local(), grad_of_first)
    return r


def test_mm(L):
    torch.manual_seed(0)
    t1, t2 = torch.randn(12, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    return _product_pairs(L, torch.mm, t1, t2, (L.Shard(0), L.Shard(1), L.Replicate()))


def test_aten_linear(L):
    mesh = mesh_1d()
    x = L.distribute(torch.randn(1, 47, 256), mesh, [L.Replicate()])
    w = L.distribute(torch.randn(256, 256), mesh, [L.Shard(0)])
    with torch.inference_mode(), Comms() as c:  # aten::linear arrives whole
        y = F.linear(x, w)
    assert pl(y) == ["S2"], pl(y)
    close(y.full_tensor(), F.linear(x.full_tensor(), w.full_tensor()))
    r: dict = {}
    record(r, "linear", y, c)
    return r


def test_mm_single_dim_strategy(L):
    """(k - 1, k) rows over k ranks (a rank holds no row) @ a Replicate weight."""
    mesh, k = mesh_1d(), dist.get_world_size()
    g = torch.arange((k - 1) * k).float().view(k - 1, k)
    w = torch.arange(k * k).float().view(k, k)
    x, wd = L.distribute(g, mesh, [L.Shard(0)]), L.distribute(w, mesh, [L.Replicate()])
    with Comms() as c:
        y = torch.mm(x, wd)
    close(y.full_tensor(), g @ w)
    r: dict = {}
    record(r, "mm", y, c)
    return r


def _mm_strided(L, mesh, g, spec, w, case):
    """``g`` laid out by ``spec`` (_StridedShards of its rows) @ a replicated ``w``: the
    output keeps the input's placements (upstream: ``expected_placements``)."""
    x = L.distribute(g, mesh, spec, src_data_rank=None)
    wd = L.distribute(w, mesh, [L.Replicate()] * mesh.ndim)
    with Comms() as c:
        y = torch.mm(x, wd)
    assert pl(y) == pl(x), (pl(y), pl(x))
    close(y.full_tensor(), g @ w)
    r: dict = {}
    record(r, case, y, c)
    return r


def test_mm_with_strided_input(L):
    """Case 1: a 1-D mesh's _StridedShard(0, split_factor=2) input @ Replicate keeps it."""
    k = dist.get_world_size()
    g = torch.arange(2 * k * 3).float().view(2 * k, 3)
    return _mm_strided(L, mesh_1d(), g, [L.StridedShard(0, split_factor=2)], torch.arange(21).float().view(3, 7), "1d")


def test_mm_with_strided_input_2d(L):
    """Case 2: a 2 x 2 mesh, _StridedShard on both mesh dims; the output keeps both."""
    dims = (4, 4, 6, 8)
    g = torch.arange(math.prod(dims)).float().view(math.prod(dims[:3]), 8)
    spec = [L.StridedShard(0, split_factor=4), L.StridedShard(0, split_factor=dims[0] * (dims[1] // 2))]
    return _mm_strided(L, mesh_2d(), g, spec, torch.arange(64).float().view(8, 8), "2d")


def test_matmul(L):
    mesh = mesh_1d()
    x, A = torch.randn(8, 128), torch.randn(128, 128)
    dx, dA = L.distribute(x, mesh, [L.Replicate()]), L.distribute(A, mesh, [L.Shard(0)])
    with torch.inference_mode(), Comms() as c:
        y = torch.matmul(dx, dA)
    close(y.full_tensor(), x @ A)
    r: dict = {}
    record(r, "matmul", y, c)
    return r


def test_t(L):
    mesh = mesh_1d()
    m = L.distribute(torch.randn(12, 8, requires_grad=True), mesh, [L.Shard(0)])
    t = m.t()
    assert t.size() == (8, 12) and pl(t) == ["S1"]
    t2 = t.t()
    assert t2.size() == (12, 8) and pl(t2) == ["S0"]
    return "ok"


def test_t_partial(L):
    mesh = mesh_1d()
    a, b = torch.randn(12, 8), torch.randn(8, 4)
    with Comms() as c:
        dc = torch.mm(L.distribute(a, mesh, [L.Shard(1)]), L.distribute(b, mesh, [L.Shard(0)])).t()
    assert pl(dc) == ["P(sum)"], pl(dc)
    close(dc.redistribute(mesh, [L.Replicate()]).to_local(), (a @ b).t())
    r: dict = {}
    record(r, "mm.t", dc, c)
    return r


def test_t_1d(L):
    t = torch.randn(8)
    y = L.distribute(t, mesh_1d(), [L.Shard(0)]).t()
    assert y.size() == (8,) and pl(y) == ["S0"]
    close(y.full_tensor(), t)
    return "ok"


def test_baddbmm(L):
    """Every placement of the three operands, beta 0 and 0.8 (upstream: GPU only, for a CPU
    nan with beta=0 since fixed)."""
    mesh = mesh_1d()
    torch.manual_seed(0)
    t, b1, b2 = torch.rand(4, 4, 8), torch.rand(4, 4, 8), torch.rand(4, 8, 8)
    specs = [L.Shard(0), L.Shard(1), L.Shard(2), L.Replicate()]
    r: dict = {}
    for beta, alpha in ((0.0, 0.5), (0.8, 0.5)):
        want = torch.baddbmm(t, b1, b2, beta=beta, alpha=alpha)
        for s in itertools.product(specs, repeat=3):
            d = [L.distribute(x, mesh, [p]) for x, p in zip((t, b1, b2), s)]
            with Comms() as c:
                y = torch.baddbmm(*d, beta=beta, alpha=alpha)
            got = y.redistribute(mesh, [L.Replicate()]).to_local()
            assert not torch.isnan(got).any()
            close(got, want)
            record(r, f"{beta}:{','.join(pl(x)[0] for x in d)}", y, c)
    return r


def test_bmm(L):
    torch.manual_seed(0)
    m1, m2 = torch.rand(4, 8, 4, requires_grad=True), torch.rand(4, 4, 8, requires_grad=True)
    want = torch.bmm(m1, m2)
    want.backward(torch.ones_like(want))
    specs = [L.Shard(0), L.Shard(1), L.Shard(2), L.Replicate()]
    return _product_pairs(L, torch.bmm, m1, m2, specs, grad_of_first=m1.grad)


def test_mm_partial_inputs(L):
    """mm of two Partial('sum'/'avg') operands on every mesh of the world's ranks upstream
    lists (here (2,), (1, 2), (1, 2, 1)): Partial out, one all-reduce per Partial mesh dim of
    size > 1; and P,R @ R,P on a (1, 2) mesh (2 x 2: test_mm_partial_inputs_2x2)."""
    k = dist.get_world_size()
    r: dict = {}
    for shape in ((k,), (1, k), (1, k, 1)):
        mesh = DeviceMesh("cpu", torch.arange(k).reshape(shape))
        for op in ("sum", "avg"):
            torch.manual_seed(dist.get_rank())
            a, b = torch.randn(16, 12), torch.randn(12, 20)
            d1 = L.from_local(a, mesh, [L.Partial(op)] * mesh.ndim, run_check=False)
            d2 = L.from_local(b, mesh, [L.Partial(op)] * mesh.ndim, run_check=False)
            with Comms() as c:
                y = torch.mm(d1, d2)
            assert pl(y) == [f"P({op})"] * mesh.ndim, pl(y)
            assert c.counts["all_reduce"] == c.total() == 1, dict(c.counts)
            close(y.full_tensor(), d1.full_tensor() @ d2.full_tensor())
            record(r, f"{shape}:{op}", y, c)
    r.update(_mm_partial_mixed(L, DeviceMesh("cpu", torch.arange(k).reshape(1, k))))
    return r


def _mm_partial_mixed(L, mesh):
    """P,R @ R,P: P,P with no collective (every rank the same locals, as upstream)."""
    r: dict = {}
    for op in ("sum", "avg"):
        torch.manual_seed(0)
        d1 = L.from_local(torch.randn(16, 12), mesh, [L.Partial(op), L.Replicate()], run_check=False)
        d2 = L.from_local(torch.randn(12, 20), mesh, [L.Replicate(), L.Partial(op)], run_check=False)
        with Comms() as c:
            y = torch.mm(d1, d2)
        assert pl(y) == [f"P({op})"] * 2 and c.total() == 0, (pl(y), dict(c.counts))
        close(y.full_tensor(), d1.full_tensor() @ d2.full_tensor())
        record(r, f"mixed:{op}", y, c)
    return r


def test_mm_partial_inputs_2x2(L):
    """test_mm_partial_inputs' mixed case on upstream's (world // 2, 2) mesh."""
    return _mm_partial_mixed(L, mesh_2d())


def test_dtensor_mm(L, shapes=None):
    """[Shard(0), Replicate] @ [Replicate, Shard(1)] on the 2-D meshes of the world's ranks."""
    k = dist.get_world_size()
    r: dict = {}
    for shape in shapes or ((1, k), (k, 1)):
        mesh = DeviceMesh("cpu", torch.arange(k).reshape(shape))
        lhs, rhs = torch.randn(256, 128), torch.randn(128, 256)
        a = L.distribute(lhs, mesh, [L.Shard(0), L.Replicate()])
        b = L.distribute(rhs, mesh, [L.Replicate(), L.Shard(1)])
        with Comms() as c:
            y = a @ b
        close(y.full_tensor(), lhs @ rhs, atol=1.5e-5, rtol=1e-6)
        record(r, str(shape), y, c)
    return r


def test_dtensor_mm_2x2(L):
    return test_dtensor_mm(L, shapes=((2, 2),))


def test_tensordot_shampoo(L):
    mesh = mesh_1d()
    a, b = torch.randn(4, 4), torch.randn(4, 15)
    want = torch.tensordot(a, b, dims=([0], [0]))
    r: dict = {}
    specs = [L.Replicate(), L.Shard(0), L.Shard(1)]
    for p1, p2 in itertools.product(specs, repeat=2):
        with Comms() as c:
            y = torch.tensordot(L.distribute(a, mesh, [p1]), L.distribute(b, mesh, [p2]), dims=([0], [0]))
        close(y.full_tensor(), want)
        record(r, f"{_spec([p1])}.{_spec([p2])}", y, c)
    return r


def test_constant_pad_nd(L):
    mesh = mesh_1d()
    t = torch.randn(8, 6)
    r: dict = {}
    for name, spec, value in (("S0", L.Shard(0), 0.0), ("S1", L.Shard(1), 0.0), ("P v=0", L.Partial(), 0.0),
                              ("P v=1", L.Partial(), 1.0)):
        d = L.distribute(t, mesh, [spec])
        with Comms() as c:
            y = F.pad(d, [1, 1], value=value)
        close(y.full_tensor(), F.pad(t, [1, 1], value=value))
        if name == "P v=0":
            assert pl(y) == ["P(sum)"], pl(y)
        if name == "P v=1":
            assert pl(y) != ["P(sum)"], pl(y)
        record(r, name, y, c)
    return r


PORTS = [test_addmm, test_addmm_empty_operand, test_addmm_auto_redistribute, test_mm, test_aten_linear,
         test_mm_single_dim_strategy, test_mm_with_strided_input, test_matmul, test_t, test_t_partial, test_t_1d,
         test_baddbmm, test_bmm, test_mm_partial_inputs, test_dtensor_mm, test_tensordot_shampoo,
         test_constant_pad_nd]
PORTS_2D = [test_mm_with_strided_input_2d, test_dtensor_mm_2x2, test_mm_partial_inputs_2x2]
