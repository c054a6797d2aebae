"""Tasks run on every rank of a spawned gloo world (module-level: pickled by reference).

Each task checks many things against dense references every rank computes alike from a
seeded generator, raising on the first mismatch (the harness shows the rank's traceback),
and returns a summary the test asserts on.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import (
    ColwiseParallel,
    Partial,
    Replicate,
    RowwiseParallel,
    Shard,
    ShardedTensor,
    ShardShapeError,
    distribute,
    parallelize,
)
from sharded._meshes import strides as _strides

close = torch.testing.assert_close


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _partial(dense: torch.Tensor, mesh, op: str) -> ShardedTensor:
    """A Partial(op) tensor whose reduction is ``dense``: different operands on every rank."""
    k, r = dist.get_world_size(), dist.get_rank()
    if op == "sum":
        local = dense * (r + 1) / (k * (k + 1) / 2)
    elif op == "avg":
        local = dense + (r - (k - 1) / 2)
    else:  # max / min: rank 0 holds the value, the others something smaller / larger
        local = dense if r == 0 else dense + (-1.0 if op == "max" else 1.0) * (r + 1)
    return ShardedTensor.from_local(local, mesh, [Partial(op)])


def _expected_local(dense, placement, mesh):
    r, k = dist.get_rank(), dist.get_world_size()
    if type(placement) is Shard:
        chunks = list(dense.chunk(k, placement.dim))
        return chunks[r] if r < len(chunks) else dense.narrow(placement.dim, dense.size(placement.dim), 0)
    if type(placement) is Partial and placement.op == "sum":
        return dense if r == 0 else torch.zeros_like(dense)
    return dense


def values() -> dict:
    """Round trips, every redistribution, and each op family against dense."""
    mesh = _mesh()
    k = dist.get_world_size()
    g = _gen()
    summary: dict = {}
    # Shapes that divide evenly over 2 and 3 ranks, and ones that do not (torch.chunk sizes).
    for shape in ((12, 6), (7, 5)):
        d = torch.randn(*shape, generator=g)
        for pl in (Shard(0), Shard(1), Replicate()):
            x = distribute(d, mesh, [pl])
            close(x.full_tensor(), d)
            close(x.to_local(), _expected_local(d, pl, mesh))
            y = ShardedTensor.from_local(_expected_local(d, pl, mesh).clone(), mesh, [pl], shape=shape, stride=_strides(shape), run_check=True)
            close(y.full_tensor(), d)
        # Every transition between placements (Partial sources built from operands).
        sources = {repr(p): (lambda p=p: distribute(d, mesh, [p])) for p in (Shard(0), Shard(1), Replicate())}
        for op in ("sum", "avg", "max", "min"):
            sources[repr(Partial(op))] = lambda op=op: _partial(d, mesh, op)
        for src_name, make in sources.items():
            for dst in (Shard(0), Shard(1), Replicate(), Partial("sum"), Partial("avg")):
                y = make().redistribute(mesh, [dst])
                assert y.placements == (dst,), (src_name, dst, y.placements)
                close(y.full_tensor(), d, msg=f"{src_name} -> {dst!r}")
                if src_name != repr(dst) and not (type(dst) is Partial and dst.op == "avg"):
                    close(y.to_local(), _expected_local(d, dst, mesh), msg=f"{src_name} -> {dst!r} local")
    summary["mesh"] = _meshes(mesh, g)
    summary["ops"] = _ops(mesh, g)
    summary["autograd"] = _autograd(mesh, g)
    summary["errors"] = _errors(mesh)
    summary["world"] = k
    return summary


def _meshes(mesh, g) -> dict:
    """2-D meshes (one mesh dim per placement), the DeviceMesh behind a tensor, pickling."""
    import pickle

    from torch.distributed.device_mesh import init_device_mesh

    k = dist.get_world_size()
    d = torch.randn(6, 5, generator=g)
    m2 = init_device_mesh("cpu", (1, k), mesh_dim_names=("dp", "tp"))
    out = {}
    for pl in ([Replicate(), Shard(0)], [Shard(1), Shard(0)], [Shard(0), Replicate()]):
        x = distribute(d, m2, pl)
        close(x.full_tensor(), d)
        y = x.redistribute(m2, [Shard(0), Shard(1)])
        close(y.full_tensor(), d)
        close((x @ distribute(d.t(), m2, [Replicate(), Shard(1)])).full_tensor(), d @ d.t())
    out["2-D local"] = tuple(distribute(d, m2, [Shard(1), Shard(0)]).to_local().shape)
    # A 1-D slice of the 2-D mesh carries its own group; ShardedTensors built on it resolve back.
    tp = m2["tp"]
    x = distribute(d, tp, [Shard(0)])
    assert x.device_mesh is tp and distribute(d, mesh, [Shard(0)]).device_mesh is mesh
    y = pickle.loads(pickle.dumps(x))
    assert y.mesh == x.mesh and y.device_mesh is tp and y.placements == x.placements
    close(y.full_tensor(), d)
    return out


def _ops(mesh, g) -> dict:
    """Each family's rule: values equal dense, placements as the rule says."""
    a, b = torch.randn(6, 5, generator=g), torch.randn(5, 7, generator=g)
    v, bias = torch.randn(5, generator=g), torch.randn(7, generator=g)
    x3 = torch.randn(2, 3, 10, generator=g)
    y6 = torch.randn(6, 4, 5, generator=g)
    D = lambda t, p: distribute(t, mesh, [p])  # noqa: E731
    cases = {
        "S0 + R row": (lambda: D(a, Shard(0)) + D(v, Replicate()), a + v),
        "S1 + plain row": (lambda: D(a, Shard(1)) + v, a + v),
        "S1 * S0": (lambda: D(a, Shard(1)) * D(a, Shard(0)), a * a),
        "P + P": (lambda: _partial(a, mesh, "sum") + _partial(a, mesh, "sum"), a + a),
        "P + R": (lambda: _partial(a, mesh, "sum") + D(a, Replicate()), a + a),
        "P * 2": (lambda: _partial(a, mesh, "sum") * 2, a * 2),
        "P + 1": (lambda: _partial(a, mesh, "sum") + 1, a + 1),
        "avg + 1": (lambda: _partial(a, mesh, "avg") + 1, a + 1),
        "relu P": (lambda: _partial(a, mesh, "sum").relu(), a.relu()),
        "where": (lambda: torch.where(D(a, Shard(0)) > 0, D(a, Shard(0)), 0.0), torch.where(a > 0, a, 0.0)),
        "mm S0 R": (lambda: D(a, Shard(0)) @ D(b, Replicate()), a @ b),
        "mm R S1": (lambda: D(a, Replicate()) @ D(b, Shard(1)), a @ b),
        "mm S1 S0": (lambda: D(a, Shard(1)) @ D(b, Shard(0)), a @ b),
        "mm S1 R": (lambda: D(a, Shard(1)) @ D(b, Replicate()), a @ b),
        "mm S0 S0": (lambda: D(a, Shard(0)) @ D(b, Shard(0)), a @ b),
        "mm P R": (lambda: _partial(a, mesh, "sum") @ D(b, Replicate()), a @ b),
        "addmm colwise": (lambda: torch.addmm(D(bias, Shard(0)), D(a, Replicate()), D(b, Shard(1))), torch.addmm(bias, a, b)),
        "addmm rowwise": (lambda: torch.addmm(D(bias, Replicate()), D(a, Shard(1)), D(b, Shard(0))), torch.addmm(bias, a, b)),
        "bmm batch": (lambda: torch.bmm(D(x3, Shard(0)), D(x3.transpose(1, 2), Shard(0))), torch.bmm(x3, x3.transpose(1, 2))),
        "t": (lambda: D(a, Shard(0)).t(), a.t()),
        "view keeps H": (lambda: D(x3, Shard(2)).view(6, 10), x3.view(6, 10)),
        "view merges": (lambda: D(x3, Shard(1)).view(6, 10), x3.view(6, 10)),
        # A shard leading a merge, or on the first part of a split, stays when the chunks
        # divide evenly (6 rows over 2 or 3 ranks); 5 rows do not, and are gathered.
        # (Splitting 6 into (3, 2) would keep the shard on 3 ranks only.)
        "view merges leading": (lambda: D(y6, Shard(0)).view(24, 5), y6.view(24, 5)),
        "view splits leading": (lambda: D(y6.view(24, 5), Shard(0)).view(6, 4, 5), y6),
        "flatten leading": (lambda: D(y6, Shard(0)).flatten(), y6.flatten()),
        "view merges uneven": (lambda: D(a[:5], Shard(0)).view(-1), a[:5].reshape(-1)),
        "unsqueeze": (lambda: D(a, Shard(1)).unsqueeze(0), a.unsqueeze(0)),
        "expand": (lambda: D(v, Shard(0)).expand(3, 5), v.expand(3, 5)),
        "slice sharded": (lambda: D(a, Shard(0))[1:5], a[1:5]),
        "slice other": (lambda: D(a, Shard(0))[:, 1:3], a[:, 1:3]),
        "sum sharded": (lambda: D(a, Shard(0)).sum(0), a.sum(0)),
        "sum all": (lambda: D(a, Shard(1)).sum(), a.sum()),
        "sum other": (lambda: D(a, Shard(0)).sum(1), a.sum(1)),
        "mean sharded": (lambda: D(a, Shard(1)).mean(1), a.mean(1)),
        "amax sharded": (lambda: D(a, Shard(0)).amax(0), a.amax(0)),
        "sum of P": (lambda: _partial(a, mesh, "sum").sum(0), a.sum(0)),
        "softmax sharded": (lambda: torch.softmax(D(a, Shard(1)), 1), torch.softmax(a, 1)),
        "softmax other": (lambda: torch.softmax(D(a, Shard(0)), 1), torch.softmax(a, 1)),
        "zeros_like P": (lambda: torch.zeros_like(_partial(a, mesh, "sum")), torch.zeros_like(a)),
        "cat sharded": (lambda: torch.cat([D(a, Shard(0)), D(a, Shard(0))]), torch.cat([a, a])),
        "cat other": (lambda: torch.cat([D(a, Shard(0)), a], 1), torch.cat([a, a], 1)),
        "stack": (lambda: torch.stack([D(a, Shard(1)), D(a, Shard(0))]), torch.stack([a, a])),
    }
    placements = {}
    for name, (fn, ref) in cases.items():
        out = fn()
        assert isinstance(out, ShardedTensor), name
        close(out.full_tensor(), ref, msg=name)
        placements[name] = repr(out.placements[0])
    # In place: the written tensor keeps its placements.
    x = D(a.clone(), Shard(0))
    x.mul_(2).add_(D(v, Replicate()))
    close(x.full_tensor(), a * 2 + v)
    placements["mul_ add_"] = repr(x.placements[0])
    # A merged view that kept its shard is a view of it: a write through it reaches the base.
    x = D(y6.clone(), Shard(0))
    x.view(24, 5).mul_(3)
    close(x.full_tensor(), y6 * 3)
    placements["mul_ through merged view"] = repr(x.placements[0])
    return placements


