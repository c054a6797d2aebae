"""Rank tasks for the layouts that shard one tensor dim over several mesh dims (nested
``[Shard(0), Shard(0)]``, FSDP-over-TP's ``[_StridedShard(0, sf), Shard(0)]``), Partial
``distribute`` and sub-meshes, each checked against torch's DTensor on the same layouts in
the same world (per-rank locals, collective counts) and against dense values."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Partial as TPartial, Replicate as TReplicate, Shard as TShard
from torch.distributed.tensor.placement_types import _StridedShard as TStrided

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, UnsupportedOpError, _StridedShard, distribute

from subclass_kit.sharded.placements import is_simple

from sharded._mesh2d_tasks import mesh
from sharded._tp_upstream_tasks import Comms
from sharded._meshes import strides as _strides

close = torch.testing.assert_close
R, P = Replicate(), Partial("sum")
S0, S1 = Shard(0), Shard(1)
SS = _StridedShard(0, split_factor=2)

#: The layouts of a 2-D tensor on the (2, 2) mesh: every simple one and the nested/strided.
LAYOUTS = [
    (R, R), (S0, R), (R, S0), (S1, R), (S0, S1), (S1, S0), (P, R), (S0, P), (P, S1),
    (S0, S0), (S1, S1), (SS, S0), (SS, R), (R, SS),
]


#: The moves FSDP over TP makes (all-gather for the forward, reduce-scatter back).
FSDP_MOVES = {((SS, S0), (R, S0)), ((R, S0), (SS, S0)), ((SS, S0), (R, R)), ((R, R), (SS, S0))}


def torch_placements(pl) -> list:
    """torch's placements for the kit's."""
    out = []
    for p in pl:
        if type(p) is _StridedShard:
            out.append(TStrided(p.dim, split_factor=p.split_factor))
        elif type(p) is Shard:
            out.append(TShard(p.dim))
        elif type(p) is Partial:
            out.append(TPartial(p.op))
        else:
            out.append(TReplicate())
    return out


def _pair(D, src, dst, anchor):
    """The kit's and DTensor's ``distribute(D, src).redistribute(dst)``: locals, counts,
    the full value and the gradient of a weighted sum of it."""
    m = mesh()
    w = torch.arange(D.numel(), dtype=D.dtype).reshape(D.shape) / D.numel()
    x = distribute(D, m, list(src)).requires_grad_(True)
    with Comms() as c:
        y = x.redistribute(m, list(dst))
    (y.full_tensor() * w).sum().backward()
    if not anchor:
        return x, y, c.total(), None, None, None, w
    t = distribute_tensor(D, m, torch_placements(src), src_data_rank=None).requires_grad_(True)
    with Comms() as ct:
        u = t.redistribute(m, torch_placements(dst))
    return x, y, c.total(), t, u, ct.total(), w


def redistribute_all() -> dict:
    """Every layout to every other (uneven sizes), kit vs DTensor vs dense."""
    bad, counts = [], {}
    for shape in ((8, 4), (7, 5), (3, 2)):
        D = torch.arange(shape[0] * shape[1], dtype=torch.float64).reshape(shape)
        for src in LAYOUTS:
            x0 = distribute(D, mesh(), list(src))
            t0 = distribute_tensor(D, mesh(), torch_placements(src), src_data_rank=None)
            if x0.to_local().shape != t0.to_local().shape or not torch.equal(x0.to_local(), t0.to_local()):
                bad.append(("distribute", shape, src, x0.to_local().tolist(), t0.to_local().tolist()))
            for dst in LAYOUTS:
                if any(p.is_partial() for p in dst) and not all(p.is_replicate() or p.is_partial() for p in src):
                    continue  # (torch refuses a shard to Partial)
                if is_simple(src) and is_simple(dst):
                    continue  # (test_mesh2d moves every simple layout to every other)
                name = (shape, src, dst)
                # DTensor refuses a move to Partial, and of the moves of a strided layout
                # gives right locals only for FSDP's (even sizes; the others raise or return
                # padded or permuted locals): there, dense is the reference alone.
                strided = any(type(p) is _StridedShard for p in (*src, *dst))
                anchor = not any(p.is_partial() for p in dst) and (
                    not strided or (shape == (8, 4) and (src, dst) in FSDP_MOVES))
                try:
                    x, y, n, t, u, nt, w = _pair(D, src, dst, anchor)
                except Exception as e:  # noqa: BLE001  (reported, not raised: every pair runs)
                    bad.append((name, f"{type(e).__name__}: {e}"[:300]))
                    continue
                if not torch.equal(y.full_tensor(), D):
                    bad.append((name, "full value"))
                if anchor and not torch.equal(y.to_local(), u.to_local()):
                    bad.append((name, "local vs DTensor", y.to_local().tolist(), u.to_local().tolist()))
                if not torch.equal(x.grad.full_tensor(), w):
                    bad.append((name, "gradient"))
                if anchor and n > nt:
                    bad.append((name, f"{n} collectives, DTensor {nt}"))
                counts[repr((shape, src, dst))] = (n, nt)
    return {"bad": bad, "pairs": len(counts)}


# ---- ops on nested and strided layouts ---------------------------------------------------
def _w(shape):
    return torch.linspace(-1, 1, int(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape)


#: op name -> (fn, dense inputs' shapes, which input takes the odd layout); each fn takes
#: ShardedTensors or plain tensors alike.
OPS = {
    "relu": (lambda x: torch.relu(x), [(7, 6)]),
    "add same layout": (lambda x, y: x + y * 2, [(7, 6), (7, 6)]),
    "add plain row": (lambda x, r: x + r, [(7, 6), (6,)]),
    "sum": (lambda x: x.sum(), [(7, 6)]),
    "sum dim 0": (lambda x: x.sum(0), [(7, 6)]),
    "mean dim 1": (lambda x: x.mean(1), [(7, 6)]),
    "matmul": (lambda x, w: x @ w, [(7, 6), (6, 3)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(7, 6)]),
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, (6,)), [(7, 6)]),
    "reshape": (lambda x: x.reshape(42), [(7, 6)]),
    "transpose": (lambda x: x.t().contiguous() * 1, [(7, 6)]),
    "slice": (lambda x: x[1:5] * 3, [(7, 6)]),
    "cat": (lambda x, y: torch.cat([x, y]), [(7, 6), (7, 6)]),
    "embedding": (lambda w: torch.nn.functional.embedding(torch.tensor([[0, 6], [3, 3]]), w), [(7, 6)]),
    "to float32": (lambda x: x.float().double(), [(7, 6)]),
}

ODD = {"nested": (S0, S0), "strided": (SS, S0), "nested dim 1": (S1, S1)}


def ops() -> dict:
    """Each op on each odd layout (every sharded operand placed alike; a second operand
    also simple): value and gradients equal dense; the result's placements reported."""
    out = {}
    m = mesh()
    for lname, pl in ODD.items():
        for name, (fn, shapes) in OPS.items():
            dense = [_w(s) * (i + 1) for i, s in enumerate(shapes)]
            ds = [d.clone().requires_grad_(True) for d in dense]
            ref = fn(*ds)
            ref.backward(_w(ref.shape) + 0.5)
            xs = []
            for i, d in enumerate(dense):
                layout = pl if d.dim() == 2 else (R, R)
                xs.append(distribute(d, m, list(layout)).requires_grad_(True))
            if name == "add plain row":
                xs[1] = dense[1]
            y = fn(*xs)
            close(y.full_tensor(), ref.detach(), msg=f"{lname} {name}")
            grad = distribute(_w(ref.shape) + 0.5, m, [R, R]).redistribute(m, list(y.placements)) \
                if not any(p.is_partial() for p in y.placements) else distribute(_w(ref.shape) + 0.5, m, [R, R])
            y.backward(grad)
            for i, (x, d) in enumerate(zip(xs, ds)):
                if isinstance(x, ShardedTensor):
                    close(x.grad.full_tensor(), d.grad, msg=f"{lname} {name}: gradient {i}")
            out[f"{lname} {name}"] = repr(tuple(y.placements))
    return out


