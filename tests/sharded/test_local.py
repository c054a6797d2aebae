"""In-process: a one-rank mesh needs no process group, and a k-rank mesh *descriptor* is
enough for everything that does not communicate (construction, shape checks, errors).
Values on one rank equal the dense computation; bad input fails where it is made, naming
the tensor and the fix."""

from __future__ import annotations

import copy

import pytest
import torch
from expecttest import assert_expected_inline
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit import UnsupportedOpError
from subclass_kit.sharded import (
    ColwiseParallel,
    MeshError,
    MeshRef,
    ParallelizeError,
    Partial,
    PrepareModuleInput,
    PrepareModuleOutput,
    PlacementError,
    Replicate,
    RowwiseParallel,
    Shard,
    ShardedTensor,
    ShardShapeError,
    distribute,
    parallelize,
)
from subclass_kit.testing import check_subclass

from sharded._meshes import fake_mesh
from sharded._meshes import strides as _strides

LOCAL = MeshRef.local()


def _msg(exc_type, fn) -> str:
    with pytest.raises(exc_type) as info:
        fn()
    return str(info.value)


def test_from_local_bad_input_names_the_tensor_and_the_fix():
    m2 = fake_mesh(2)  # this process is rank 0 of it: coordinate (0,)
    local = torch.zeros(3, 4)
    assert_expected_inline(_msg(ShardShapeError, lambda: ShardedTensor.from_local(local, m2, [Shard(0)], shape=(8, 4), stride=_strides((8, 4)))), """\
ShardedTensor.from_local: the local tensor (shape (3, 4)) is not this rank's shard of a global tensor of shape (8, 4) with placements (Shard(0),) at mesh coordinate (0,) of a (2,) mesh: expected local shape (4, 4); dim 0 (size 8) is split over 2 ranks of mesh dim 0 as torch.chunk does, so coordinate 0 holds 4, not 3. Pass shape= with the true global shape (the same on every rank), or fix the local tensor.""")
    assert "dim 1 is not sharded, so the local size must be the global 5, not 4" in _msg(
        ShardShapeError, lambda: ShardedTensor.from_local(local, m2, [Shard(0)], shape=(6, 5), stride=_strides((6, 5))))
    assert "has 3 dims but the local tensor has 2" in _msg(
        ShardShapeError, lambda: ShardedTensor.from_local(local, m2, [Shard(0)], shape=(6, 4, 1), stride=_strides((6, 4, 1))))
    assert_expected_inline(_msg(PlacementError, lambda: ShardedTensor.from_local(local, m2, [Shard(0), Replicate()])), """\
ShardedTensor.from_local: got 2 placements (Shard(0), Replicate()) for a 1-D mesh; pass exactly one placement per mesh dimension (1).""")
    assert_expected_inline(_msg(PlacementError, lambda: ShardedTensor.from_local(local, m2, [Shard(-3)])), """\
ShardedTensor.from_local: placements[0] = Shard(-3) is out of range for a 2-D tensor (valid dims are -2..1). Shard a dimension the tensor has.""")
    assert "takes this rank's shard as a plain torch.Tensor" in _msg(
        TypeError, lambda: ShardedTensor.from_local(ShardedTensor.from_local(local, m2, [Shard(0)]), m2, [Shard(0)]))
    assert "expected a torch DeviceMesh" in _msg(MeshError, lambda: ShardedTensor.from_local(local, "mesh", [Shard(0)]))
    # Uneven shards are fine when shape= says so: rank 0 of 2 holds 3 of 5 rows.
    x = ShardedTensor.from_local(local, m2, [Shard(0)], shape=(5, 4), stride=_strides((5, 4)))
    assert x.shape == (5, 4) and x.to_local().shape == (3, 4)
    # Without shape=, every shard is assumed to have the local shape.
    assert ShardedTensor.from_local(local, m2, [Shard(1)]).shape == (3, 8)


def test_rank_outside_the_mesh():
    outside = MeshRef("cpu", (2,), (3, 4), None, ("g",))
    assert "rank 0 is not in the mesh" in _msg(MeshError, lambda: ShardedTensor.from_local(torch.ones(2), outside, [Shard(0)]))


