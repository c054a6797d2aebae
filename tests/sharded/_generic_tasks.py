"""Rank tasks for the generic gathering fallback (ops without a sharding rule): values,
gradients, in-place and out= writes into shards, views that gathered, random ops, and the
same under torch.compile -- each against dense, raising on the first mismatch."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit import UnsupportedOpError
from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops import generic
from subclass_kit.sharded._ops.generic import gathered_ops

close = torch.testing.assert_close
aten = torch.ops.aten

LAYOUTS = {"Shard(0)": [Shard(0)], "Shard(1)": [Shard(1)], "Replicate()": [Replicate()]}


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


# Ops without a rule (each gathers), with dense meaning, differentiable.
def _fns():
    return {
        "take": lambda t: torch.take(t, torch.tensor([0, 7, 35, 12, 7])),
        "as_strided_scatter": lambda t: torch.as_strided_scatter(t, t[:2, :3] * 2, (2, 3), (6, 2), 1),
        "pdist": lambda t: torch.nn.functional.pdist(t),
    }


def values_and_grads(backend: str) -> dict:
    """Each rule-less op: value and gradient equal dense, eager and compiled (fullgraph);
    ``gathered_ops`` names the overloads that took the fallback."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(20)
    D = torch.randn(6, 6, generator=g)
    frames = {}
    paths = {}
    for name, fn in _fns().items():
        d = D.clone().requires_grad_(True)
        fn(d).sum().backward()
        for lname, pl in LAYOUTS.items():
            gathered_ops().clear()
            x = distribute(D, mesh, pl).requires_grad_(True)
            y = fn(x)
            close(y.full_tensor(), fn(D), msg=f"{name} of {lname}")
            y.sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {lname}")
            paths[name] = sorted(map(str, gathered_ops()))
            torch._dynamo.reset()  # one lambda code object serves every op: count afresh
            cnt = CompileCounterWithBackend(backend)
            x2 = distribute(D, mesh, pl).requires_grad_(True)
            out = torch.compile(lambda t: fn(t).sum(), backend=cnt, fullgraph=True)(x2)
            close(out.full_tensor(), fn(D).sum(), msg=f"compiled {name} of {lname}")
            out.backward()
            close(x2.grad.full_tensor(), d.grad, msg=f"compiled grad of {name} of {lname}")
            frames[f"{name} {lname}"] = cnt.frame_count
    return {"frames": frames, "paths": paths}


