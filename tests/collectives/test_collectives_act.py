"""AsyncCollectiveTensor: when it waits, what it returns, and how it enters compiled graphs.

Waits are counted as calls to the native ``_c10d_functional::wait_tensor`` op (recorded by
torch's profiler, which sees every dispatcher call, including those made inside a
``__torch_dispatch__``), and as the number of unwaited collectives in c10d's work registry.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from expecttest import assert_expected_inline
from torch.profiler import ProfilerActivity, profile

import subclass_kit
import subclass_kit.collectives as kit
from subclass_kit import _compat

from kit_helpers.harness import World, world
from collectives._impls import IMPLS, plain, rank_input

pytestmark = pytest.mark.dist


def _waits(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    return sum(1 for e in p.events() if e.name == "_c10d_functional::wait_tensor")


def _check_waiting(impl_name: str):
    I = IMPLS[impl_name]
    n, rank = dist.get_world_size(), dist.get_rank()
    x = rank_input(rank, (4, 6))
    want = sum(rank_input(r, (4, 6)) for r in range(n))
    report = {}

    a = I.all_reduce(x, "sum")
    assert type(a) is I.act_type
    assert _compat.work_registry_size() == 1

    views = {}
    report["views wait"] = _waits(lambda: views.update(
        view=a.view(24), t=a.t(), detach=a.detach(), select=a[1], slice=a[:, 2:],
        transpose=a.transpose(0, 1), unsqueeze=a.unsqueeze(0), expand=a.unsqueeze(0).expand(3, 4, 6),
        split=a.split(2), view_of_view=a.view(2, 12).view(24),
    ))
    report["view types"] = sorted({
        type(v).__name__ for vs in views.values() for v in (vs if isinstance(vs, tuple) else (vs,))
    })
    report["pending after views"] = _compat.work_registry_size()

    outs = []
    report["two data uses wait"] = _waits(lambda: outs.extend([a + 1, a * 2]))
    report["compute result type"] = sorted({type(o).__name__ for o in outs})
    torch.testing.assert_close(outs[0], want + 1)
    torch.testing.assert_close(outs[1], want * 2)
    report["pending after use"] = _compat.work_registry_size()
    # A view taken before the wait still reads the right values.
    torch.testing.assert_close(plain(views["t"]), want.t())

    b = I.all_reduce(x, "sum")
    text = []
    report["repr waits"] = _waits(lambda: text.append(repr(b)))
    assert text[0].startswith("AsyncCollectiveTensor("), text[0]
    report["print waits"] = _waits(lambda: print(I.all_reduce(x, "sum"), file=open(os.devnull, "w")))

    c = I.all_reduce(x, "sum")
    got = []
    report["tolist waits"] = _waits(lambda: got.append(c.tolist()))
    assert got[0] == want.tolist() or torch.allclose(torch.tensor(got[0]), want)
    d = I.all_reduce(x, "sum")
    report["numpy waits"] = _waits(lambda: got.append(d.numpy()))
    torch.testing.assert_close(torch.from_numpy(got[-1]), want)
    e = I.all_reduce(x[0, :1].reshape(()), "sum")
    report["item waits"] = _waits(lambda: got.append(e.item()))
    assert abs(got[-1] - want[0, 0].item()) < 1e-5

    f = I.all_reduce(x, "sum")
    w = []
    report["trigger_wait waits"] = _waits(lambda: w.append(f.trigger_wait()))
    report["trigger_wait type"] = type(w[0]).__name__
    torch.testing.assert_close(w[0], want)
    report["second trigger_wait waits"] = _waits(lambda: f.trigger_wait())

    g = I.all_reduce(x, "sum")
    report["wait_tensor type"] = type(I.wait(g)).__name__
    report["pending at end"] = _compat.work_registry_size()
    return report


@pytest.mark.parametrize("impl", ["kit", "torch"])
def test_waiting(impl):
    reports = world(2).run(_check_waiting, impl)
    name = IMPLS[impl].act_type.__name__
    for r in reports:
        assert r == {
            "views wait": 0,
            "view types": [name],
            "pending after views": 1,
            "two data uses wait": 1,
            "compute result type": ["Tensor"],
            "pending after use": 0,
            "repr waits": 1,
            "print waits": 1,
            "tolist waits": 1,
            "numpy waits": 1,
            "item waits": 1,
            "trigger_wait waits": 1,
            "trigger_wait type": "Tensor",
            "second trigger_wait waits": 0,
            "wait_tensor type": "Tensor",
            "pending at end": 0,
        }, r


# ---- where the kit deliberately does better than torch ---------------------------------


def _check_kit_extras():
    n, rank = dist.get_world_size(), dist.get_rank()
    x = rank_input(rank, (4, 6))
    out = {}

    # One pending wait is shared by a result and its views: the collective is waited once.
    a = kit.all_reduce(x, "sum")
    v = a.view(24)
    out["base and view used"] = _waits(lambda: (v + 1, a + 1))
    out["completed"] = (a.completed, v.completed)

    # The finalizer: unwaited results that are collected are waited, nothing leaks.
    b = kit.all_reduce(x, "sum")
    w = b.t()
    del b
    gc.collect()
    out["pending while a view lives"] = _compat.work_registry_size()
    del w
    gc.collect()
    out["pending after collection"] = _compat.work_registry_size()
    for _ in range(5):
        kit.all_gather_tensor(x, 0).view(-1)
    gc.collect()
    out["pending after unwaited loop"] = _compat.work_registry_size()
    return out


def test_kit_waits_once_per_collective_and_finalizes():
    for r in world(2).run(_check_kit_extras):
        assert r == {
            "base and view used": 1,
            "completed": (True, True),
            "pending while a view lives": 1,
            "pending after collection": 0,
            "pending after unwaited loop": 0,
        }, r


_EXIT_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import subclass_kit.collectives as kit
keep = kit.all_reduce(torch.ones(4), "sum")  # never used
view = keep.view(2, 2)  # an autograd view keeps `keep` alive from C++ until exit
"""