def _autograd(mesh, g) -> dict:
    """Eager backward through conversions and ops: gradients equal dense gradients."""
    a, b, c = torch.randn(6, 5, generator=g), torch.randn(5, 7, generator=g), torch.randn(6, 7, generator=g)
    da, db = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    ref = ((da @ db).relu() * c).sum()
    ref.backward()
    sa = distribute(a, mesh, [Shard(1)]).requires_grad_(True)
    sb = distribute(b, mesh, [Shard(0)]).requires_grad_(True)
    out = ((sa @ sb).redistribute(mesh, [Replicate()]).relu() * c).sum()
    close(out.full_tensor(), ref.detach())
    out.full_tensor().backward()
    close(sa.grad.full_tensor(), da.grad)
    close(sb.grad.full_tensor(), db.grad)
    # from_local/to_local: the local's gradient is this rank's part of the dense gradient.
    k, r = dist.get_world_size(), dist.get_rank()
    loc = list(a.chunk(k, 0))[r].clone().requires_grad_(True)
    y = ShardedTensor.from_local(loc, mesh, [Shard(0)], shape=a.shape, stride=_strides(a.shape))
    (y * y).sum().full_tensor().backward()
    close(loc.grad, 2 * loc.detach())
    return {"a.grad": repr(sa.grad.placements[0]), "b.grad": repr(sb.grad.placements[0])}