def test_other_bad_input():
    x = distribute(torch.randn(4, 3), LOCAL, [Shard(0)])
    y = ShardedTensor.from_local(torch.randn(4, 3), fake_mesh(1), [Shard(0)])
    assert "different meshes" in _msg(MeshError, lambda: x + y)
    assert "moving between meshes is not supported" in _msg(MeshError, lambda: x.redistribute(fake_mesh(1), [Replicate()]))
    # distribute to Partial is torch's: each of k ranks holds t / k (one rank here: t)
    assert torch.equal(distribute(torch.ones(2), LOCAL, [Partial()]).to_local(), torch.ones(2))
    p = x.redistribute(LOCAL, [Partial()])
    # Not linear in the Partial it updates: computed whole and written back, still Partial.
    expected = x.full_tensor().exp()
    p.exp_()
    assert p.placements == (Partial(),) and torch.allclose(p.full_tensor(), expected)


def test_unsupported_op_names_class_overload_and_implements():
    x = distribute(torch.randn(4, 3), LOCAL, [Shard(0)])
    # A ShardedTensor's global shape is fixed: an in-place reshape has no meaning on it.
    msg = _msg(UnsupportedOpError, lambda: x.resize_(12))
    assert "ShardedTensor" in msg and "aten.resize_.default" in msg and "implements" in msg


@pytest.mark.parametrize("method", ["to_sparse", "to_sparse_csr", "to_mkldnn"])
def test_a_non_strided_conversion_is_refused_before_any_gather(method, caplog):
    from subclass_kit.sharded._ops.generic import gathered_ops

    x = distribute(torch.randn(4, 3), LOCAL, [Shard(0)])
    gathered_ops().clear()
    with caplog.at_level("WARNING", logger="subclass_kit.sharded"):
        msg = _msg(UnsupportedOpError, lambda: getattr(x, method)())
    assert msg.startswith("ShardedTensor cannot run aten.") and "dense strided shards" in msg, msg
    assert f"x.full_tensor().{method}()" in msg and "x.to_local()" in msg, msg
    # Refused up front: nothing gathered, no "computes ... on whole tensors" log.
    assert not gathered_ops() and not caplog.records


def test_rule_less_op_gathers_matches_dense_and_logs_once(caplog):
    from subclass_kit.sharded._ops import generic

    d = torch.tensor([1, 2, 2, 5])
    x = distribute(d, LOCAL, [Shard(0)])
    generic._LOGGED.discard(torch.ops.aten.bincount.default)
    with caplog.at_level("WARNING", logger="subclass_kit.sharded"):
        # bincount has no sharding rule (its length is the whole tensor's maximum).
        h1, h2 = torch.bincount(x), torch.bincount(x)
    assert h1.placements == (Replicate(),) and torch.equal(h1.full_tensor(), torch.bincount(d))
    msgs = [r.getMessage() for r in caplog.records if "aten.bincount.default" in r.getMessage()]
    assert len(msgs) == 1 and "implements" in msgs[0]
    assert isinstance(UnsupportedOpError("x"), NotImplementedError)


@pytest.mark.parametrize("pl", [Replicate(), Shard(0), Shard(1)], ids=str)
def test_views_of_views_keep_the_dense_storage_offset(pl):
    # The per-op plans are cached by metadata signature: it must hold the storage offset,
    # or x[2:5][1:2] reuses the plan of x[0:3][1:2] and starts at the wrong element.
    d = torch.arange(40.0).reshape(10, 4)
    x = distribute(d, LOCAL, [pl])
    for f in (lambda t: t[2:5][1:2], lambda t: t[0:3][1:2], lambda t: t[:, 1:3][3:5],
              lambda t: t[1:][1:][1:], lambda t: t[2:].view(-1)[3:], lambda t: t[1:].detach()):
        got, want = f(x), f(d)
        assert (got.storage_offset(), got.stride(), got.shape) == (want.storage_offset(), want.stride(), want.shape)
        assert torch.equal(got.full_tensor(), want)


