"""Real subclasses through guards, symbolic and the checker: torchao 0.18 (CPU),
torch's jagged NestedTensor and DTensor (one-rank gloo group).

Every compile is counted with CompileCounter and laid beside what ``guards`` predicts
(``explain_recompiles(...).agrees``); the checker's failing rows on torchao's classes are
each a true statement about the class, asserted with its cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import guards
import symbolic
from foreign._foreign_classes import BY_NAME, CHECK_OPS, CLASSES, SIZES
from subclass_kit.testing import check_subclass

HERE = os.path.dirname(os.path.abspath(__file__))
IDS = [c.name for c in CLASSES]


def _ctx(t):
    return t.__tensor_flatten__()[1]


def _same(a, b):
    if a.is_nested:
        torch.testing.assert_close(a.values(), b.values())
    else:
        torch.testing.assert_close(a, b)


# ---- guards: build / check / explain -----------------------------------------------------------
@pytest.mark.parametrize("name", IDS)
def test_guards_build_check_explain(name):
    c = BY_NAME[name]
    a, a2, b = c.make(32), c.make(32), c.make(32, variant=True)
    g = guards.build(a)
    assert g.check(a2) and g.explain(a2) == []
    assert not g.check(b)
    lines = g.explain(b)
    if c.field is not None:
        # the one ctx field that changed is named, expected vs got; never the whole ctx
        old, new = _ctx(a)[c.field], _ctx(b)[c.field]
        want = f"__tensor_flatten__()[1][{c.field!r}]: expected {old!r}, got {new!r}"
        assert any(ln.endswith(want) for ln in lines), lines
        assert not any(repr(_ctx(a)) in ln for ln in lines), lines
    else:  # NestedTensor: one sequence more changes the batch and _offsets' length
        assert "L['x']._offsets.size()[0]: expected 3, got 4" in lines, lines
    # dynamo agrees: the same input reuses the graph, the variant recompiles
    x = c.x(32)
    rep = guards.explain_recompiles(c.op, [(x, a), (x, a2), (x, b)], backend="eager")
    assert rep.agrees, str(rep)
    assert rep.compiles == 2


# ---- cache_key across two fresh processes ------------------------------------------------------
def test_cache_keys_are_the_same_in_fresh_processes():
    procs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "_foreign_keys.py")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    for c in CLASSES:
        base, variant = outs[0][c.name]
        assert base == guards.cache_key(c.make(32)), c.name  # and equal to this process's
        assert base != variant, c.name


# ---- symbolic.mark_dynamic + compiled op over 3 sizes -------------------------------------------
@pytest.mark.parametrize("name", IDS)
def test_mark_dynamic_compiles_once_and_guards_agree(name):
    c = BY_NAME[name]
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(c.op, backend=cnt)
    calls, keys = [], []
    for rows in SIZES:
        t = c.make(rows)
        if c.pinned:
            # NF4 keeps tensor_meta.original_shape in its ctx: say so, and mark Dim.auto()
            with pytest.warns(symbolic.CtxPinsShapeWarning, match="original_shape"):
                symbolic.mark_dynamic(t, 0, **c.mark)
            t = c.make(rows)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", symbolic.CtxPinsShapeWarning)
                symbolic.mark_dynamic(t, {0: symbolic.Dim.auto()})
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", symbolic.CtxPinsShapeWarning)
                symbolic.mark_dynamic(t, 0, **c.mark)
        x = c.x(rows)
        _same(f(x, t), c.op(x, t))
        calls.append((x, t))
        keys.append(guards.cache_key(t))
    assert cnt.frame_count == (len(SIZES) if c.pinned else 1)
    assert len(set(keys)) == (len(SIZES) if c.pinned else 1)
    torch._dynamo.reset()
    rep = guards.explain_recompiles(c.op, calls, backend="aot_eager")
    assert rep.agrees, str(rep)
    assert rep.compiles == cnt.frame_count


# ---- the checker: no false verdict --------------------------------------------------------------
# Each failing row is a fact about torchao's class, with the words that say why.
_IGNORES_OUTER = {
    "protocol.round_trip_outer_stride": ("outer_stride was ignored",),
    "protocol.round_trip_symbolic": ("outer_size was ignored",),
}
TRUE_VERDICTS = {
    "Int8Tensor": _IGNORES_OUTER,
    "IntxUnpackedToInt8Tensor": _IGNORES_OUTER,
    "Float8Tensor": _IGNORES_OUTER,
    "NF4Tensor": {
        **_IGNORES_OUTER,
        # its unflatten takes the device from ctx['tensor_meta'], not from the inner tensors
        "protocol.round_trip_meta": ("the result is on cpu, expected meta",),
        # and deepcopy rebuilds with the default scaler_block_size (256), asserting on ours (16)
        "copy.deepcopy": ("AssertionError", "scaler_block_size 256"),
    },
    "Float8TrainingTensor": {
        **_IGNORES_OUTER,
        "export.round_trip": ("Unable to cast NotImplemented to Tensor",),
    },
    "OptimState8bit": {
        **_IGNORES_OUTER,
        "copy.deepcopy": ("aten.clone",),  # no clone handler
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in IDS if n in TRUE_VERDICTS])
def test_checker_says_only_true_things_about_torchao(name):
    c = BY_NAME[name]
    samples = [c.make(32), c.make(48), c.make(32, variant=True)]
    report = check_subclass(samples, ops=[CHECK_OPS[name]], backends=("aot_eager",))
    failed = {r.name: r.message for r in report.failures}
    assert set(failed) == set(TRUE_VERDICTS[name]), failed
    for row, words in TRUE_VERDICTS[name].items():
        assert all(w in failed[row] for w in words), (row, failed[row])
    status = {r.name: r.status for r in report.rows}
    # dict / list ctx: torch accepts it, so the ctx rows pass (with a note)
    assert status["ctx.hashable"] == status["ctx.immutable"] == "pass"
    assert "fine for torch" in report.row("ctx.hashable").message
    # the user's op compiles and, over sizes, compiles once -- except NF4, whose ctx holds
    # its shape: the sweep says so instead of failing the class for it
    assert status["compile[aot_eager]"] == "pass"
    sweep = report.row("compile.dynamic_sweep[aot_eager]")
    if c.pinned:
        assert sweep.status == "skip" and "stores its shape" in sweep.message, sweep.message
    else:
        assert sweep.status == "pass", sweep.message
    # the fresh-process hash row judges each class on its own (float8 storages travel as bytes)
    assert status["identity.stable_hash"] == "pass", report.row("identity.stable_hash").message


def test_dynamo_recompiles_a_copy_of_a_jagged_view_because_it_guards_base():
    # torch alone: nested_tensor() returns a view of its values buffer, dynamo guards
    # L['t']._base.size()[0]; an unflatten copy has no _base, that guard fails on None and the
    # copy compiles once -- a second copy reuses it (the ctx is equal to its copy's)
    c = BY_NAME["NestedTensor"]
    t = c.make(32)
    assert t._is_view()
    names, ctx = t.__tensor_flatten__()

    def copy():
        return type(t).__tensor_unflatten__({n: getattr(t, n) for n in names}, ctx, t.shape, t.stride())

    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(CHECK_OPS["NestedTensor"], backend=cnt)
    f(t)
    f(t)
    assert cnt.frame_count == 1
    f(copy())
    assert cnt.frame_count == 2
    f(copy())
    assert cnt.frame_count == 2
    # guards model the same _base guard: they refuse the copy for t's entry, accept a copy
    a, b = copy(), copy()
    assert any("L['x']._base" in ln for ln in guards.build(t).explain(a))
    assert guards.build(a).check(b)
    torch._dynamo.reset()
    rep = guards.explain_recompiles(CHECK_OPS["NestedTensor"], [(t,), (t,), (a,), (b,)], backend="aot_eager")
    assert rep.agrees and rep.compiles == 2, str(rep)


def test_checker_on_nested_tensor_says_only_true_things():
    c = BY_NAME["NestedTensor"]
    report = check_subclass([c.make(32), c.make(48)], ops=[CHECK_OPS["NestedTensor"]], backends=("aot_eager",))
    status = {r.name: r.status for r in report.rows}
    # the one failing row: torch's default hash pickles the nested int's per-process id
    assert [r.name for r in report.failures] == ["identity.stable_hash"], report.failures
    msg = report.row("identity.stable_hash").message
    assert "nested int" in msg and "per-process counter" in msg, msg
    # the copy recompile is dynamo's _base guard on a view, not the ctx
    assert status["compile[aot_eager]"] == "pass"
    assert "the sample is a view" in report.row("compile[aot_eager]").message
    # torch.export cannot take a jagged input in torch 2.13: said, not blamed on the class
    row = report.row("export.round_trip")
    assert row.status == "skip" and "nested int" in row.message and "not of the class" in row.message, row.message
    for name in ("protocol.round_trip_real", "protocol.round_trip_meta", "protocol.round_trip_fake", "ctx.hashable",
                 "serialization.save_load", "copy.deepcopy", "backward.compiled[aot_eager]"):
        assert status[name] == "pass", (name, report.row(name).message)
    # the rows dynamo never exercises on a jagged tensor say so instead of crashing
    report = check_subclass(c.make(32), backends=("eager",), only=["protocol.round_trip_outer_stride",
                                                                    "protocol.round_trip_symbolic"])
    assert all(r.status == "skip" and "jagged" in r.message for r in report.rows), report.rows


def test_newcomer_float8_class_passes_the_checker():
    from foreign._foreign_newcomer import Float8Scaled

    report = check_subclass(Float8Scaled, backends=("aot_eager",))
    report.raise_if_failed()
    status = {r.name: r.status for r in report.rows}
    for row in ("compile[aot_eager]", "compile.dynamic_sweep[aot_eager]", "export.round_trip",
                "serialization.save_load", "copy.deepcopy", "identity.stable_hash", "backward.compiled[aot_eager]"):
        assert status[row] == "pass", (row, report.row(row).message)


# ---- DTensor on a one-rank gloo group ----------------------------------------------------------
@pytest.fixture
def one_rank_group():
    import datetime
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_dtensor_guards_keys_and_one_compile(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    a = distribute_tensor(torch.randn(32, 64), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(32, 64), mesh, [Replicate()])
    g = guards.build(a)
    assert g.check(distribute_tensor(torch.randn(32, 64), mesh, [Shard(0)]))
    assert not g.check(b)
    assert any("._spec.placements: expected (Shard(dim=0),), got (Replicate(),)" in ln for ln in g.explain(b)), g.explain(b)
    assert guards.cache_key(a) != guards.cache_key(b)

    def op(x, w):
        return torch.nn.functional.linear(x, w)

    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(op, backend=cnt)
    calls, keys = [], []
    for rows in SIZES:
        w = distribute_tensor(torch.randn(rows, 64), mesh, [Replicate()])
        symbolic.mark_dynamic(w, 0)  # DTensor's spec is compared with shapes skipped: no warning
        x = distribute_tensor(torch.randn(4, 64), mesh, [Replicate()])
        torch.testing.assert_close(f(x, w).full_tensor(), op(x, w).full_tensor())
        calls.append((x, w))
        keys.append(guards.cache_key(w))
    assert cnt.frame_count == 1 and len(set(keys)) == 1
    torch._dynamo.reset()
    rep = guards.explain_recompiles(op, calls, backend="aot_eager")
    assert rep.agrees and rep.compiles == 1, str(rep)