def _errors(mesh) -> dict:
    """Errors that need ranks: a shard inconsistent on one rank only, unequal replicas."""
    k, r = dist.get_world_size(), dist.get_rank()
    out = {}
    # 7 rows over k ranks: the last rank's shard is smaller; pass the first rank's size on all.
    rows = list(torch.zeros(7, 2).chunk(k))[0].shape[0]
    try:
        ShardedTensor.from_local(torch.zeros(rows, 2), mesh, [Shard(0)], shape=(7, 2), stride=_strides((7, 2)))
        out["inconsistent"] = "ok"
    except ShardShapeError as e:
        out["inconsistent"] = str(e)
    local = torch.full((2,), float(r))
    try:
        ShardedTensor.from_local(local, mesh, [Replicate()], run_check=True)
        out["replicas"] = "ok"
    except ShardShapeError as e:
        out["replicas"] = str(e)
    return out


# ---- the tensor-parallel MLP ---------------------------------------------------------------
class _Record:
    """An aot_autograd backend that keeps the forward and backward graphs."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd

        self.graphs = {"fw": [], "bw": []}

        def keep(kind):
            def compiler(gm, example_inputs):
                self.graphs[kind].append(gm)
                return gm.forward
            return compiler

        self.backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    def count(self, kind: str, name: str) -> int:
        return sum(
            1 for gm in self.graphs[kind] for n in gm.graph.nodes
            if n.op == "call_function" and name in str(n.target)
        )


def _mlp(hidden: int):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def _grads_vs_dense(tp, dense) -> None:
    for (n, p), (_, q) in zip(tp.named_parameters(), dense.named_parameters()):
        assert isinstance(p, ShardedTensor), n
        close(p.grad.full_tensor(), q.grad, msg=n)


def mlp(hidden: int, backend: str) -> dict:
    """Colwise then Rowwise 2-layer MLP: eager and compiled forward+backward equal dense."""
    mesh = _mesh()
    dense = _mlp(hidden)
    tp = parallelize(copy.deepcopy(dense), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    summary = {
        "weights": [repr(p.placements[0]) for p in tp.parameters()],
        "local rows": tp[0].weight.to_local().shape[0],
    }
    x = torch.randn(5, 6, generator=_gen(1))
    xd, xe, xc = (x.clone().requires_grad_(True) for _ in range(3))
    ref = dense(xd)
    ref.square().sum().backward()
    # Eager.
    out = tp(xe)
    assert type(out) is torch.Tensor
    close(out, ref)
    out.square().sum().backward()
    close(xe.grad, xd.grad)
    _grads_vs_dense(tp, dense)
    # Compiled, fullgraph, counted; the recorded graphs carry the collectives.
    tp.zero_grad(set_to_none=True)
    rec = _Record() if backend == "record" else None
    cnt = CompileCounterWithBackend(rec.backend if rec else backend)
    compiled = torch.compile(tp, backend=cnt, fullgraph=True)
    for _ in range(2):  # the second call reuses the graph
        tp.zero_grad(set_to_none=True)
        xc.grad = None
        out = compiled(xc)
        close(out, ref)
        out.square().sum().backward()
        close(xc.grad, xd.grad)
        _grads_vs_dense(tp, dense)
    summary["frames"] = cnt.frame_count
    # An optimizer step on the sharded parameters equals the dense step.
    opt_tp, opt_dense = (torch.optim.AdamW(m.parameters(), lr=0.1) for m in (tp, dense))
    opt_tp.step()
    opt_dense.step()
    for (n, p), (_, q) in zip(tp.named_parameters(), dense.named_parameters()):
        close(p.full_tensor(), q.detach(), msg=f"{n} after AdamW")
    if rec is not None:
        summary["fw all_reduce"] = rec.count("fw", "all_reduce")
        summary["bw all_reduce"] = rec.count("bw", "all_reduce")
        summary["fw waits"] = rec.count("fw", "wait_tensor")
    return summary


def compiled() -> dict:
    """ShardedTensors in and out of compiled regions: Partial outputs and their tangents,
    conversions inside the graph, views of inputs, dynamic global sizes (uneven shards)."""
    import symbolic

    mesh = _mesh()
    k, r = dist.get_world_size(), dist.get_rank()
    g = _gen(2)
    out = {}
    A, B = torch.randn(6, 4, generator=g), torch.randn(4, 5, generator=g)
    a = distribute(A, mesh, [Shard(1)]).requires_grad_(True)
    b = distribute(B, mesh, [Shard(0)]).requires_grad_(True)
    cnt = CompileCounterWithBackend("aot_eager")
    y = torch.compile(lambda a, b: a @ b, backend=cnt, fullgraph=True)(a, b)
    out["mm placements"] = repr(y.placements)
    close(y.full_tensor(), A @ B)
    y.full_tensor().sum().backward()  # the Partial output's tangent arrives Replicate
    da, db = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
    (da @ db).sum().backward()
    close(a.grad.full_tensor(), da.grad)
    close(b.grad.full_tensor(), db.grad)

    def convert(x):
        s = ShardedTensor.from_local(x, mesh, [Shard(0)], shape=(7, 3), stride=_strides((7, 3)))
        t = (s * 2 + 1).redistribute(mesh, [Replicate()])
        return t.to_local().sum(0), s.sum(0).full_tensor(), s.t()

    X = torch.randn(7, 3, generator=g)
    loc = list(X.chunk(k))[r].clone()
    cnt2 = CompileCounterWithBackend("aot_eager")
    r1, r2, r3 = torch.compile(convert, backend=cnt2, fullgraph=True)(loc)
    close(r1, (X * 2 + 1).sum(0))
    close(r2, X.sum(0))
    assert r3.placements == (Shard(1),) and r3.shape == (3, 7)
    close(r3.full_tensor(), X.t())

    # A view of an input returned from the graph keeps the placements it had in the trace.
    cnt3 = CompileCounterWithBackend("aot_eager")
    views = torch.compile(lambda s: (s[:, 1:], s[1:4], s.t()), backend=cnt3, fullgraph=True)(distribute(X, mesh, [Shard(0)]))
    out["view placements"] = [repr(v.placements) for v in views]
    for v, ref in zip(views, (X[:, 1:], X[1:4], X.t())):
        close(v.full_tensor(), ref)

    # A merge led by the sharded dim keeps the shard in the graph too (no gather), and its
    # backward (the split back) does as well.
    Y = torch.randn(4, 3, 5, generator=g)
    cnt5 = CompileCounterWithBackend("aot_eager")
    y = distribute(Y, mesh, [Shard(0)]).requires_grad_(True)
    merged = torch.compile(lambda t: t.reshape(12, 5) * 2, backend=cnt5, fullgraph=True)(y)
    out["merged placements"] = repr(merged.placements)
    close(merged.full_tensor(), Y.reshape(12, 5) * 2)
    (merged * merged).sum().backward()
    close(y.grad.full_tensor(), 8 * Y)  # d/dY of sum((2Y)^2)
    out["merged grad placements"] = repr(y.grad.placements)

    cnt4 = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda t: (t.relu() * 3).sum(1), backend=cnt4, fullgraph=True)
    for n in (8, 10, 11):
        T = torch.randn(n, 3, generator=g)
        t = distribute(T, mesh, [Shard(0)])
        symbolic.mark_dynamic(t, [0])
        close(fn(t).full_tensor(), (T.relu() * 3).sum(1))
    out["frames"] = [c.frame_count for c in (cnt, cnt2, cnt3, cnt4, cnt5)]
    return out


def equal_meshes() -> dict:
    """Two equal DeviceMeshes, made one after the other (as a docs example and a test in
    one process do): tensors built on the second resolve .device_mesh to the second."""
    from torch.distributed.device_mesh import init_device_mesh

    k = dist.get_world_size()
    d = torch.arange(4.0 * k)
    first = init_device_mesh("cpu", (k,))
    a = distribute(d, first, [Shard(0)])
    second = init_device_mesh("cpu", (k,))
    assert second is not first and second == first
    b = distribute(d, second, [Shard(0)])
    out = {"second": b.device_mesh is second, "same ref": a.mesh == b.mesh}
    # Handing the first in again makes it current.
    out["first again"] = distribute(d, first, [Shard(0)]).device_mesh is first
    out["values"] = bool(torch.equal(b.full_tensor(), d))
    return out
