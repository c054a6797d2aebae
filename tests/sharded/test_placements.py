"""Placements, mesh descriptors and shard arithmetic: value semantics, validation with
teaching errors, torch.chunk-exact sizes, and the shape relations symbolic reads."""

from __future__ import annotations

import copy
import pickle

import pytest
import sympy
import torch
from expecttest import assert_expected_inline

import guards
import symbolic
from subclass_kit import SubclassKitError
from subclass_kit.ctx import canonical_value
from subclass_kit.sharded import (
    MeshRef,
    Partial,
    PlacementError,
    Replicate,
    Shard,
    ShardedTensor,
    ShardShapeError,
)
from subclass_kit.sharded._layout import chunk_size, chunk_start, local_shape
from subclass_kit.sharded.placements import _StridedShard, normalize_placements
from symbolic import size_symbol

from sharded._meshes import fake_mesh


@pytest.mark.parametrize("value", [Shard(0), Shard(-1), Replicate(), Partial(), Partial("max"), fake_mesh(2), MeshRef.local()], ids=repr)
def test_ctx_values_are_hashable_picklable_and_equal_after_deepcopy(value):
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.deepcopy(value) == value and hash(copy.deepcopy(value)) == hash(value)
    # Canonical forms carry no addresses, so cache keys are the same in every process.
    assert " at 0x" not in repr(canonical_value(value))
    assert not any(isinstance(v, torch.Tensor) for v in vars(value).values())


def test_equality_is_by_value_and_kind():
    assert Shard(1) == Shard(1) and Shard(1) != Shard(0)
    assert Partial() == Partial("sum") and Partial("sum") != Partial("avg")
    assert Replicate() != Partial() and len({Shard(0), Shard(0), Replicate()}) == 2
    assert fake_mesh(2) != fake_mesh(3)


def test_bad_placement_values():
    with pytest.raises(PlacementError, match="op must be one of"):
        Partial("mean")
    with pytest.raises(PlacementError, match="takes an int"):
        Shard(0.5)


def _err(fn) -> str:
    with pytest.raises(SubclassKitError) as info:
        fn()
    assert isinstance(info.value, ValueError)  # catchable as the builtin too
    return str(info.value)


def test_placement_validation_messages():
    n = normalize_placements
    assert n([Shard(-1), Replicate()], 2, 3, what="demo") == (Shard(2), Replicate())
    assert_expected_inline(_err(lambda: n([Shard(0)], 2, 2, what="ShardedTensor.from_local")), """\
ShardedTensor.from_local: got 1 placements (Shard(0),) for a 2-D mesh; pass exactly one placement per mesh dimension (2).""")
    assert_expected_inline(_err(lambda: n([Shard(2)], 1, 2, what="ShardedTensor.from_local")), """\
ShardedTensor.from_local: placements[0] = Shard(2) is out of range for a 2-D tensor (valid dims are -2..1). Shard a dimension the tensor has.""")
    # one tensor dim on two mesh dims nests (or strides), normalized like any shard
    assert n([Shard(0), Shard(-2)], 2, 2, what="distribute") == (Shard(0), Shard(0))
    assert n([_StridedShard(-2, split_factor=2), Shard(0)], 2, 2, what="t") == (_StridedShard(0, split_factor=2), Shard(0))
    assert "one placement per mesh dim" in _err(lambda: n(Shard(0), 1, 2, what="demo"))
    assert "use Shard(dim), _StridedShard(dim, split_factor=), Replicate() or Partial(op)" in _err(
        lambda: n(["Shard(0)"], 1, 2, what="demo"))
    assert "split_factor" in _err(lambda: _StridedShard(0, split_factor=0))


def test_torch_dtensor_placements_convert():
    from torch.distributed.tensor import Partial as TPartial, Replicate as TReplicate, Shard as TShard

    assert normalize_placements([TShard(1)], 1, 2, what="t") == (Shard(1),)
    assert normalize_placements([TReplicate(), TPartial()], 2, 2, what="t") == (Replicate(), Partial("sum"))
    from torch.distributed.tensor.placement_types import _StridedShard as TStrided

    assert normalize_placements([TStrided(0, split_factor=2), TShard(0)], 2, 2, what="t") == (
        _StridedShard(0, split_factor=2), Shard(0))


