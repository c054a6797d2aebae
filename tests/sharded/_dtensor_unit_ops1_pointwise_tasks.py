"""torch's ``test/distributed/tensor/test_pointwise_ops.py`` (DistElementwiseOpsTest) ported
to the kit and run on DTensor alike; see _dtensor_unit_ops1_tasks for the pattern."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils._pytree as pytree

from sharded._dtensor_unit_ops1_tasks import _count, _is_kit, _k, _mesh, _pls, _raises, _seed, close
from sharded._tp_upstream_tasks import Comms


def _compare_pairwise_ops(L, placements, op, pre_op_fn=None, args=(), kwargs=None):
    mesh = _mesh()
    pre_op_fn = pre_op_fn or (lambda: None)
    kwargs = kwargs or {}

    def to_d(x):
        return L.distribute(x, mesh, placements) if isinstance(x, torch.Tensor) else x

    dargs, dkwargs = pytree.tree_map(to_d, [args])[0], pytree.tree_map(to_d, [kwargs])[0]
    pre_op_fn()
    ref = op(*args, **kwargs)
    pre_op_fn()
    res = op(*dargs, **dkwargs)
    got = pytree.tree_map(lambda x: x.full_tensor() if isinstance(x, L.T) else x, [res])[0]
    close(got, ref)


def _run_sharded_elementwise_ops(L, placements, input_size, op, pre_op_fn=None, **kwargs):
    x = torch.randn(*input_size, requires_grad=True)
    _compare_pairwise_ops(L, placements, op, pre_op_fn, args=(x,), kwargs=kwargs)


def test_partial_add(L):
    m = _mesh()
    d3 = L.T.from_local(torch.rand(2, 2), m, [L.Partial()]) + L.T.from_local(torch.rand(2, 2), m, [L.Partial()])
    assert d3.placements[0].is_partial(), _pls(d3)
    return {}


def test_partial_replicate_add(L):
    m = _mesh()
    out = {}
    _seed()
    for op in ("sum", "avg"):
        torch.manual_seed(dist.get_rank())
        d1 = L.T.from_local(torch.rand(2, 2), m, [L.Partial(op)])
        _seed(1)
        d2 = L.T.from_local(torch.rand(2, 1), m, [L.Replicate()], run_check=True)
        with Comms() as c:
            d3 = d1 + d2
        out[op] = _count(L, c, 0, op)
        assert _pls(d3) == [f"P({op})"], _pls(d3)
        close(d3.full_tensor(), d1.full_tensor() + d2.full_tensor())
    return out


def test_activations(L):
    _seed()
    for pl, size, op in ((L.Shard(0), (8, 5), F.gelu), (L.Replicate(), (8, 5), F.gelu), (L.Shard(1), (3, 12), F.relu),
                         (L.Replicate(), (8, 5), F.relu), (L.Shard(0), (8, 5), torch.sigmoid),
                         (L.Replicate(), (8, 5), torch.sigmoid)):
        _run_sharded_elementwise_ops(L, [pl], size, op)
    return {}


def test_dropout(L):
    """Upstream is skipped (its RNG comparison); ported as: eval dropout is the identity on
    both; training dropout under one seed on every rank is the dense op's draw on the kit (its
    documented random stream), and on DTensor keeps x / (1 - p) where it keeps a value."""
    _seed()

    def seed():
        torch.manual_seed(4)

    _run_sharded_elementwise_ops(L, [L.Shard(0)], (8, 5), F.dropout, seed, p=0.4, training=False)
    x = torch.randn(3, 14)
    d = L.distribute(x, _mesh(), [L.Shard(1)])
    seed()
    got = F.dropout(d, p=0.5, training=True).full_tensor()
    seed()
    dense = F.dropout(x, p=0.5, training=True)
    if _is_kit(L):
        close(got, dense)
    else:
        kept = got != 0
        close(got[kept], x[kept] * 2)
    return {}


def test_dropout_backward(L):
    _seed()
    size = (8, 5)
    g = torch.rand(size, requires_grad=True)
    mask = torch.rand(size) < 0.8
    _compare_pairwise_ops(L, [L.Shard(0)], torch.ops.aten.native_dropout_backward,
                          kwargs=dict(grad_output=g, mask=mask, scale=0.3))
    return {}


def test_dropout_errors(L):
    """DTensor refuses dropout of a Partial; the kit (documented) reduces it first and draws as
    the dense op does under one seed: the dense answer."""
    _seed()
    if _is_kit(L):
        _run_sharded_elementwise_ops(L, [L.Partial("sum")], (8, 5), F.dropout, pre_op_fn=lambda: torch.manual_seed(4))
        return {}
    msg = _raises(lambda: _run_sharded_elementwise_ops(L, [L.Partial("sum")], (8, 5), F.dropout))
    assert "supported" in msg, msg
    return {}


def test_mul_out(L):
    m = _mesh()
    torch.manual_seed(dist.get_rank())
    a, b, o = torch.randn(8, 4), torch.randn(8, 4), torch.randn(8, 4)
    da, db, do = (L.T.from_local(t, m, [L.Shard(0)]) for t in (a, b, o))
    dt = torch.mul(da, db, out=do)
    expected = torch.mul(a, b, out=o.clone())
    close(da.to_local(), a)
    close(dt.to_local(), expected)
    return {}


def test_mul_partial(L):
    m = _mesh()
    k = _k()
    out = {}
    with Comms() as c:
        d3 = L.T.from_local(torch.ones(2, 2), m, [L.Partial()]) * L.T.from_local(torch.ones(2, 2), m, [L.Partial()])
    out["P*P"] = _count(L, c, 1, "P*P")
    assert isinstance(d3, L.T) and _pls(d3) == ["P(sum)"], _pls(d3)
    close(d3.to_local(), torch.ones(2, 2) * k)
    inp = torch.full((8, 8), 1.0)
    for pop in ("sum", "avg"):
        want = inp * k * 2.0 if pop == "sum" else inp * 2.0
        di = L.T.from_local(inp, m, [L.Partial(pop)])
        for i, other in enumerate((2.0, torch.tensor(2.0), torch.full((8, 8), 2.0))):
            do = L.distribute(other, m, [L.Replicate()]) if isinstance(other, torch.Tensor) and other.numel() > 1 else other
            with Comms() as c:
                z = di * do
            out[f"{pop},{i}"] = _count(L, c, 0, f"{pop},{i}")
            assert isinstance(z, L.T) and _pls(z) == [f"P({pop})"], _pls(z)
            close(z.full_tensor(), want)
    di = L.T.from_local(inp, m, [L.Partial("max")])
    z = di * L.distribute(torch.ones(8, 8), m, [L.Replicate()])
    assert _pls(z) == ["R"], _pls(z)
    close(z.to_local(), inp)
    return out


def test_masked_fill_scalar(L):
    m = _mesh()
    for x, maskf, fill, pl in (
            (torch.arange(40, dtype=torch.float32).reshape(8, 5), lambda t: t > 20, -999.0, L.Shard(0)),
            (torch.arange(40, dtype=torch.float32).reshape(8, 5) - 20, lambda t: t < 0, 42.0, L.Replicate()),
            (torch.arange(48, dtype=torch.float32).reshape(4, 12), lambda t: t % 2 == 0, 0.0, L.Shard(1))):
        mask = maskf(x)
        dx = L.distribute(x.clone(), m, [pl])
        dm = L.distribute(mask, m, [pl])
        x.masked_fill_(mask, fill)
        dx.masked_fill_(dm, fill)
        close(dx.full_tensor(), x)
    return {}


def test_inplace_op_partial_to_replicate(L):
    """DTensor refuses an in-place op that would reduce a Partial; the kit (documented, as
    ``fill_``) reduces it first and writes the dense answer into the same tensor."""
    pd = L.T.from_local(torch.tensor(64.0), _mesh(), (L.Partial(),))
    assert pd.placements[0].is_partial()
    if _is_kit(L):
        assert pd.clamp_(max=10) is pd
        close(pd.full_tensor(), torch.tensor(10.0))
        return {}
    msg = _raises(lambda: pd.clamp_(max=10))
    assert "in-place operations that require placement changes are not supported" in msg, msg
    return {}


def test_mul_div_scalar_partial(L):
    aten = torch.ops.aten
    m = _mesh()
    rank, total = dist.get_rank(), sum(range(_k()))
    dt = L.T.from_local(torch.tensor([rank]), m, [L.Partial("sum")])
    res = aten.mul.Scalar(dt, 2)
    close(res.to_local(), torch.tensor([rank * 2]))
    assert res.placements[0].is_partial()
    close(res.redistribute(m, [L.Replicate()]).to_local(), torch.tensor([2 * total]))
    res = aten.div.Scalar(dt, 2)
    close(res.to_local(), torch.tensor([rank / 2]))
    assert res.placements[0].is_partial()
    close(res.redistribute(m, [L.Replicate()]).to_local(), torch.tensor([total / 2]))
    return {}


def _partial_propagation(L, op, reduce_op):
    m = _mesh()
    rank, k = dist.get_rank(), _k()
    _seed(rank)
    a, b = torch.rand(8, 8) * rank, torch.rand(8, 8) * (k - rank)
    da, db = L.T.from_local(a, m, [L.Partial(reduce_op)]), L.T.from_local(b, m, [L.Partial(reduce_op)])
    with Comms() as c:
        r = op(da, db)
    n = _count(L, c, 0, reduce_op)
    assert _pls(r) == [f"P({reduce_op})"], _pls(r)
    close(r.full_tensor(), op(da.full_tensor(), db.full_tensor()))
    return {reduce_op: n}


def test_partial_propagation_maximum(L):
    return _partial_propagation(L, torch.maximum, "max")


def test_partial_propagation_minimum(L):
    return _partial_propagation(L, torch.minimum, "min")


PORTS = {2: [test_partial_add, test_partial_replicate_add, test_activations, test_dropout, test_dropout_backward,
             test_dropout_errors, test_mul_out, test_mul_partial, test_masked_fill_scalar,
             test_inplace_op_partial_to_replicate, test_mul_div_scalar_partial, test_partial_propagation_maximum,
             test_partial_propagation_minimum]}

SKIPPED: dict = {}