def writes() -> dict:
    """In-place and out= ops without a rule write this rank's part of the dense result into
    each written shard (placements kept); a view that gathered refuses a write."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(21)
    D = torch.randn(6, 4, generator=g)
    v = torch.randn(4, generator=g)
    res = {}
    for lname, pl in LAYOUTS.items():
        x = distribute(D, mesh, pl)
        x.zero_()  # no rule: gathered, written back shard by shard
        close(x.full_tensor(), torch.zeros(6, 4), msg=f"zero_ {lname}")
        res[f"zero_ {lname}"] = repr(x.placements)
        x = distribute(D, mesh, pl)
        out = distribute(torch.zeros(6), mesh, [Shard(0)] if lname != "Replicate()" else [Replicate()])
        torch.mv(x, distribute(v, mesh, [Replicate()]), out=out)
        close(out.full_tensor(), D @ v, msg=f"mv out= {lname}")
        res[f"mv out= {lname}"] = repr(out.placements)
    # A Partial destination keeps its Partial: the value lands on the first rank.
    p = ShardedTensor.from_local(torch.ones(3) * (dist.get_rank() + 1), mesh, [Partial("sum")])
    torch.ops.aten.zero_.default(p)
    close(p.full_tensor(), torch.zeros(3))
    res["zero_ partial"] = repr(p.placements)
    # Changing a shape in place is refused by name.
    x = distribute(D, mesh, [Shard(0)])
    x.as_strided_((4, 6), (6, 1))  # regroups the rows, the mesh divides both sizes: stays in place
    close(x.full_tensor(), D.reshape(4, 6))
    res["as_strided_ regroup"] = repr(x.placements)
    x = distribute(D, mesh, [Shard(0)])
    try:
        x.as_strided_((3, 8), (8, 1))  # its out-of-place form gathers a shard: no in-place view
        res["as_strided_"] = "ok"
    except UnsupportedOpError as e:
        res["as_strided_"] = "raises" if "as_strided_" in str(e) and "moves data" in str(e) else str(e)
    # out= of the wrong shape would resize: refused by name.
    bad = distribute(torch.zeros(5), mesh, [Replicate()])
    try:
        torch.mv(distribute(D, mesh, [Shard(0)]), distribute(v, mesh, [Replicate()]), out=bad)
        res["mv out= resize"] = "ok"
    except UnsupportedOpError as e:
        res["mv out= resize"] = "raises" if "resized" in str(e) else str(e)
    return res


def _inplace_views(t):
    y = t * 2  # an intermediate: in-place views of a leaf that requires grad are refused by torch
    y.squeeze_(0)
    y.t_()
    y.unsqueeze_(0)
    y.transpose_(1, 2)
    return y * t


def inplace_views(backend: str) -> dict:
    """In-place view ops on a shard or a Partial: the instance takes the placements of the
    out-of-place view (no data moves), values and gradients equal dense, eager and compiled."""
    mesh = _mesh()
    D = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(22))
    d = D.clone().requires_grad_(True)
    _inplace_views(d).sum().backward()
    res = {}
    for lname, pl in {"Shard(1)": [Shard(1)], "Shard(2)": [Shard(2)], "Partial": [Partial()]}.items():
        gathered_ops().clear()
        x = distribute(D, mesh, pl) if lname != "Partial" else ShardedTensor.from_local(D / 2, mesh, pl)
        x.requires_grad_(True)
        y = x * 2
        y.squeeze_(0)
        res[f"squeeze_ {lname}"] = repr(y.placements)
        y.t_()
        res[f"t_ {lname}"] = repr(y.placements)
        out = _inplace_views(x)
        close(out.full_tensor(), _inplace_views(D), msg=f"in-place views of {lname}")
        out.sum().backward()
        close(x.grad.full_tensor(), d.grad, msg=f"grad of in-place views of {lname}")
        res[f"gathered {lname}"] = sorted(map(str, gathered_ops()))
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        x2 = (distribute(D, mesh, pl) if lname != "Partial" else ShardedTensor.from_local(D / 2, mesh, pl))
        x2.requires_grad_(True)
        c = torch.compile(lambda t: _inplace_views(t).sum(), backend=cnt, fullgraph=True)(x2)
        close(c.full_tensor(), _inplace_views(D).sum(), msg=f"compiled in-place views of {lname}")
        c.backward()
        close(x2.grad.full_tensor(), d.grad, msg=f"compiled grad of in-place views of {lname}")
        res[f"frames {lname}"] = cnt.frame_count
    return res


def _losses():
    F = torch.nn.functional
    w = torch.rand(5, generator=torch.Generator().manual_seed(23)) + 0.5
    return {
        f"cross_entropy {red}{' weight' if wt else ''}{' ignore' if ig else ''}": (
            lambda t, y, red=red, wt=wt, ig=ig: F.cross_entropy(t, y, weight=w if wt else None, reduction=red, ignore_index=1 if ig else -100)
        )
        for red in ("mean", "sum", "none") for wt in (False, True) for ig in (False, True)
    } | {
        "nll_loss mean weight": lambda t, y: F.nll_loss(t.log_softmax(1), y, weight=w),
        # (N, C, H, W): nll_loss2d
        "cross_entropy 4-D none": lambda t, y: F.cross_entropy(t.reshape(8, 5, 1, 1), y.reshape(8, 1, 1), reduction="none"),
        "cross_entropy 4-D mean weight": lambda t, y: F.cross_entropy(t.reshape(8, 5, 1, 1), y.reshape(8, 1, 1), weight=w),
    }


def losses(backend: str) -> dict:
    """cross_entropy / nll_loss with the batch dim sharded: values and gradients equal dense,
    eager and compiled, without the gathering fallback; the per-row loss keeps the shard."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(24)
    D = torch.randn(8, 5, generator=g)
    Y = torch.randint(0, 5, (8,), generator=g)
    res = {}
    for name, fn in _losses().items():
        d = D.clone().requires_grad_(True)
        ref = fn(d, Y)
        (ref * ref).sum().backward()  # a non-uniform tangent for 'none'
        for lname, pl in {"Shard(0)": [Shard(0)], "Shard(1)": [Shard(1)], "Replicate()": [Replicate()]}.items():
            gathered_ops().clear()
            x = distribute(D, mesh, pl).requires_grad_(True)
            y = distribute(Y, mesh, [Replicate()])
            out = fn(x, y)
            close(out.full_tensor(), ref.detach(), msg=f"{name} of {lname}")
            (out * out).sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {lname}")
            res[f"{name} {lname}"] = (repr(out.placements), sorted(map(str, gathered_ops())))
            if lname != "Shard(0)":
                continue
            res[f"frames {name}"] = _compiled_frames(fn, distribute(D, mesh, pl), y, ref, d.grad, backend, name)
    return res


