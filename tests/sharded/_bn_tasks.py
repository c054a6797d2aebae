"""Rank tasks for batch norm and the variance over a sharded dim: each compares with dense
references every rank computes alike, raises on the first mismatch, and reports the
collectives issued (by name and size) so the tests can check that no activation moves."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Replicate, Shard, distribute
from subclass_kit.sharded._ops.generic import gathered_ops, whole_ops

from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close
F = torch.nn.functional

# (N, C, H, W): H odd, so a spatial shard is uneven on two ranks.
SHAPE = (4, 6, 5, 4)
LAYOUTS = {"Shard(0)": Shard(0), "Shard(2)": Shard(2), "Shard(1)": Shard(1), "Replicate()": Replicate()}


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _same_on_every_rank(t: torch.Tensor, what: str) -> None:
    got = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(got, t.contiguous())
    for g in got[1:]:
        assert torch.equal(g, got[0]), f"{what} differs between ranks"


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    C = SHAPE[1]
    return (torch.randn(SHAPE, generator=g), torch.randn(C, generator=g), torch.randn(C, generator=g),
            torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5, torch.randn(SHAPE, generator=g))


def batch_norms(backend: str, layouts=tuple(LAYOUTS)) -> dict:
    """F.batch_norm in training (running statistics updated in place) and eval, forward and
    backward (input, weight and bias gradients), with the input on each layout and the
    parameters and running statistics Replicate, against dense: eagerly and compiled
    (``backend``, fullgraph, twice with new values). Returns per layout the collectives
    (name -> largest size), the ops that gathered or were computed whole, and the frame count."""
    mesh = _mesh()
    res: dict = {}
    for lname in layouts:
        pl = [LAYOUTS[lname]]
        for training in (True, False):
            mode = "train" if training else "eval"
            comms = Comms()
            gathered_ops().clear()
            whole_ops().clear()
            for step in range(2):
                D, Wt, B, RM, RV, G = _data(40 + step)
                d, dw, db = (a.clone().requires_grad_(True) for a in (D, Wt, B))
                drm, drv = RM.clone(), RV.clone()
                ref = F.batch_norm(d, drm, drv, dw, db, training=training, momentum=0.3)
                (ref * G).sum().backward()
                x = distribute(D, mesh, pl).requires_grad_(True)
                w, b = (distribute(a, mesh, [Replicate()]).requires_grad_(True) for a in (Wt, B))
                rm, rv = (distribute(a, mesh, [Replicate()]) for a in (RM, RV))
                gw = distribute(G, mesh, pl)
                with comms:
                    out = F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3)
                    (out * gw).sum().backward()
                what = f"batch_norm {mode} {lname}"
                close(out.full_tensor(), ref.detach(), msg=what)
                assert out.placements == x.placements, (what, out.placements)
                for got, want, name in ((x, d, "input"), (w, dw, "weight"), (b, db, "bias")):
                    close(got.grad.full_tensor(), want.grad, msg=f"{name} grad, {what}")
                # The running statistics were written in place, the same on every rank.
                for got, want, name in ((rm, drm, "running_mean"), (rv, drv, "running_var")):
                    assert got.placements == (Replicate(),), (name, got.placements)
                    close(got.full_tensor(), want, msg=f"{name}, {what}")
                    _same_on_every_rank(got.to_local(), f"{name}, {what}")
            res[f"{mode} {lname}"] = {
                "comms": dict(comms.largest),
                "gathered": sorted(map(str, gathered_ops())),
                "whole": sorted(map(str, whole_ops())),
            }
        res[f"frames {lname}"] = _compiled(backend, mesh, pl, lname)
    # Running statistics held as plain tensors (a module whose buffers were not distributed):
    # updated in place from the whole statistics, alike on every rank.
    D, Wt, B, RM, RV, _ = _data(50)
    drm, drv, rm, rv = RM.clone(), RV.clone(), RM.clone(), RV.clone()
    F.batch_norm(D, drm, drv, Wt, B, training=True)
    F.batch_norm(distribute(D, mesh, [Shard(0)]), rm, rv, Wt, B, training=True)
    for got, want, name in ((rm, drm, "running_mean"), (rv, drv, "running_var")):
        close(got, want, msg=f"plain {name}")
        _same_on_every_rank(got, f"plain {name}")
    return res


def _compiled(backend, mesh, pl, lname) -> int:
    """One training step of a BatchNorm2d under torch.compile: values, gradients and the
    running statistics equal dense on two steps with new values; the frame count."""
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend(backend)

    def step(x, rm, rv, w, b, gw):
        return (F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3) * gw).sum()

    fn = torch.compile(step, backend=cnt, fullgraph=True)
    D, Wt, B, RM, RV, _ = _data(60)
    drm, drv = RM.clone(), RV.clone()
    rm, rv = (distribute(a, mesh, [Replicate()]) for a in (RM, RV))
    w, b = (distribute(a, mesh, [Replicate()]).requires_grad_(True) for a in (Wt, B))
    dw, db = (a.clone().requires_grad_(True) for a in (Wt, B))
    for s in range(2):
        D, _, _, _, _, G = _data(70 + s)
        d = D.clone().requires_grad_(True)
        ref = step(d, drm, drv, dw, db, G)
        ref.backward()
        x = distribute(D, mesh, pl).requires_grad_(True)
        out = fn(x, rm, rv, w, b, distribute(G, mesh, pl))
        what = f"compiled batch_norm {lname} step {s}"
        close(out.full_tensor(), ref.detach(), msg=what)
        out.backward()
        close(x.grad.full_tensor(), d.grad, msg=f"input grad, {what}")
        close(rm.full_tensor(), drm, msg=f"running_mean, {what}")
        close(rv.full_tensor(), drv, msg=f"running_var, {what}")
    # Gradients of the parameters accumulated over both steps.
    close(w.grad.full_tensor(), dw.grad, msg=f"weight grad, compiled {lname}")
    close(b.grad.full_tensor(), db.grad, msg=f"bias grad, compiled {lname}")
    return cnt.frame_count


def variances() -> dict:
    """var / std / var_mean / std_mean reducing a sharded dim (even and uneven shards, with
    corrections 0, 1 and one the count does not exceed, keepdim or not), values and the
    gradient of var_mean against dense; the placements of the results and the collectives."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(77)
    D = torch.randn(5, 6, 4, generator=g, dtype=torch.float64)
    res: dict = {}
    cases = {
        "var dim 0": lambda t: torch.var(t, 0),
        "var dims 0,2 keepdim": lambda t: torch.var(t, (0, 2), keepdim=True, correction=0),
        "std dim 1": lambda t: torch.std(t, 1),
        "std all": lambda t: torch.std(t),
        "var dim 0 correction 5": lambda t: torch.var(t, 0, correction=5),
        "var_mean dims 0,1": lambda t: torch.var_mean(t, (0, 1)),
        "std_mean dim 1 keepdim": lambda t: torch.std_mean(t, 1, keepdim=True, correction=2),
    }
    for lname, pl in {"Shard(0)": Shard(0), "Shard(1)": Shard(1)}.items():
        for name, fn in cases.items():
            x = distribute(D, mesh, [pl])
            comms = Comms()
            with comms:
                got = fn(x)
            want = fn(D)
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            for gt, wt in zip(got, want):
                close(gt.full_tensor(), wt, msg=f"{name} of {lname}", equal_nan=True)
            res[f"{name} of {lname}"] = ([repr(t.placements) for t in got], dict(comms.largest))
    # The gradient through var_mean over a sharded dim.
    d = D.clone().requires_grad_(True)
    v, m = torch.var_mean(d, (0, 2))
    (v * 3 + m).sum().backward()
    x = distribute(D, mesh, [Shard(0)]).requires_grad_(True)
    v, m = torch.var_mean(x, (0, 2))
    (v * 3 + m).sum().backward()
    close(x.grad.full_tensor(), d.grad, msg="var_mean gradient")
    return res
