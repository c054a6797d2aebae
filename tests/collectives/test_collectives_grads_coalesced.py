"""Gradients of the plain collectives (torch 2.13's functional collectives pass them), the
wait of a pending input that requires grad, and the coalesced collectives, on 2 gloo ranks.

Each check compares with torch's own functional collectives or with a dense replay of
every rank's input, eagerly and compiled (``aot_eager``); one spawned world runs them all.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

import subclass_kit.collectives as kit

from kit_helpers.harness import world
from collectives._impls import rank_input

pytestmark = pytest.mark.dist

close = torch.testing.assert_close


def _grads_like_torch() -> dict:
    """Plain collectives on an input that requires grad: values and gradients equal torch's
    functional collectives on the same input (eager), and the kit's compiled run."""
    import torch.distributed._functional_collectives as fc

    k, r = dist.get_world_size(), dist.get_rank()
    W = dist.group.WORLD
    weight = torch.arange(1.0, 9.0).reshape(4, 2) * (r + 1)  # a different loss on every rank
    cases = {
        "all_reduce sum": (lambda x: kit.all_reduce(x, "sum"), lambda x: fc.all_reduce(x, "sum", W), (4, 2)),
        "all_gather dim0": (lambda x: kit.all_gather_tensor(x, 0), lambda x: fc.all_gather_tensor(x, 0, W), (2, 2)),
        "reduce_scatter sum": (lambda x: kit.reduce_scatter_tensor(x, "sum", 0),
                               lambda x: fc.reduce_scatter_tensor(x, "sum", 0, W), (8, 2)),
        "all_to_all": (lambda x: kit.all_to_all_single(x, None, None),
                       lambda x: fc.all_to_all_single(x, None, None, W), (4, 2)),
    }
    out = {}
    for name, (ours, theirs, shape) in cases.items():
        x0 = rank_input(r, shape)

        def loss(fn, x):
            y = fn(x)
            y = y.wait() if hasattr(y, "wait") else y
            return (y * weight[: y.size(0)]).sum()

        xa, xb, xc = (x0.clone().requires_grad_(True) for _ in range(3))
        la, lb = loss(ours, xa), loss(theirs, xb)
        close(la, lb)
        la.backward()
        lb.backward()
        assert xa.grad is not None, f"{name}: the kit gave no gradient"
        close(xa.grad, xb.grad, msg=name)
        cnt = CompileCounterWithBackend("aot_eager")
        lc = torch.compile(lambda x: loss(ours, x), backend=cnt, fullgraph=True)(xc)
        lc.backward()
        close(xc.grad, xb.grad, msg=f"{name} compiled")
        out[name] = cnt.frame_count
    # avg: torch raises in its backward; the kit gives the adjoint all_reduce(grad, avg).
    x = rank_input(r, (3,)).requires_grad_(True)
    (kit.all_reduce(x, "avg") * (r + 1)).sum().backward()
    close(x.grad, torch.full((3,), sum(range(1, k + 1)) / k))
    # Under no_grad nothing is recorded; broadcast of a grad-requiring input is a named error.
    with torch.no_grad():
        assert not kit.all_reduce(torch.ones(2, requires_grad=True), "sum").requires_grad
    try:
        kit.broadcast(torch.ones(2, requires_grad=True), 0)
    except kit.CollectiveArgumentError as e:
        out["broadcast"] = "detach" in str(e)
    else:
        out["broadcast"] = "no error"
    return out


def _capture(min_cut: bool = False):
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []
    extra = {"partition_fn": min_cut_rematerialization_partition} if min_cut else {}

    def backend(gm, inputs):
        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g.forward)

        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep, **extra)

    return backend, graphs