def inplace() -> dict:
    """In-place ops on an odd layout write into its own local: a kept elementwise op, and
    ops the rules run on a moved copy (written back)."""
    m = mesh()
    out = {}
    for lname, pl in ODD.items():
        D = _w((7, 6))
        x = distribute(D.clone(), m, list(pl))
        x.mul_(2).add_(distribute(D.clone(), m, list(pl)))
        close(x.full_tensor(), D * 3, msg=f"{lname} mul_ add_")
        x.copy_(distribute(D * 5, m, [S1, R]))  # a source in another layout
        close(x.full_tensor(), D * 5, msg=f"{lname} copy_")
        # A write into a view the layout cannot give (a slice of a gathered copy) raises,
        # as it does on a simple layout, and leaves the tensor as it was.
        try:
            x[2:4] = 0.0
            wrote = "wrote"
        except UnsupportedOpError as e:
            wrote = "raised: " + str(e)[:80]
        close(x.full_tensor(), D * 5, msg=f"{lname} setitem")
        out[lname] = (repr(tuple(x.placements)), wrote)
    return out


# ---- sub-meshes: ranks outside the mesh -------------------------------------------------------
def _sub_mesh_results(cls, mesh, S, R_):
    """What upstream's three sub-mesh tests look at, for ``cls`` (the kit's ShardedTensor
    or torch's DTensor) on ``mesh``; plain values, to compare the two per rank."""
    out = {}
    # test_from_local_sub_mesh
    x = cls.from_local(torch.ones(3, 4), mesh, [S(0)])
    out["from_local size"] = tuple(x.size())
    out["from_local local"] = x.to_local().tolist()
    out["add local"] = (x + 2).to_local().tolist()
    # test_default_value_sub_mesh
    a = cls.from_local(torch.ones(4, 3), mesh, [S(0)])
    b = cls.from_local(torch.ones(4, 3), mesh, [S(0)])
    out["equal"] = a.equal(b)
    s = cls.from_local(torch.ones(4, 3), mesh, [S(0)]).sum()
    out["sum local"] = s.to_local().tolist()
    parts = cls.from_local(torch.ones(3, 4), mesh, [S(0)]).split([2, 2], dim=1)
    out["split locals"] = [p.to_local().tolist() for p in parts]
    # test_redistribute_sub_mesh
    sh = cls.from_local(torch.ones(4, 3), mesh, [S(0)])
    rep = sh.redistribute(placements=[R_()])
    out["redistribute local"] = rep.to_local().tolist()
    out["redistribute back local"] = rep.redistribute(placements=[S(0)]).to_local().tolist()
    return out