def test_exit_with_unwaited_result_is_waited():
    """A result still referenced at exit is waited before c10d tears down: no warning.

    Needs real interpreter shutdown, so this is a fresh interpreter, not a forked rank (a
    multiprocessing child ends with os._exit and never runs exit handlers). torch 2.13
    warns "unwaited collective calls" for the same program with its own collectives.
    """
    p = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "unwaited collective calls" not in p.stderr, p.stderr


def _collected_unwaited(impl_name: str):
    x = torch.ones(8)
    for _ in range(3):
        IMPLS[impl_name].all_reduce(x, "sum").view(2, 4)  # result dropped unwaited
    gc.collect()
    return _compat.work_registry_size()


def test_collected_unwaited_results_do_not_leak():
    # A one-rank world of its own: torch's leaked entries would stay in a shared world.
    w = World(1)
    try:
        assert w.run(_collected_unwaited, "kit") == [0]
        assert w.run(_collected_unwaited, "torch") == [3]  # torch 2.13 has no finalizer
    finally:
        w.close()


# ---- compiled regions ----------------------------------------------------------------


def _capture():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, inputs):
        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g.forward)

        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

    return backend, graphs


def _graph_code(g) -> str:
    return "\n".join(line for line in g.code.strip().splitlines() if line.strip())


def _check_graph_input_waits():
    rank = dist.get_rank()
    x = rank_input(rank, (4, 6))
    want = sum(rank_input(r, (4, 6)) for r in range(dist.get_world_size()))
    codes = {}

    backend, graphs = _capture()
    f = torch.compile(lambda a: (a + 1).sum(0), backend=backend, fullgraph=True)
    torch.testing.assert_close(f(kit.all_reduce(x, "sum")), (want + 1).sum(0))
    codes["uses data"] = _graph_code(graphs[0])

    # Nothing uses the input's data: the wait must survive dead-code elimination anyway.
    torch._dynamo.reset()
    backend, graphs = _capture()
    f = torch.compile(lambda a, b: (a.view(24), b * 2)[1], backend=backend, fullgraph=True)
    a = kit.all_reduce(x, "sum")
    f(a, x)
    codes["data unused"] = _graph_code(graphs[0])
    out = {"pending after unused-input call": _compat.work_registry_size()}

    # Training: the input carries autograd history from an autograd collective.
    torch._dynamo.reset()
    backend, graphs = _capture()
    xr = x.clone().requires_grad_()
    f = torch.compile(lambda a: (a * a).sum(), backend=backend, fullgraph=True)
    f(kit.all_reduce_autograd(xr, "sum")).backward()
    codes["training forward"] = _graph_code(graphs[0])
    torch.testing.assert_close(xr.grad, 2 * dist.get_world_size() * want)

    # A view of the input returned from the graph: a plain tensor, and backward works.
    torch._dynamo.reset()
    xr.grad = None
    f = torch.compile(lambda a: a.view(24), backend="aot_eager", fullgraph=True)
    y = f(kit.all_reduce_autograd(xr, "sum"))
    out["view output type"] = type(y).__name__
    (y * 3).sum().backward()
    torch.testing.assert_close(xr.grad, torch.full((4, 6), 3.0 * dist.get_world_size()))
    out["codes"] = codes
    return out