def test_parallelize_bad_plans():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    # A key that matches no submodule: torch's parallelize_module warns and goes on.
    with pytest.warns(UserWarning) as w:
        parallelize(mlp, LOCAL, {"3": ColwiseParallel()})
    assert_expected_inline(str(w[0].message), """\
parallelize: plan key '3' matches no submodule of Sequential, skipping it; its submodules are ['0', '1', '2'].""")
    assert "ColwiseParallel applies to nn.Linear and nn.Embedding, but '1' is a ReLU" in _msg(
        ParallelizeError, lambda: parallelize(mlp, LOCAL, {"1": ColwiseParallel()}))
    mesh2d = MeshRef("cpu", (1, 1), (0,), None, ("<local>", "<local>"))
    assert "1-D mesh" in _msg(ParallelizeError, lambda: parallelize(mlp, mesh2d, {"0": RowwiseParallel()}))



def test_prepare_module_input_and_output_name_the_side_the_index_and_the_fix():
    lin = lambda: nn.Linear(4, 4)  # noqa: E731
    # Layout lists of different lengths: refused when the style is made, naming the side.
    assert_expected_inline(_msg(ParallelizeError, lambda: PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(), None))), """\
PrepareModuleInput: input_layouts and desired_input_layouts should have same length, got input_layouts=(Shard(0),) (1 entry) and desired_input_layouts=(Replicate(), None) (2 entries); give one entry per input in both (None for one left alone), e.g. input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None).""")
    assert "output_layouts and desired_output_layouts should have same length, got output_layouts=(Shard(0), None) " \
        "(2 entries) and desired_output_layouts=(Replicate(),) (1 entry)" in _msg(
            ParallelizeError, lambda: PrepareModuleOutput(output_layouts=(Shard(0), None), desired_output_layouts=Replicate()))
    # A ShardedTensor arriving with other placements than the layout says: index and fix named.
    m = parallelize(lin(), LOCAL, PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),)))
    x = distribute(torch.ones(2, 4), LOCAL, [Replicate()])
    msg = _msg(ParallelizeError, lambda: m(x))
    assert "input 0 is a ShardedTensor with placements (Replicate(),) but input_layouts[0] says" in msg, msg
    assert msg.endswith("make input_layouts[0] match what the previous module outputs."), msg
    m = parallelize(lin(), LOCAL, PrepareModuleOutput(output_layouts=Shard(0), desired_output_layouts=Replicate(),
                                                      use_local_output=False))
    m.register_forward_hook(lambda mod, args, out: distribute(out, LOCAL, [Replicate()]), prepend=True)
    msg = _msg(ParallelizeError, lambda: m(torch.ones(2, 4)))
    assert "output 0 is a ShardedTensor with placements (Replicate(),) but output_layouts[0] says" in msg, msg
    assert msg.endswith("make output_layouts[0] match the output."), msg

def _ops_vs_dense():
    g = torch.Generator().manual_seed(0)
    a, b, v = torch.randn(6, 4, generator=g), torch.randn(4, 5, generator=g), torch.randn(4, generator=g)
    return [
        ("add broadcast", lambda a, b, v: a + v),
        ("mul scalar", lambda a, b, v: a * 3 - 1),
        ("where", lambda a, b, v: torch.where(a > 0, a, v)),
        ("mm", lambda a, b, v: a @ b),
        ("addmm", lambda a, b, v: torch.addmm(torch.ones(5), a, b)),
        ("t", lambda a, b, v: a.t() * 1),
        ("view", lambda a, b, v: a.view(2, 3, 4).sum(1)),
        ("reshape flatten", lambda a, b, v: a.reshape(24)[:5]),
        ("slice select", lambda a, b, v: a[1:4, 2] + 0),
        ("sum mean amax", lambda a, b, v: a.sum(0) + a.mean(1).sum() + a.amax(1).sum()),
        ("softmax", lambda a, b, v: torch.softmax(a, 1)),
        ("linear", lambda a, b, v: torch.nn.functional.linear(a, b.t(), torch.ones(5))),
        ("cat stack", lambda a, b, v: torch.stack([torch.cat([a, a]), torch.cat([a, a])], 1)),
    ], (a, b, v)


@pytest.mark.parametrize("placements", [[Shard(0)], [Shard(1)], [Replicate()]], ids=repr)
def test_ops_on_one_rank_equal_dense(placements):
    cases, (a, b, v) = _ops_vs_dense()
    sa = distribute(a, LOCAL, placements)
    sb = distribute(b, LOCAL, [Replicate()])
    for name, fn in cases:
        out = fn(sa, sb, v)
        got = out.full_tensor() if isinstance(out, ShardedTensor) else out
        torch.testing.assert_close(got, fn(a, b, v), msg=name)