def sub_mesh() -> dict:
    """Upstream's test_from_local_sub_mesh, test_default_value_sub_mesh and
    test_redistribute_sub_mesh (test/distributed/tensor/test_dtensor.py), on the mesh of
    ranks [0, 2] of this 4-rank world, with the kit and with DTensor: the same per rank
    (ranks 1 and 3 hold empty locals and communicate nothing)."""
    from torch.distributed.device_mesh import DeviceMesh

    m = DeviceMesh("cpu", [0, 2])
    with Comms() as c:
        kit = _sub_mesh_results(ShardedTensor, m, Shard, Replicate)
    ref = _sub_mesh_results(DTensor, m, TShard, TReplicate)
    x = distribute(torch.arange(8.).reshape(4, 2), m, [S0])
    return {"kit": kit, "dtensor": ref, "collectives": c.total(),
            "distribute local": x.to_local().tolist(), "full": x.full_tensor().tolist()}


# ---- FSDP over TP: TP styles with parameters stored strided -----------------------------------
def fsdp_tp() -> dict:
    """Torch's FSDP2-over-TP recipe on the kit: ``parallelize`` an MLP on the tp mesh dim
    (Colwise then Rowwise), store each TP parameter sharded again over dp (its TP-sharded
    dim strided, ``[_StridedShard(d, tp), Shard(d)]``; a replicated bias ``[Shard(0),
    Replicate()]``), all-gather over dp in forward, run the TP module on a dp slice of the
    batch, and reduce-scatter the gradient (``Partial`` over dp) back into the stored layout.
    The stored gradients equal dense; the forward's all-gathers are DTensor's count for the
    same redistributions."""
    from subclass_kit.sharded import ColwiseParallel, RowwiseParallel, parallelize

    m = mesh()
    tp, dp_coord = m["b"], m.get_coordinate()[0]
    g = torch.Generator().manual_seed(5)
    dense = torch.nn.Sequential(torch.nn.Linear(8, 10), torch.nn.ReLU(), torch.nn.Linear(10, 6)).double()
    with torch.no_grad():
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(6, 8, generator=g, dtype=torch.float64)  # 6 rows over 2 dp ranks: 3 each
    dense(x).pow(2).sum().backward()

    model = parallelize(copy.deepcopy(dense), tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    stored, tp_layout = {}, {}
    for name, p in model.named_parameters():
        (q,) = p.placements
        tp_layout[name] = (q, tuple(p.shape))
        two_d = [_StridedShard(q.dim, split_factor=2), q] if q.is_shard() else [S0, R]
        stored[name] = distribute(p.full_tensor().detach(), m, two_d).requires_grad_(True)
    with Comms() as c:
        params = {}
        for name, w in stored.items():
            q, shape = tp_layout[name]
            local = w.redistribute(m, [R, q]).to_local(grad_placements=[P, q])
            params[name] = ShardedTensor.from_local(local, tp, [q], shape=shape, stride=_strides(tuple(shape)))
    gathers = c.total()
    rows = x.chunk(2)[dp_coord]
    y = torch.func.functional_call(model, params, (rows,))
    y.pow(2).sum().backward()
    for name, w in stored.items():
        close(w.grad.full_tensor(), dict(dense.named_parameters())[name].grad, msg=f"fsdp+tp gradient {name}")
    dts = [distribute_tensor(w.full_tensor().detach(), m, torch_placements(w.placements), src_data_rank=None)
           for w in stored.values()]
    with Comms() as ct:
        for t, (q, _) in zip(dts, tp_layout.values()):
            t.redistribute(m, torch_placements([R, q]))
    return {"stored": {n: repr(tuple(w.placements)) for n, w in stored.items()},
            "grads": {n: repr(tuple(w.grad.placements)) for n, w in stored.items()},
            "gathers": gathers, "dtensor gathers": ct.total()}


# ---- upstream's [Shard(0), Shard(0)] checks, ported to the (2, 2) mesh -----------------------
def upstream() -> dict:
    """PyTorch's checks of one tensor dim sharded by two mesh dims, each run on the kit and
    on DTensor (its upstream name is the key; 8-rank (2, 2, 2) meshes become (2, 2))."""
    m = mesh()
    out: dict = {}

    def both(fn):
        return fn(ShardedTensor, distribute, Shard, Replicate), fn(DTensor, distribute_tensor, TShard, TReplicate)

    # test/distributed/test_device_mesh.py::test_device_mesh_2d: the global size of a
    # from_local on [Shard(0), Shard(0)]
    out["test_device_mesh_2d"] = both(
        lambda cls, dist_, S, R_: tuple(cls.from_local(torch.ones(3, 3), m, [S(0), S(0)]).size()))
    # test/distributed/tensor/test_math_ops.py::test_full_shard_math_ops
    def full_shard_math(cls, dist_, S, R_):
        x = dist_(torch.ones(4, 4), m, [S(0), S(0)])
        return [op(x, 2).redistribute(m, [R_(), R_()]).to_local().tolist()
                for op in (torch.add, torch.sub, torch.mul, torch.div)]
    out["test_full_shard_math_ops"] = both(full_shard_math)
    # test/distributed/tensor/test_redistribute.py::test_redistribute_shard_dim_multi_dim_mesh
    # (its 3-D pairs on two mesh dims): locals and collective counts
    D = torch.randn(8, 8, 8, generator=torch.Generator().manual_seed(3))
    pairs = [((S0, S0), (S1, S1)), ((S0, S1), (S1, S0)), ((S1, S0), (S0, S0)),
             ((S1, R), (R, S0)), ((S0, S0), (S0, S1))]
    rows = []
    for src, dst in pairs:
        x = distribute(D, m, list(src))
        with Comms() as c:
            y = x.redistribute(m, list(dst))
        t = distribute_tensor(D, m, torch_placements(src))
        with Comms() as ct:
            u = t.redistribute(m, torch_placements(dst))
        rows.append((torch.equal(y.to_local(), u.to_local()), c.total(), ct.total()))
    out["test_redistribute_shard_dim_multi_dim_mesh"] = rows
    # test/distributed/tensor/test_redistribute.py::test_ordered_redistribute (default order):
    # dropping one mesh dim of a nested shard equals distributing to the target at once
    rows = []
    for src, dst in (((S0, S0), (R, S0)), ((S0, S0), (S0, R)), ((S0, S0), (S1, S0))):
        y = distribute(D, m, list(src)).redistribute(m, list(dst))
        rows.append(torch.equal(y.to_local(), distribute_tensor(D, m, torch_placements(dst)).to_local()))
    out["test_ordered_redistribute"] = rows
    # torch/distributed/tensor/_utils.py compute_local_shape_and_global_offset's example:
    # (8, 4) on [Shard(0), Shard(0)]: each rank holds its own rows, in rank order
    G = torch.arange(32.).reshape(8, 4)
    out["compute_local_shape_and_global_offset"] = both(
        lambda cls, dist_, S, R_: dist_(G, m, [S(0), S(0)]).to_local().tolist())
    # _StridedShard's docstring (placement_types.py): [_StridedShard(0, sf=2), Shard(0)] of an
    # (8, 8) tensor puts rows 0-1, 4-5, 2-3, 6-7 on ranks 0..3, and gathers back whole
    G = torch.arange(64.).reshape(8, 8)
    out["_StridedShard docstring"] = (
        distribute(G, m, [SS, S0]).to_local()[:, 0].tolist(),
        distribute_tensor(G, m, torch_placements([SS, S0])).to_local()[:, 0].tolist(),
        torch.equal(distribute(G, m, [SS, S0]).full_tensor(), G))
    # test/distributed/tensor/test_dtensor.py::test_from_local_uneven_sharding, nested: the
    # uneven locals of a (7, 3) tensor with shape= make the same global value as DTensor's
    G = torch.arange(21.).reshape(7, 3)
    mine = distribute(G, m, [S0, S0]).to_local()
    out["test_from_local_uneven_sharding"] = both(
        lambda cls, dist_, S, R_: cls.from_local(mine, m, [S(0), S(0)], shape=(7, 3), stride=(3, 1)).full_tensor().tolist())
    return out


def compiled() -> dict:
    """A chain on each odd layout compiled with aot_eager (fullgraph), twice with new values:
    values and gradients equal dense, one frame; and FSDP's all-gather of a strided
    parameter compiled: the TP shard, and its gradient reduce-scattered back strided."""
    from torch._dynamo.testing import CompileCounterWithBackend

    m = mesh()
    out = {}

    def chain(x, w):
        return (torch.relu(x * 2) @ w).sum(0)

    for lname, pl in ODD.items():
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        cf = torch.compile(chain, backend=cnt, fullgraph=True)
        for step in range(2):
            D, W = _w((8, 6)) + step, _w((6, 3)) - step
            d, dw = D.clone().requires_grad_(True), W.clone().requires_grad_(True)
            chain(d, dw).sum().backward()
            x = distribute(D, m, list(pl)).requires_grad_(True)
            w = distribute(W, m, [R, R]).requires_grad_(True)
            y = cf(x, w)
            close(y.full_tensor(), chain(D, W), msg=f"compiled {lname}")
            y.full_tensor().sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"compiled {lname}: gradient")
            close(w.grad.full_tensor(), dw.grad, msg=f"compiled {lname}: weight gradient")
        out[lname] = cnt.frame_count

    def gather(w):
        return w.redistribute(m, [R, S0]).to_local(grad_placements=[P, S0]) * 1.0

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(gather, backend=cnt, fullgraph=True)
    w = distribute(_w((8, 6)), m, [SS, S0]).requires_grad_(True)
    local = cf(w)
    close(local, _w((8, 6)).chunk(2)[m.get_coordinate()[1]])  # this rank's TP shard, whole over dp
    local.sum().backward()
    close(w.grad.full_tensor(), torch.ones(8, 6, dtype=torch.float64) * 2)  # summed over 2 dp ranks
    out["fsdp gather"] = (cnt.frame_count, repr(tuple(w.grad.placements)))
    return out