def test_graph_input_becomes_wait_at_graph_start():
    res = world(2).run(_check_graph_input_waits)
    assert res[0] == res[1]
    r = res[0]
    assert r["pending after unused-input call"] == 0
    assert r["view output type"] == "Tensor"
    codes = r["codes"]
    assert_expected_inline(codes["uses data"], """\
def forward(self, arg0_1):
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default(arg0_1);  arg0_1 = None
    add = torch.ops.aten.add.Tensor(wait_tensor, 1);  wait_tensor = None
    sum_1 = torch.ops.aten.sum.dim_IntList(add, [0]);  add = None
    return (sum_1,)""")
    assert_expected_inline(codes["data unused"], """\
def forward(self, arg0_1, arg1_1):
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default(arg0_1);  arg0_1 = wait_tensor = None
    mul = torch.ops.aten.mul.Tensor(arg1_1, 2);  arg1_1 = None
    return (mul,)""")
    assert_expected_inline(codes["training forward"], """\
def forward(self, primals_1):
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default(primals_1);  primals_1 = None
    mul = torch.ops.aten.mul.Tensor(wait_tensor, wait_tensor)
    sum_1 = torch.ops.aten.sum.default(mul);  mul = None
    return (sum_1, wait_tensor)""")


def _check_export_non_strict():
    seen = []

    class M(torch.nn.Module):
        def forward(self, x):
            seen.append(subclass_kit.is_compiling())
            return kit.all_reduce(x, "sum") * 2

    ep = torch.export.export(M(), (torch.ones(3),), strict=False)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    out = ep.module()(torch.ones(3))
    return seen, targets, type(out).__name__, out.tolist()


def test_export_non_strict_traces_collective_and_wait():
    for seen, targets, kind, values in world(2).run(_check_export_non_strict):
        assert seen == [True]
        assert "_c10d_functional.all_reduce.default" in targets
        assert "_c10d_functional.wait_tensor.default" in targets
        assert kind == "Tensor" and values == [4.0, 4.0, 4.0]


def test_views_alias_their_base_at_the_wrapper_level():
    # The view schema says the result aliases its input; AOTAutograd tells views of
    # inputs from new tensors by the wrapper's storage, so a view must share it.
    # (An ACT over a plain buffer has nothing pending: no process group needed.)
    x = kit.AsyncCollectiveTensor(torch.randn(4, 4))
    base = x.untyped_storage()._cdata
    for name, view in [
        ("view", lambda t: t.view(16)),
        ("t", lambda t: t.t()),
        ("detach", lambda t: t.detach()),
        ("slice", lambda t: t[1:]),
        ("unbind", lambda t: t.unbind(0)[0]),
    ]:
        y = view(x)
        assert type(y) is kit.AsyncCollectiveTensor, name
        assert y.untyped_storage()._cdata == base, name


def test_views_on_the_slow_path_alias_their_base_too():
    # A view call with keyword arguments takes the general path; it must share the base's
    # wrapper-level storage and pending wait exactly as the positional fast path does.
    x = kit.AsyncCollectiveTensor(torch.randn(4, 4))
    y = torch.ops.aten.expand.default(x, [2, 4, 4], implicit=True)
    assert type(y) is kit.AsyncCollectiveTensor
    assert y.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert y._pending is x._pending and not y.completed
    y + 1
    assert x.completed