def test_compiled_conversions_on_one_rank_one_graph():
    def f(x, w):
        s = ShardedTensor.from_local(x, LOCAL, [Shard(0)])
        y = (s @ w).redistribute(LOCAL, [Replicate()])
        return y.to_local() * 2, y.full_tensor().sum()

    x = torch.randn(6, 4, requires_grad=True)
    w = distribute(torch.randn(4, 3), LOCAL, [Replicate()]).requires_grad_(True)
    cnt = CompileCounterWithBackend("aot_eager")
    out = torch.compile(f, backend=cnt, fullgraph=True)(x, w)
    ref = f(x.detach(), w.detach())
    torch.testing.assert_close(out[0], ref[0])
    out[0].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((6, 3), 2.0) @ w.to_local().detach().t())
    assert cnt.frame_count == 1 and isinstance(w.grad, ShardedTensor)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_export_of_a_tp_mlp_on_one_rank(strict):
    # Colwise/Rowwise build ShardedTensors from traced activations in their hooks (the
    # ops' fast construction path): export's pre-dispatch tracing must record each, or
    # F.linear on it fails with "Unable to cast NotImplemented to Tensor".
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    tp = parallelize(copy.deepcopy(dense), LOCAL, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    batch = torch.export.Dim("batch", min=2, max=64)
    with torch.no_grad():
        ep = torch.export.export(tp, (torch.randn(5, 6),), strict=strict, dynamic_shapes=({0: batch},))
        assert any(n.target is torch.ops.higher_order.flat_apply for n in ep.graph.nodes)
        for b in (3, 9):
            x = torch.randn(b, 6)
            torch.testing.assert_close(ep.module()(x), dense(x))


def test_conformance_on_samples():
    # The kit's checker over __samples__ (one-rank meshes): protocol, compile with dynamic
    # sweeps, backward, export, serialization; cross-rank behaviour is in test_dist.py.
    report = check_subclass(ShardedTensor, backends=("aot_eager",))
    report.raise_if_failed()
    assert any(r.name.startswith("serialization") and r.status == "pass" for r in report.rows)


def test_tangent_coercion_moves_to_the_traced_placements():
    d = torch.randn(4, 3)
    x = distribute(d, LOCAL, [Shard(0)])
    p = x.redistribute(LOCAL, [Partial()])
    # A Partial output's tangent is traced as Replicate.
    assert p.__coerce_tangent_metadata__().placements == (Replicate(),)
    assert x.__coerce_tangent_metadata__() is x
    # A runtime tangent with other placements is brought to the traced ones.
    want = distribute(d, LOCAL, [Replicate()])._kit_ctx
    got = x.__coerce_same_metadata_as_tangent__(want)
    assert got._kit_ctx == want
    torch.testing.assert_close(got.full_tensor(), d)
    assert x.__coerce_same_metadata_as_tangent__(x._kit_ctx) is x
    assert x.__coerce_same_metadata_as_tangent__(want.replace(dtype=torch.float64)) is None


def test_placements_are_guarded_values_are_not():
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x: (x * 2).sum(0), backend=cnt, fullgraph=True)
    for pl in ([Shard(0)], [Replicate()], [Shard(0)], [Shard(1)]):
        d = torch.randn(4, 3)
        out = f(distribute(d, LOCAL, pl))
        torch.testing.assert_close(out.full_tensor(), (d * 2).sum(0))
    # One graph per layout; returning to a seen layout (or new values) reuses its graph.
    assert cnt.frame_count == 3


def test_bad_input_names_the_op_the_placements_and_the_fix():
    from subclass_kit.sharded import MeshError, PlacementError

    a = distribute(torch.ones(4, 2), MeshRef.local(), [Shard(0)])
    other = MeshRef("cpu", (1,), (0,), ("tp",), ("<local>",))  # an equal-shaped mesh, another one
    b = distribute(torch.ones(4, 2), other, [Replicate()])
    for op, fn in (("aten.add.Tensor", lambda: a + b), ("aten.mm.default", lambda: a @ b.t()),
                   ("aten.cat.default", lambda: torch.cat([a, b]))):
        with pytest.raises(MeshError) as e:
            fn()
        msg = str(e.value)
        assert op in msg and "(Shard(0),)" in msg and "(Replicate(),)" in msg and "same DeviceMesh" in msg
    for what, fn in (
        ("ShardedTensor.from_local", lambda: ShardedTensor.from_local(torch.ones(2), MeshRef.local(), [Shard(0), Replicate()])),
        ("ShardedTensor.redistribute", lambda: a.redistribute(a.mesh, [Replicate(), Replicate()])),
        ("distribute", lambda: distribute(torch.ones(2), MeshRef.local(), [])),
    ):
        with pytest.raises(PlacementError) as e:
            fn()
        assert what in str(e.value) and "exactly one placement per mesh dimension" in str(e.value)