def _compiled_frames(fn, x, other, ref, ref_grad, backend: str, what: str) -> int:
    """``sum(fn(x, other) ** 2)`` compiled (fullgraph): its value and ``x``'s gradient equal
    the dense ``ref`` and ``ref_grad``; the frames compiled."""
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend(backend)
    x = x.requires_grad_(True)
    c = torch.compile(lambda t, u: (fn(t, u) ** 2).sum(), backend=cnt, fullgraph=True)(x, other)
    close(c.full_tensor(), (ref.detach() ** 2).sum(), msg=f"compiled {what}")
    c.backward()
    close(x.grad.full_tensor(), ref_grad, msg=f"compiled grad of {what}")
    return cnt.frame_count


def embeddings(backend: str) -> dict:
    """embedding with a Replicate table and sharded indices, a vocab-parallel (Shard(0)) table
    and a Shard(1) table: values and the table's gradient equal dense, eager and compiled,
    without the gathering fallback."""
    F = torch.nn.functional
    mesh = _mesh()
    g = torch.Generator().manual_seed(25)
    W = torch.randn(10, 4, generator=g)
    I = torch.randint(0, 10, (4, 3), generator=g)
    I[0, 0] = 3  # the padding row occurs
    layouts = {
        "R table, Shard(0) ids": ([Replicate()], [Shard(0)]),
        "Shard(0) table": ([Shard(0)], [Replicate()]),
        "Shard(1) table": ([Shard(1)], [Replicate()]),
    }
    res = {}
    for pad in (None, 3):
        def fn(w, i, pad=pad):
            return F.embedding(i, w, padding_idx=pad)

        d = W.clone().requires_grad_(True)
        ref = fn(d, I)
        (ref * ref).sum().backward()
        for lname, (wp, ip) in layouts.items():
            gathered_ops().clear()
            w = distribute(W, mesh, wp).requires_grad_(True)
            i = distribute(I, mesh, ip)
            out = fn(w, i)
            close(out.full_tensor(), ref.detach(), msg=f"{lname} pad={pad}")
            (out * out).sum().backward()
            close(w.grad.full_tensor(), d.grad, msg=f"grad {lname} pad={pad}")
            res[f"{lname} pad={pad}"] = (repr(out.placements), sorted(map(str, gathered_ops())))
            res[f"frames {lname} pad={pad}"] = _compiled_frames(fn, distribute(W, mesh, wp), i, ref, d.grad, backend,
                                                                f"{lname} pad={pad}")
    return res


