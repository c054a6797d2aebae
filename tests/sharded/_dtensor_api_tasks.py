"""PyTorch's own DTensor unit tests (torch's test/distributed/tensor/: ``test_dtensor.py``,
``test_init.py``, ``test_math_ops.py``, ``test_view_ops.py``, ``test_pointwise_ops.py``,
``test_random_ops.py``, ``test_api.py``), ported to the kit on a real 2-rank gloo world: the
factories, ``distribute_module``, ``from_local``'s checks and ambient mesh, and the cases where
DTensor's placements or communication were the sharper ones.

Each port is named after its upstream test and runs the same body on the kit and on torch's
DTensor (``_LIBS``: the kit's names against torch's), so an assertion that holds for DTensor
holds for the kit; the collectives are counted on both (``Comms``, as upstream's
``CommDebugMode``) and returned, and the test asserts the kit's are no more than DTensor's.
``run()`` returns ``{name: {lib: result or "error: ..."}}``.
"""

from __future__ import annotations

import copy
import itertools
import math
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.tensor as tdt
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

import subclass_kit.sharded as sk
from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close

_LIBS = {
    "kit": SimpleNamespace(T=sk.ShardedTensor, Shard=sk.Shard, Replicate=sk.Replicate, Partial=sk.Partial,
                           distribute=sk.distribute, distribute_module=sk.distribute_module, zeros=sk.zeros,
                           ones=sk.ones, empty=sk.empty, full=sk.full, rand=sk.rand, randn=sk.randn),
    "dtensor": SimpleNamespace(T=tdt.DTensor, Shard=tdt.Shard, Replicate=tdt.Replicate, Partial=tdt.Partial,
                               distribute=tdt.distribute_tensor, distribute_module=tdt.distribute_module,
                               zeros=tdt.zeros, ones=tdt.ones, empty=tdt.empty, full=tdt.full, rand=tdt.rand,
                               randn=tdt.randn),
}


def _mesh():
    return DeviceMesh("cpu", torch.arange(dist.get_world_size()))


def _k() -> int:
    return dist.get_world_size()


def _pl(x) -> list:
    """Placements as comparable names (the kit's and torch's classes differ)."""
    out = []
    for p in x.placements:
        if p.is_shard():
            out.append(f"S{p.dim}")
        elif p.is_replicate():
            out.append("R")
        else:
            out.append("P")
    return out


# ---- test_init.py: DTensorConstructorTest ----------------------------------------------------
def _run_init_op(L, init_op, dist_init_op, eq_op, *args, **kwargs):
    mesh = _mesh()
    k, rank = _k(), dist.get_rank()
    for tensor_size in ([4, 8, 12], [5, 10, 15]):
        for placements in ([L.Shard(0)], [L.Shard(1)], [L.Shard(2)], [L.Replicate()]):
            d = dist_init_op(tensor_size, *args, **kwargs, device_mesh=mesh, placements=placements)
            assert tuple(d.shape) == tuple(tensor_size)
            assert d.requires_grad == kwargs.get("requires_grad", False)
            whole = init_op(tensor_size, *args, **kwargs)
            if placements[0].is_shard():
                exp = list(torch.chunk(whole, k, dim=placements[0].dim))[rank]
            else:
                exp = whole
            eq_op(exp, d.to_local())
    local = dist_init_op([], *args, **kwargs, device_mesh=mesh, placements=[L.Replicate()]).to_local()
    eq_op(init_op([], *args, **kwargs), local)
    return "ok"


def _same_meta(x, y):
    assert (x.shape, x.dtype, x.layout) == (y.shape, y.dtype, y.layout)


def test_ones(L):
    return _run_init_op(L, torch.ones, L.ones, close, requires_grad=True)


def test_empty(L):
    return _run_init_op(L, torch.empty, L.empty, _same_meta, requires_grad=True)


def test_full(L):
    return _run_init_op(L, torch.full, L.full, close, 123.4, requires_grad=True)


def test_zeros(L):
    return _run_init_op(L, torch.zeros, L.zeros, close, requires_grad=True)