@pytest.mark.parametrize("pl", [Shard(0), Replicate()], ids=repr)
def test_detach_and_alias_keep_the_metadata_offset_and_state(pl):
    x = distribute(torch.arange(24.0).reshape(6, 4), LOCAL, [pl])
    for v in (x, x[2:5], x.t()):
        for op in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            for _ in range(2):  # the planned path's miss and its hit
                d = op(v)
                assert type(d) is ShardedTensor and d.placements == v.placements
                assert (tuple(d.shape), d.stride(), d.storage_offset()) == (tuple(v.shape), v.stride(), v.storage_offset())
                assert d.untyped_storage()._cdata == v.untyped_storage()._cdata
                assert torch.equal(d.full_tensor(), v.full_tensor()) and d._gathered_view is None
    g = x.t()
    g._gathered_view = torch.ops.aten.slice.Tensor  # as a view that gathered its shard is marked
    assert g.detach()._gathered_view is torch.ops.aten.slice.Tensor


@pytest.mark.parametrize("numbers_by_type", [True, False])
def test_a_plan_hit_finds_the_entry_the_general_key_names(numbers_by_type):
    from subclass_kit.sharded._ops import _common

    x = distribute(torch.ones(4, 2), LOCAL, [Shard(0)])
    y = distribute(torch.ones(4, 2), LOCAL, [Replicate()])
    built = []
    plan = _common.planned(lambda func, args, kwargs: built.append(args) or object(), numbers_by_type=numbers_by_type)
    op = "no op"  # the plan's table is its own
    cases = [(x,), (x, y), (y, x), (x, 2), (x, 2.5), (x, True), (x, [8]), (x, [2, -1]), (x, [True]), (x, torch.ones(2))]
    cases = [(args, {}) for args in cases] + [
        ((x, [1]), {"correction": 1}), ((x, [1]), {"correction": 1.0}), ((x,), {"dim": [0], "keepdim": True}),
        ((x, y), {"alpha": 2}), ((x, 2), {"out": y}),
    ]
    for args, kwargs in cases:
        first = plan(op, args, kwargs)
        assert plan(op, args, kwargs) is first  # the second call is a hit
        assert plan.plans.pop(_common._key(op, args, kwargs, numbers_by_type)) is first
    assert len(built) == len(cases)


def test_a_none_plan_is_a_hit_too():
    # A rule's "no plan" (its general path) is a decision as well: it is not rebuilt per call.
    from subclass_kit.sharded._ops import _common

    x = distribute(torch.ones(4, 2), LOCAL, [Shard(0)])
    built = []
    plan = _common.planned(lambda func, args, kwargs: built.append(args))
    for _ in range(3):
        assert plan("no op", (x, 2), {}) is None
    assert len(built) == 1


@pytest.mark.parametrize("pl", [Replicate(), Shard(1)], ids=repr)
def test_gather_cat_stack_of_operands_already_laid_out_are_one_fast_call(pl):
    # Nothing to move (every operand whole, or on the kept shard): the plan holds a fast path
    # (the op on the locals), and the values are the dense ones.
    from subclass_kit.sharded._ops import _common, indexing, view

    aten = torch.ops.aten
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    idx = torch.randint(0, 4, (4, 6), generator=g)
    xa, xb, xi = (distribute(t, LOCAL, [pl]) for t in (a, b, idx))
    for _ in range(2):  # the plan's miss and its hit
        for got, want in ((torch.gather(xa, 0, xi), torch.gather(a, 0, idx)),
                          (torch.cat([xa, xb]), torch.cat([a, b])), (torch.stack([xa, xb]), torch.stack([a, b]))):
            assert type(got) is ShardedTensor and got.placements[0].is_shard() == pl.is_shard()
            torch.testing.assert_close(got.full_tensor(), want)
    assert indexing._one_dim_plan.plans[_common._key(aten.gather.default, (xa, 0, xi), {}, False)][-1] is not None
    for func in (aten.cat.default, aten.stack.default):
        assert view._cat_plan.plans[_common._key(func, ([xa, xb],), {}, False)][-1] is not None