def group_norms(backend: str) -> dict:
    """group_norm with the batch sharded: per-sample statistics, so values and gradients equal
    dense with no gather, eager and compiled; a channel shard is gathered by the rule."""
    F = torch.nn.functional
    mesh = _mesh()
    g = torch.Generator().manual_seed(26)
    D = torch.randn(4, 6, 5, generator=g)
    Wt, B = torch.randn(6, generator=g), torch.randn(6, generator=g)

    def fn(t, w, b):
        return F.group_norm(t, 3, w, b)

    d, dw, db = (a.clone().requires_grad_(True) for a in (D, Wt, B))
    ref = fn(d, dw, db)
    (ref * ref).sum().backward()
    res = {}
    for lname, pl in {"Shard(0)": [Shard(0)], "Shard(1)": [Shard(1)]}.items():
        gathered_ops().clear()
        x = distribute(D, mesh, pl).requires_grad_(True)
        w, b = (distribute(a, mesh, [Replicate()]).requires_grad_(True) for a in (Wt, B))
        out = fn(x, w, b)
        close(out.full_tensor(), ref.detach(), msg=f"group_norm {lname}")
        (out * out).sum().backward()
        for got, want, what in ((x, d, "input"), (w, dw, "weight"), (b, db, "bias")):
            close(got.grad.full_tensor(), want.grad, msg=f"{what} grad, group_norm {lname}")
        res[lname] = (repr(out.placements), sorted(map(str, gathered_ops())))
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        x2 = distribute(D, mesh, pl).requires_grad_(True)
        w2, b2 = (distribute(a, mesh, [Replicate()]).requires_grad_(True) for a in (Wt, B))
        c = torch.compile(lambda t, u, v: (fn(t, u, v) ** 2).sum(), backend=cnt, fullgraph=True)(x2, w2, b2)
        close(c.full_tensor(), (ref.detach() ** 2).sum(), msg=f"compiled group_norm {lname}")
        c.backward()
        for got, want, what in ((x2, d, "input"), (w2, dw, "weight"), (b2, db, "bias")):
            close(got.grad.full_tensor(), want.grad, msg=f"compiled {what} grad, group_norm {lname}")
        res[f"frames {lname}"] = cnt.frame_count
    return res


def mse_losses(backend: str) -> dict:
    """mse_loss of two operands on the same placements: one local op (a Partial sum when
    reduced over shards); values and gradients of both equal dense, eager and compiled."""
    F = torch.nn.functional
    mesh = _mesh()
    g = torch.Generator().manual_seed(27)
    A, B = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    res = {}
    for red in ("mean", "sum", "none"):
        def fn(a, b, red=red):
            return F.mse_loss(a, b, reduction=red)

        da, db = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
        ref = fn(da, db)
        (ref * ref).sum().backward()
        for lname, pl in {"Shard(0)": [Shard(0)], "Shard(1)": [Shard(1)], "Replicate()": [Replicate()]}.items():
            gathered_ops().clear()
            a, b = (distribute(t, mesh, pl).requires_grad_(True) for t in (A, B))
            out = fn(a, b)
            close(out.full_tensor(), ref.detach(), msg=f"mse {red} {lname}")
            (out * out).sum().backward()
            close(a.grad.full_tensor(), da.grad, msg=f"grad mse {red} {lname}")
            close(b.grad.full_tensor(), db.grad, msg=f"target grad mse {red} {lname}")
            res[f"{red} {lname}"] = (repr(out.placements), sorted(map(str, gathered_ops())))
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            a2, b2 = (distribute(t, mesh, pl).requires_grad_(True) for t in (A, B))
            c = torch.compile(lambda t, u: (fn(t, u) ** 2).sum(), backend=cnt, fullgraph=True)(a2, b2)
            close(c.full_tensor(), (ref.detach() ** 2).sum(), msg=f"compiled mse {red} {lname}")
            c.backward()
            close(a2.grad.full_tensor(), da.grad, msg=f"compiled grad mse {red} {lname}")
            close(b2.grad.full_tensor(), db.grad, msg=f"compiled target grad mse {red} {lname}")
            res[f"frames {red} {lname}"] = cnt.frame_count
    return res


def random_ops() -> dict:
    """Random ops without a rule: Replicate is equal on every rank; a shard is the dense
    op's value for it under the same seed."""
    mesh = _mesh()
    res = {}
    for lname, pl in LAYOUTS.items():
        for name, fn in {
            "normal_": lambda t: t.normal_(),
            "uniform_": lambda t: t.uniform_(-1, 1),
            "bernoulli_": lambda t: t.bernoulli_(0.3),
            "dropout": lambda t: torch.nn.functional.dropout(t, 0.5, training=True),
        }.items():
            torch.manual_seed(5)
            dense = fn(torch.ones(6, 4))
            x = distribute(torch.ones(6, 4), mesh, pl)
            torch.manual_seed(5)
            y = fn(x)
            close(y.full_tensor(), dense, msg=f"{name} {lname}")
            mine = torch.tensor(y.to_local().sum().item())
            both = [torch.zeros(()) for _ in range(dist.get_world_size())]
            dist.all_gather(both, mine)
            res[f"{name} {lname}"] = "same on every rank" if all(b == both[0] for b in both) else "differs"
    return res