def test_zeros_full_mesh(L):
    # upstream's 4-rank (2, 2) mesh becomes the 2-rank (1, 2) and (2, 1) meshes
    mesh = _mesh()
    rank = dist.get_rank()
    d = L.zeros([32, 3], device_mesh=mesh, placements=[L.Shard(0)])
    assert d.to_local().shape == (16, 3) and d.device.type == "cpu"
    d = L.zeros([31, 3], device_mesh=mesh, placements=[L.Shard(0)])
    assert d.to_local().shape == ((16, 3) if rank == 0 else (15, 3))
    for shape in ((1, 2), (2, 1)):
        m2 = DeviceMesh("cpu", torch.arange(2).reshape(shape))
        d = L.zeros([31, 3], device_mesh=m2, placements=[L.Shard(0), L.Shard(1)])
        want = [c.shape for r in torch.zeros(31, 3).chunk(shape[0], 0) for c in r.chunk(shape[1], 1)][rank]
        assert d.to_local().shape == want and torch.equal(d.to_local(), torch.zeros(want))
    return "ok"


# ---- test_random_ops.py: rand/randn factories (the kit: the dense draw, its random stream) ----
def test_rand_randn_factories(L):
    if L is _LIBS["dtensor"]:
        return "n/a"  # DTensor's rand/randn need an RNG-tracker mesh (cuda-like), not a cpu one
    mesh = _mesh()
    out = {}
    for name, dense in (("rand", torch.rand), ("randn", torch.randn)):
        torch.manual_seed(5)
        d = getattr(L, name)(6, 4, device_mesh=mesh, placements=[L.Shard(0)])
        whole = d.full_tensor()
        torch.manual_seed(5)
        ref = dense(6, 4)
        # a Replicate one is equal on every rank (both libraries)
        r = getattr(L, name)(3, 2, device_mesh=mesh, placements=[L.Replicate()])
        g = [torch.empty(3, 2) for _ in range(_k())]
        dist.all_gather(g, r.to_local())
        assert torch.equal(g[0], g[1])
        out[name] = bool(torch.equal(whole, ref))
    return out


# ---- test_dtensor.py -----------------------------------------------------------------------------
def test_from_local_uneven_sharding_raise_error(L):
    mesh = _mesh()
    g = torch.randn(_k() + 1, 2)
    mine = list(g.chunk(_k()))[dist.get_rank()]
    for kw in ({"shape": g.size()}, {"stride": g.stride()}):
        try:
            L.T.from_local(mine, mesh, (L.Shard(0),), **kw)
        except RuntimeError as e:
            assert "stride" in str(e) and "shape" in str(e), e
        else:
            raise AssertionError(f"from_local({kw}) did not raise")
    d = L.T.from_local(mine, mesh, (L.Shard(0),), shape=g.size(), stride=g.stride())
    assert d.size() == g.size() and d.stride() == g.stride()
    return "ok"


def test_from_local_mesh_context(L):
    # torch's DeviceMesh context manager: from_local(t, None, placements) inside `with mesh:`
    mesh = _mesh()
    with mesh:
        d = L.T.from_local(torch.ones(2, 3), None, [L.Shard(0)])
        z = L.zeros(4, 2, placements=[L.Shard(1)])
    assert tuple(d.shape) == (2 * _k(), 3) and _pl(d) == ["S0"]
    assert tuple(z.to_local().shape) == (4, 1)
    return "ok"


def test_from_local_run_check_metadata(L):
    # check_tensor_meta: the ranks' dtype and requires_grad must agree
    mesh = _mesh()
    rank = dist.get_rank()
    out = {}
    for what, local in (("dtype", torch.ones(2, 2, dtype=torch.float32 if rank == 0 else torch.float64)),
                        ("requires_grad", torch.ones(2, 2).requires_grad_(rank == 0))):
        try:
            L.T.from_local(local, mesh, [L.Shard(0)], run_check=True)
            out[what] = "accepted"
        except ValueError as e:
            out[what] = type(e).__name__
    return out