def test_chunk_sizes_match_torch_chunk():
    for n in range(0, 14):
        for k in range(1, 6):
            chunks = list(torch.arange(n).chunk(k)) if n else []
            sizes = [len(c) for c in chunks] + [0] * (k - len(chunks))
            assert [chunk_size(n, k, c) for c in range(k)] == sizes, (n, k)
            for c in range(k):
                if sizes[c]:
                    assert chunk_start(n, k, c) == chunks[c][0].item(), (n, k, c)
    assert local_shape((5, 7), (Replicate(), Shard(1)), (2, 3), (1, 2)) == (5, 1)


def _st(global_shape, placements, mesh, coord):
    local = torch.zeros(local_shape(global_shape, placements, mesh.shape, coord))
    return ShardedTensor(local, mesh, placements, coord, size=global_shape)


def test_relations_tie_the_local_shard_to_the_global_shape():
    s0, s1 = size_symbol("", 0), size_symbol("", 1)
    m2, m3 = fake_mesh(2), fake_mesh(3)
    first = symbolic.relations(_st((8, 4), (Shard(0),), m2, (0,)))
    assert_expected_inline(str(first), """[Eq(local_0, ceiling(s0/2)), Eq(local_1, s1)]""")
    # The second of two ranks holds the rest; the middle of three is clamped both ways.
    last = symbolic.relations(_st((7, 4), (Shard(0),), m2, (1,)))
    assert_expected_inline(str(last[0]), """Eq(local_0, s0 + floor(-s0/2))""")
    assert all(last[0].rhs.subs(s0, n) == n // 2 for n in range(1, 12))
    middle = symbolic.relations(_st((4, 10), (Shard(1),), m3, (1,)))
    assert middle[0].rhs == s0
    for cols in (1, 2, 3, 9, 10, 11):
        assert middle[1].rhs.subs(s1, cols) == chunk_size(cols, 3, 1)
    assert symbolic.relations(_st((8, 4), (Replicate(),), m2, (1,))) == [sympy.Eq(size_symbol("local", 0), s0), sympy.Eq(size_symbol("local", 1), s1)]


def test_derived_marking_makes_the_local_dim_dynamic_with_the_global_one():
    x = _st((8, 4), (Shard(0),), fake_mesh(2), (0,))
    symbolic.mark_dynamic(x, [0])
    assert 0 in getattr(x.local, "_dynamo_dynamic_indices", set())
    assert 1 not in getattr(x.local, "_dynamo_dynamic_indices", set())


def test_ctx_distinguishes_placements_mesh_and_coordinate_in_cache_keys():
    m = fake_mesh(2)
    base = _st((8, 4), (Shard(0),), m, (0,))
    keys = {
        guards.cache_key(base),
        guards.cache_key(_st((8, 4), (Shard(1),), m, (0,))),
        guards.cache_key(_st((8, 4), (Shard(0),), m, (1,))),
        guards.cache_key(_st((8, 4), (Shard(0),), fake_mesh(4), (0,))),
    }
    assert len(keys) == 4
    assert guards.cache_key(base) == guards.cache_key(_st((8, 4), (Shard(0),), m, (0,)))


def test_direct_construction_checks_the_local_shape():
    with pytest.raises(SubclassKitError, match="__inner_shapes__ expects"):
        ShardedTensor(torch.zeros(3, 4), fake_mesh(2), [Shard(0)], (0,), size=(8, 4))
    assert isinstance(ShardShapeError("x"), ValueError)


def test_guard_explanations_name_the_placements():
    m = fake_mesh(2)
    x = _st((8, 4), (Shard(0),), m, (0,))
    g = guards.build(x)
    assert g.check(_st((8, 4), (Shard(0),), m, (0,)))
    assert_expected_inline(str(g.explain(_st((8, 4), (Replicate(),), m, (0,)))), """["L['x'].__tensor_flatten__()[1].placements: expected (Shard(0),), got (Replicate(),)", "L['x'].local.size()[0]: expected 4, got 8"]""")


def test_a_mesh_dim_of_size_one_changes_placement_without_work():
    # One rank's local is the value under any placement of that mesh dim (as DTensor's
    # num_chunks == 1 shortcut), so the sharded bench's one-rank mesh times no collective.
    # The fake mesh's groups do not exist: a collective would raise.
    from subclass_kit.sharded._redistribute import redistribute_local

    mesh = MeshRef("cpu", (1, 2), (0, 1), None, ("no-group-a", "no-group-b"))
    local = torch.arange(6.0).reshape(2, 3)
    for src, dst in ((Partial("sum"), Replicate()), (Shard(0), Replicate()), (Partial("max"), Shard(1)),
                     (Replicate(), Shard(0))):
        assert redistribute_local(local, mesh, (0, 0), (src, Replicate()), (dst, Replicate()), (2, 3)) is local


def test_fast_op_for_takes_the_binding_only_where_it_dispatches_the_overload_itself():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from subclass_kit import _compat

    aten, V = torch.ops.aten, torch._C._VariableFunctions
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    # Ops with several functional overloads: the binding's parser picks this one for these
    # argument types (var with correction=, add with a tensor or a number, mm, sum over dims).
    for func, args, kwargs, binding in (
        (aten.var.correction, (x, [1]), {"correction": 1}, V.var),
        (aten.std.correction, (x, [0]), {"correction": 0, "keepdim": True}, V.std),
        (aten.add.Tensor, (x, x), {}, V.add),
        (aten.add.Tensor, (x, 2), {}, V.add),
        (aten.mm.default, (x, x.t()), {}, V.mm),
        (aten.sum.dim_IntList, (x, [1]), {}, V.sum),
    ):
        op = _compat.fast_op_for(func, args, kwargs)
        assert op is binding, func
        torch.testing.assert_close(op(*args, **kwargs), func(*args, **kwargs))
    raw = aten.var.dim._op
    # var.dim's binding call dispatches var.correction (var.dim decomposes): not the same op.
    assert _compat.fast_op_for(aten.var.dim, (x, [1], True, False), {}) is raw
    # Several results: the binding returns a named tuple where the op returns a tuple.
    assert _compat.fast_op_for(aten.max.dim, (x, 1), {}) is aten.max.dim._op
    # One functional overload, but the binding's default reduction is 'none' where the
    # schema's is 'mean', and dispatch leaves an argument at its default out: asked, refused.
    assert _compat.fast_op_for(aten.mse_loss.default, (x, x), {}) is aten.mse_loss.default._op
    assert _compat.fast_op_for(aten.mse_loss.default, (x, x, 0), {}) is torch._C._nn.mse_loss
    # While tracing the trace sees the op either way: never asked there.
    with FakeTensorMode():
        f = torch.empty(4, 8)
        assert _compat.fast_op_for(aten.add.Tensor, (f, f), {}) is aten.add.Tensor._op


def test_fast_op_calls_the_python_binding_only_where_it_can_only_mean_the_overload():
    from subclass_kit import _compat

    aten = torch.ops.aten
    assert _compat.fast_op(aten.native_layer_norm.default) is torch._C._VariableFunctions.native_layer_norm
    assert _compat.fast_op(aten.mse_loss.default) is torch._C._nn.mse_loss
    # var has other functional overloads (dim, names_dim ...): its binding could pick one.
    assert _compat.fast_op(aten.var.correction) is aten.var.correction._op
    x = torch.randn(4, 8)
    got = _compat.fast_op(aten.native_layer_norm.default)(x, [8], None, None, 1e-5)
    for g, w in zip(got, aten.native_layer_norm.default(x, [8], None, None, 1e-5), strict=True):
        torch.testing.assert_close(g, w)