def logged_once() -> list:
    """The messages the ``subclass_kit.sharded`` logger emitted for two calls of a rule-less op."""
    mesh = _mesh()
    records: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("subclass_kit.sharded")
    h = Keep()
    log.addHandler(h)
    generic._LOGGED.discard(aten.bincount.default)  # the shared world may have logged it already
    try:
        x = distribute(torch.tensor([1, 2, 2, 5]), mesh, [Shard(0)])
        torch.bincount(x)  # its length is the whole tensor's maximum: no rule
        torch.bincount(x)
    finally:
        log.removeHandler(h)
    return [m for m in records if "aten.bincount.default" in m]


def _rule_fns():
    F = torch.nn.functional
    g = torch.Generator().manual_seed(22)
    w, b, v = torch.randn(6, generator=g), torch.randn(6, generator=g), torch.randn(6, generator=g)
    tgt = torch.rand(4, 3, 6, generator=g)
    return {
        "layer_norm": lambda t: F.layer_norm(t, (6,), w, b),
        "var over last": lambda t: t.var(-1),
        "var_mean": lambda t: torch.var_mean(t, -1, keepdim=True)[0],
        "logsumexp": lambda t: torch.logsumexp(t, -1),
        "mse_loss": lambda t: F.mse_loss(t, tgt),
        "bce": lambda t: F.binary_cross_entropy(torch.sigmoid(t), tgt),
        "mv": lambda t: t @ v,
        "vector_norm": lambda t: torch.linalg.vector_norm(t, dim=-1),
    }


def rules_without_gather(backend: str) -> dict:
    """The rule families found from torch's metadata, the norm and decomposition rules: the
    value and gradient equal dense eagerly and compiled (fullgraph), and no op gathers
    through the generic fallback; the output keeps the input's shard where the math allows."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(23)
    D = torch.randn(4, 3, 6, generator=g)
    out = {}
    for name, fn in _rule_fns().items():
        d = D.clone().requires_grad_(True)
        fn(d).sum().backward()
        for lname, pl in {"Shard(0)": [Shard(0)], "Shard(1)": [Shard(1)]}.items():
            gathered_ops().clear()
            x = distribute(D, mesh, pl).requires_grad_(True)
            y = fn(x)
            close(y.full_tensor(), fn(D), msg=f"{name} of {lname}", atol=1e-5, rtol=1e-5)
            y.sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {lname}", atol=1e-5, rtol=1e-5)
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            x2 = distribute(D, mesh, pl).requires_grad_(True)
            z = torch.compile(lambda t: fn(t).sum(), backend=cnt, fullgraph=True)(x2)
            close(z.full_tensor(), fn(D).sum(), msg=f"compiled {name} of {lname}", atol=1e-4, rtol=1e-5)
            z.backward()
            close(x2.grad.full_tensor(), d.grad, msg=f"compiled grad of {name} of {lname}", atol=1e-5, rtol=1e-5)
            out[f"{name} {lname}"] = (repr(y.placements), sorted(map(str, gathered_ops())), cnt.frame_count)
    # dropout under sequence parallelism: the dense mask, shard by shard, eager and compiled
    for compiled in (False, True):
        torch._dynamo.reset()
        f = torch.nn.functional.dropout
        run = torch.compile(lambda t: f(t, 0.3) * 2, backend=backend, fullgraph=True) if compiled else (lambda t: f(t, 0.3) * 2)
        torch.manual_seed(9)
        dense = torch.nn.functional.dropout(torch.ones(4, 6, 6), 0.3) * 2
        x = distribute(torch.ones(4, 6, 6), mesh, [Shard(1)])
        torch.manual_seed(9)
        y = run(x)
        close(y.full_tensor(), dense, msg=f"dropout compiled={compiled}")
        out[f"dropout compiled={compiled}"] = repr(y.placements)
    return out