def test_meta_partial_to_empty(L):
    # to_empty of a module whose parameter is a meta Partial: the placement stays Partial
    mesh = _mesh()
    m = torch.nn.Linear(4, 4, bias=False, device="meta")
    m.weight = torch.nn.Parameter(L.T.from_local(torch.empty(4, 4, device="meta"), mesh, [L.Partial()]))
    m.to_empty(device="cpu")
    assert m.weight.device.type == "cpu"
    return _pl(m.weight)


# ---- test_api.py: distribute_module ----------------------------------------------------------
def test_distribute_module_input_fn_output_fn(L):
    mesh = _mesh()
    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    module = copy.deepcopy(dense)

    def partition(name, sub, mesh):
        if name == "0":
            for pname, p in list(sub.named_parameters()):
                sub.register_parameter(pname, torch.nn.Parameter(L.distribute(p.data, mesh, [L.Shard(0)])))

    def input_fn(mod, inputs, mesh):
        return tuple(L.distribute(t, mesh, [L.Replicate()]) for t in inputs)

    def output_fn(mod, outputs, mesh):
        return outputs.full_tensor()

    m = L.distribute_module(module, mesh, partition, input_fn, output_fn)
    assert _pl(m[0].weight) == ["S0"] and _pl(m[2].weight) == ["R"] and _pl(m[2].bias) == ["R"]
    x = torch.randn(3, 6)
    y = m(x)
    assert type(y) is torch.Tensor
    close(y, dense(x))
    try:
        L.distribute_module(m, mesh)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a second distribute_module did not raise")
    return "ok"


# ---- test_math_ops.py ------------------------------------------------------------------------------
def test_layer_norm_fwd_bwd(L):
    """test_layer_norm_fwd/_bwd: values and gradients equal dense; returns the forward and
    backward collective counts per (shard_dim, norm_idx, affine)."""
    mesh = _mesh()
    counts = {}
    batch, seq, emb = 20, 5, 10
    for shard_dim, norm_idx, affine in itertools.product(range(3), range(3), (False, True)):
        torch.manual_seed(0)
        x = torch.rand(batch, seq, emb, requires_grad=True)
        ln = torch.nn.LayerNorm(x.shape[norm_idx:], elementwise_affine=affine)
        ln_local = copy.deepcopy(ln)

        def _replicate(name, module, mesh):
            for pname, p in list(module.named_parameters()):
                module.register_parameter(pname, torch.nn.Parameter(L.distribute(p, mesh, [L.Replicate()])))

        ln_dist = L.distribute_module(ln, mesh, _replicate)
        x_dist = L.distribute(x.detach(), mesh, [L.Shard(shard_dim)]).requires_grad_(True)
        y = ln_local(x)
        with Comms() as fwd:
            y_dist = ln_dist(x_dist)
        with Comms() as bwd:
            y_dist.sum().backward()
        y.sum().backward()
        close(y_dist.full_tensor(), y)
        close(x_dist.grad.full_tensor(), x.grad)
        if affine:
            close(ln_dist.weight.grad.full_tensor(), ln_local.weight.grad)
            close(ln_dist.bias.grad.full_tensor(), ln_local.bias.grad)
        counts[f"{shard_dim},{norm_idx},{affine}"] = (fwd.total(), bwd.total())
    # A (seq, emb) LayerNorm: the sequence or the embedding sharded; the affine parameters
    # replicated or sharded on the embedding (issue 29's forward count).
    for shard_dim, wp in itertools.product((0, 1), ("R", "S0")):
        torch.manual_seed(0)
        x, w, b = torch.randn(16, 12, requires_grad=True), torch.randn(12, requires_grad=True), torch.randn(12, requires_grad=True)
        p = L.Replicate() if wp == "R" else L.Shard(0)
        xd = L.distribute(x.detach(), mesh, [L.Shard(shard_dim)]).requires_grad_(True)
        wd, bd = (L.distribute(t.detach(), mesh, [p]).requires_grad_(True) for t in (w, b))
        with Comms() as fwd:
            y_dist = F.layer_norm(xd, (12,), wd, bd)
        with Comms() as bwd:
            y_dist.sum().backward()
        y = F.layer_norm(x, (12,), w, b)
        y.sum().backward()
        close(y_dist.full_tensor(), y)
        for got, want in ((xd, x), (wd, w), (bd, b)):
            close(got.grad.full_tensor(), want.grad)
        counts[f"(seq, emb) S{shard_dim}, params {wp}"] = (fwd.total(), bwd.total())
    return counts