def _waits_of_pending_grad_inputs() -> dict:
    """A pending AsyncCollectiveTensor that requires grad, as a compiled input: its forward
    graph waits for it exactly once, however the body uses it, and the gradient is right."""
    k, r = dist.get_world_size(), dist.get_rank()
    x = rank_input(r, (4, 6))
    want = sum(rank_input(q, (4, 6)) for q in range(k))
    W = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    bodies = {
        "square": lambda a: (a * a).sum(),
        "two uses": lambda a: (a + 1).sum() + a.mean(),
        "view first": lambda a: a.view(24).sum(),
        "linear": lambda a: torch.nn.functional.linear(a, W).sum(),
        "detach and use": lambda a: (a.detach() * a).sum(),
    }
    out = {}
    for (name, body), min_cut in [(kv, mc) for kv in bodies.items() for mc in (False, True)]:
        torch._dynamo.reset()
        backend, graphs = _capture(min_cut)  # the min-cut partitioner retraces the joint
        xr = x.clone().requires_grad_(True)
        pending_in = kit.all_reduce(xr, "sum")  # differentiable: xr requires grad
        assert type(pending_in) is kit.AsyncCollectiveTensor and pending_in.requires_grad
        loss = torch.compile(body, backend=backend, fullgraph=True)(pending_in)
        dense = want.clone().requires_grad_(True)
        ref = body(dense)
        close(loss, ref)
        loss.backward()
        ref.backward()
        close(xr.grad, k * dense.grad, msg=name)  # all_reduce's adjoint sums every rank's grad
        out[f"{name}{' min-cut' if min_cut else ''}"] = str(graphs[0].code).count("_c10d_functional.wait_tensor.default(")
    return out


def _coalesced() -> dict:
    """The coalesced collectives equal a dense replay of every rank's inputs, eagerly and
    compiled, and the compiled graph issues one coalesced op."""
    k, r = dist.get_world_size(), dist.get_rank()
    shapes = [(2 * k, 3), (k, 2, 2), (2 * k,)]
    xs = [rank_input(r, s, seed=i) for i, s in enumerate(shapes)]
    every = [[rank_input(q, s, seed=i) for q in range(k)] for i, s in enumerate(shapes)]
    sums = [torch.stack(e).sum(0) for e in every]
    dense = {
        "all_reduce max": [torch.stack(e).amax(0) for e in every],
        "all_gather": [torch.cat(e, 0) for e in every],
        "reduce_scatter": [torch.chunk(sums[0], k, 0)[r], torch.chunk(sums[1], k, 1)[r], torch.chunk(sums[2], k, 0)[r]],
    }
    fns = {
        "all_reduce max": lambda ts: kit.all_reduce_coalesced(ts, "max"),
        "all_gather": lambda ts: kit.all_gather_into_tensor_coalesced(ts),
        "reduce_scatter": lambda ts: kit.reduce_scatter_tensor_coalesced(ts, "sum", [0, 1, 0]),
    }
    out = {}
    for name, fn in fns.items():
        res = fn(xs)
        assert all(type(t) is kit.AsyncCollectiveTensor for t in res), name
        for got, want in zip(res, dense[name]):
            close(got.trigger_wait(), want, msg=name)
        torch._dynamo.reset()
        backend, graphs = _capture()
        cnt = CompileCounterWithBackend(backend)
        res = torch.compile(lambda a, b, c: [t * 1 for t in fn([a, b, c])], backend=cnt, fullgraph=True)(*xs)
        for got, want in zip(res, dense[name]):
            close(got, want, msg=f"{name} compiled")
        code = str(graphs[0].code)
        out[name] = (cnt.frame_count, code.count("_coalesced.default("), code.count("wait_tensor.default("))
    try:
        kit.all_reduce_coalesced([torch.ones(2, requires_grad=True)], "sum")
    except kit.CollectiveArgumentError as e:
        out["grad input"] = "all_reduce_autograd" in str(e)
    try:
        kit.reduce_scatter_tensor_coalesced([torch.ones(3)], "sum")
    except kit.CollectiveArgumentError as e:
        out["indivisible"] = "divisible by the group size" in str(e)
    return out


def _all_checks() -> dict:
    return {"grads": _grads_like_torch(), "waits": _waits_of_pending_grad_inputs(), "coalesced": _coalesced()}


def test_plain_collectives_grads_waits_and_coalesced():
    results = world(2).run(_all_checks, timeout=240)
    assert results[0] == results[1]
    res = results[0]
    grads = res["grads"]
    assert grads.pop("broadcast") is True
    assert grads == {"all_reduce sum": 1, "all_gather dim0": 1, "reduce_scatter sum": 1, "all_to_all": 1}
    # One wait per pending input, never a second unused one.
    names = ["square", "two uses", "view first", "linear", "detach and use"]
    assert res["waits"] == dict.fromkeys(names + [f"{n} min-cut" for n in names], 1)
    co = res["coalesced"]
    assert co.pop("grad input") is True and co.pop("indivisible") is True
    # One frame, one coalesced op, one wait per result (3 tensors).
    assert co == dict.fromkeys(["all_reduce max", "all_gather", "reduce_scatter"], (1, 1, 3))