@pytest.mark.parametrize("pl", [Replicate(), Shard(1)], ids=repr)
def test_planned_fast_paths_equal_dense_keep_placements_and_alias_views(pl):
    # Casts and factories with keyword arguments (torch passes dtype=, pin_memory=), views of
    # the local (one result or several), results of several tensors: on the plan's miss and
    # its hit, dense values, the rule's placements, a view aliasing its input, and the
    # *_copy forms a contiguous copy.
    from subclass_kit.sharded._ops import _common, pointwise, view

    aten = torch.ops.aten
    d = torch.randn(4, 6, 1, generator=torch.Generator().manual_seed(7))
    x = distribute(d, LOCAL, [pl])
    cases = [
        (lambda t: t.double(), False), (lambda t: t.to(torch.int64), False), (torch.zeros_like, False),
        (lambda t: t.new_zeros((3, 2)), False), (lambda t: torch.round(t, decimals=2), False),
        (lambda t: t.unsqueeze(0), True), (lambda t: t.expand(2, 4, 6, 5), True), (lambda t: t.select(0, 1), True),
        (lambda t: t[1:3], True), (lambda t: t.squeeze(2), True), (lambda t: t.diagonal(0, 0, 2), True),
        (lambda t: t.split(2, 0), True), (lambda t: torch.max(t, 0), False),
        (lambda t: torch.var_mean(t, 0, correction=0), False), (lambda t: torch.permute_copy(t, (2, 0, 1)), False),
    ]
    for fn, is_view in cases:
        want = fn(d)
        seen = []
        for _ in range(2):  # the plan's miss and its hit
            got = fn(x)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert type(g) is ShardedTensor and not g.placements[0].is_partial()
                seen.append(g.placements)
                torch.testing.assert_close(g.full_tensor(), w)
                assert (g.untyped_storage()._cdata == x.untyped_storage()._cdata) == is_view
                assert g.stride() == w.stride() and g.local.is_contiguous() or is_view
        assert seen[:len(seen) // 2] == seen[len(seen) // 2:]
    keyed = _common._key(aten._to_copy.default, (x,), {"dtype": torch.float64}, True)
    assert pointwise._planned.plans[keyed][0] is not None
    assert view._along_plan.plans[_common._key(aten.split.Tensor, (x, 2), {}, False)][-1] is not None


@pytest.mark.parametrize("pl", [Shard(0), Replicate()], ids=repr)
def test_var_and_std_over_an_unsharded_dim_are_one_plan_hit_on_the_local(pl):
    from subclass_kit import _compat
    from subclass_kit.sharded._ops import _common, reduction

    aten = torch.ops.aten
    d = torch.randn(6, 5, generator=torch.Generator().manual_seed(31))
    x = distribute(d, LOCAL, [pl])
    for fn, func, binding in ((torch.var, aten.var.correction, torch._C._VariableFunctions.var),
                              (torch.std, aten.std.correction, torch._C._VariableFunctions.std)):
        for correction in (0, 1):
            for _ in range(2):  # the plan's miss and its hit
                out = fn(x, 1, correction=correction)
                assert type(out) is ShardedTensor and out.placements == x.placements
                torch.testing.assert_close(out.full_tensor(), fn(d, 1, correction=correction))
            # One plan for the call (the two-sum form's test and the along-dims rule together)
            # holds the fast path, whose op is the Python binding (checked to mean `func`).
            along, dims = reduction._moments_plan.plans[_common._key(func, (x, [1]), {"correction": correction}, False)]
            assert dims == [1] and along[-1] is not None
            assert _compat.fast_op_for(func, (x.local, [1]), {"correction": correction}) is binding


def test_a_batch_sharded_mean_loss_over_one_rank_is_the_local_mean():
    # All the rows on one rank: the local mean is the mean (no all-reduce of the total weight,
    # no division); over two ranks the plan takes the exact sharded mean.
    import torch.nn.functional as F

    from subclass_kit.sharded._ops import nll

    aten = torch.ops.aten
    g = torch.Generator().manual_seed(32)
    D, Y = torch.randn(8, 5, generator=g), torch.randint(0, 5, (8,), generator=g)
    w = torch.rand(5, generator=g) + 0.5
    for kwargs in ({}, {"weight": w}, {"ignore_index": int(Y[0])}, {"weight": w, "ignore_index": int(Y[1])}):
        d = D.clone().requires_grad_(True)
        ref = F.cross_entropy(d, Y, **kwargs)
        ref.backward()
        x = distribute(D, LOCAL, [Shard(0)]).requires_grad_(True)
        out = F.cross_entropy(x, distribute(Y, LOCAL, [Shard(0)]), **kwargs)
        torch.testing.assert_close(out.full_tensor(), ref.detach())
        out.backward()
        torch.testing.assert_close(x.grad.full_tensor(), d.grad)
    for mesh, sharded in ((LOCAL, False), (fake_mesh(2), True)):
        rows = 8 // len(mesh.ranks)
        logp = ShardedTensor.from_local(torch.randn(rows, 5), mesh, [Shard(0)], shape=(8, 5), stride=_strides((8, 5)))
        t = ShardedTensor.from_local(torch.zeros(rows, dtype=torch.long), mesh, [Shard(0)], shape=(8,), stride=_strides((8,)))
        plan = nll._plan(aten.nll_loss_forward.default, (logp, t, None, 1, -100), {})
        assert plan[5] is sharded and plan[6] is not None  # the sharded flag, the fast path


def test_a_rule_computing_whole_logs_without_asking_for_a_rule(caplog):
    # as_strided has a rule; an overlapping geometry (no chain of views of a shard) is computed
    # whole, and the log must not send the user to register the rule that exists.
    from subclass_kit.sharded._ops import generic

    d = torch.arange(12.0).reshape(4, 3)
    x = distribute(d, LOCAL, [Shard(0)])
    generic._WHOLE_LOGGED.discard(torch.ops.aten.as_strided.default)
    generic.whole_ops().clear()
    with caplog.at_level("WARNING", logger="subclass_kit.sharded"):
        y = x.as_strided((3, 3), (1, 1), 0)
    assert torch.equal(y.full_tensor(), d.as_strided((3, 3), (1, 1), 0))
    assert generic.whole_ops()[torch.ops.aten.as_strided.default] == 1
    msgs = [r.getMessage() for r in caplog.records if "aten.as_strided.default" in r.getMessage()]
    assert len(msgs) == 1 and "for these placements" in msgs[0] and "implements" not in msgs[0], msgs


def test_once_an_odd_layout_exists_only_ops_on_odd_operands_take_the_layout_hook():
    # The hook (ops on layouts the rules do not handle) is asked only for an op with such an
    # operand: the common op on simple layouts goes straight to its rule.
    from subclass_kit.sharded import tensor as sharded_tensor
    from subclass_kit.sharded.mesh import LAYOUTS_SEEN
    from subclass_kit.sharded.placements import _StridedShard

    hook, seen, asked = sharded_tensor.LAYOUT_HOOK[0], LAYOUTS_SEEN[0], []
    sharded_tensor.LAYOUT_HOOK[0] = lambda func, args, kwargs: asked.append(func) or hook(func, args, kwargs)
    LAYOUTS_SEEN[0] = True
    try:
        d = torch.randn(4, 6)
        x, y = distribute(d, LOCAL, [Shard(0)]), distribute(d, LOCAL, [Replicate()])
        torch.testing.assert_close((x + y).full_tensor(), d + d)
        torch.testing.assert_close(torch.cat([x, x]).full_tensor(), torch.cat([d, d]))
        assert asked == []
        s = ShardedTensor.from_local(d, LOCAL, [_StridedShard(0, split_factor=2)])
        torch.testing.assert_close((s + y).full_tensor(), d + d)
        assert asked == [torch.ops.aten.add.Tensor]
    finally:
        sharded_tensor.LAYOUT_HOOK[0] = hook
        LAYOUTS_SEEN[0] = seen or LAYOUTS_SEEN[0]