def test_dist_p1(L):
    """torch.dist(S0, S0, p=1) and p=inf: the value, the placement (a pending reduction)."""
    mesh = _mesh()
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(8, 6)
    out = {}
    for p in (1, math.inf):
        da, db = L.distribute(a, mesh, [L.Shard(0)]), L.distribute(b, mesh, [L.Shard(0)])
        with Comms() as c:
            d = torch.dist(da, db, p=p)
        close(d.full_tensor(), torch.dist(a, b, p=p))
        out[str(p)] = (_pl(d), c.total())
    return out


# ---- test_pointwise_ops.py -----------------------------------------------------------------------
def test_partial_mul(L):
    """Partial * Partial (test_mul_partial's case): the value, the collectives, the placement."""
    mesh = _mesh()
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    # operands of a sum: rank r holds a * (r + 1) / s, summing to a
    s = sum(range(1, _k() + 1))
    w = (dist.get_rank() + 1) / s
    pa = L.T.from_local(a * w, mesh, [L.Partial()])
    pb = L.T.from_local(b * w, mesh, [L.Partial()])
    with Comms() as c:
        y = pa * pb
    close(y.full_tensor(), a * b)
    return (_pl(y), dict(c.counts))


# ---- test_view_ops.py --------------------------------------------------------------------------------
def test_view_ops_no_gather(L):
    """view (48,35,26)->(24,4,35,13), repeat and tile of Shard(0): values and collectives."""
    mesh = _mesh()
    torch.manual_seed(0)
    out = {}
    cases = {
        "view": (torch.randn(48, 35, 26), lambda t: t.view(24, 4, 35, 13)),
        "repeat": (torch.randn(8, 6), lambda t: t.repeat(2, 1, 3)),
        "tile": (torch.randn(8, 6), lambda t: t.tile(2, 1, 1)),
        "repeat_dim1": (torch.randn(8, 6), lambda t: t.repeat(1, 3)),
    }
    for name, (t, f) in cases.items():
        d = L.distribute(t, mesh, [L.Shard(0)])
        with Comms() as c:
            y = f(d)
        close(y.full_tensor(), f(t))
        out[name] = (_pl(y), c.total())
    return out


# ---- test_random_ops.py: multinomial --------------------------------------------------------------
def test_multinomial(L):
    mesh = _mesh()
    torch.manual_seed(0)
    probs = torch.rand(8, 5)
    d = L.distribute(probs, mesh, [L.Shard(0)])
    out = {}
    for n, repl in ((1, False), (3, False)):
        torch.manual_seed(7)
        with Comms() as c:
            s = torch.multinomial(d, n, replacement=repl)
        torch.manual_seed(7)
        ref = torch.multinomial(probs, n, replacement=repl)
        full = s.full_tensor()
        assert full.shape == ref.shape and bool((full < 5).all())
        out[f"{n},{repl}"] = (_pl(s), c.total(), bool(torch.equal(full, ref)))
    return out


PORTS = [
    test_ones, test_empty, test_full, test_zeros, test_zeros_full_mesh, test_rand_randn_factories,
    test_from_local_uneven_sharding_raise_error, test_from_local_mesh_context,
    test_from_local_run_check_metadata, test_meta_partial_to_empty,
    test_distribute_module_input_fn_output_fn, test_layer_norm_fwd_bwd, test_dist_p1, test_partial_mul,
    test_view_ops_no_gather, test_multinomial,
]


def run() -> dict:
    out: dict = {}
    for fn in PORTS:
        for lib, L in _LIBS.items():
            try:
                out.setdefault(fn.__name__, {})[lib] = fn(L)
            except Exception:
                out.setdefault(fn.__name__, {})[lib] = "error: " + traceback.format_exc(limit=6)[-1500:]
            dist.barrier()
    return out
