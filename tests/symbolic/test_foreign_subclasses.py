"""symbolic on torch's own subclasses: DTensor, TwoTensor, jagged NestedTensor (no __inner_shapes__)."""

import pytest
import sympy
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import symbolic
from symbolic import Dim, SubclassPolicy, size_symbol


@pytest.fixture(scope="module")
def mesh():
    # torch's in-process "fake" process group: a 2-rank world without spawning, no comms needed
    # for the local-only ops used here.
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield DeviceMesh("cpu", [0, 1])
    finally:
        dist.destroy_process_group()


def test_dtensor_replicate_relations_and_one_compile(mesh):
    from torch.distributed.tensor import DTensor, Replicate

    def make(rows):
        return DTensor.from_local(torch.randn(rows, 4), mesh, [Replicate()], run_check=False)

    x = make(8)
    assert symbolic.relations(x) == [sympy.Eq(size_symbol("_local_tensor", 0), size_symbol("", 0)),
                                     sympy.Eq(size_symbol("_local_tensor", 1), size_symbol("", 1))]
    assert symbolic.plan(x, 0) == SubclassPolicy(outer=[0], inner={"_local_tensor": [0]})

    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x: (x * 2).to_local(), backend=cnt, fullgraph=True)
    for rows in (8, 12, 16):
        x = make(rows)
        symbolic.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), x.to_local() * 2)
    assert cnt.frame_count == 1


def test_dtensor_shard_needs_an_explicit_inner_policy(mesh):
    from torch.distributed.tensor import DTensor, Shard

    x = DTensor.from_local(torch.randn(8, 4), mesh, [Shard(0)], run_check=False)
    assert x.shape == (16, 4)
    # rows / world_size is not an equality on the example, so nothing is inferred for dim 0 ...
    assert [str(e) for e in symbolic.relations(x)] == ["Eq(_local_tensor_1, s1)"]
    assert symbolic.plan(x, 0).inner == {}
    # ... and the user names it.
    p = symbolic.plan(x, 0, inner={"_local_tensor": [0]})
    assert p.inner["_local_tensor"] == {0: Dim.dynamic()}


def test_torch_two_tensor_derived_equals_same_dim():
    x = TorchTwoTensor(torch.ones(6, 4), torch.ones(6, 4))
    assert symbolic.plan(x, [0, 1]) == symbolic.plan(x, [0, 1], inner="same_dim")


def test_jagged_nested_tensor_does_not_trip_on_nested_ints():
    nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
    names = symbolic.sources(nt)
    assert "L['x']._values.size()[0]" in names and "L['x']._offsets.size()[0]" in names
    assert names["L['x']._values.size()[0]"](nt) == 5
    # NestedTensor's fixed layout is known: _values is (sum_j, D) under an outer (B, j, D),
    # _offsets has B + 1 entries; the ragged total and the nested int stay free.
    rel = {e.lhs: e.rhs for e in symbolic.relations(nt)}
    s0, s2 = size_symbol("", 0), size_symbol("", 2)
    assert rel == {size_symbol("_values", 1): s2, size_symbol("_offsets", 0): s0 + 1}
    # The ragged total is FREE: auto as soon as an outer dim is marked (NJT's own rule too).
    p = symbolic.mark_dynamic(nt, 2)
    assert p.outer == {2: Dim.dynamic()} and p.inner == {"_values": {0: Dim.auto(), 1: Dim.dynamic()}}
    q = symbolic.plan(nt, 0)
    assert q.inner == {"_offsets": {0: Dim.dynamic()}, "_values": {0: Dim.auto()}}
    assert symbolic.marks(nt).inner["_values"] == {0: Dim.auto(), 1: Dim.dynamic()}


class _ShapeInCtx(torch.Tensor):
    """Keeps its shape in its ctx, as torchao's NF4Tensor does (tensor_meta.original_shape)."""

    @staticmethod
    def __new__(cls, a, shape=None):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape if shape is None else shape, dtype=a.dtype)

    def __init__(self, a, shape=None):
        self.a = a

    def __tensor_flatten__(self):
        return ["a"], {"meta": {"original_shape": self.shape}}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        # like NF4Tensor: the shape comes from the ctx, not from outer_size
        return _ShapeInCtx(inner["a"], ctx["meta"]["original_shape"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        unwrap = lambda x: x.a if isinstance(x, _ShapeInCtx) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **(kwargs or {}))


def test_mark_dynamic_warns_when_the_ctx_pins_the_dim():
    x = _ShapeInCtx(torch.ones(6, 4))
    with pytest.warns(symbolic.CtxPinsShapeWarning, match=r"ctx\['meta'\]\['original_shape'\] = \(6, 4\).*Dim.auto\(\)"):
        symbolic.mark_dynamic(x, 0)
    # dynamo does what the warning says: a strict mark on a ctx-pinned dim cannot hold.
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    torch._dynamo.reset()
    with pytest.raises(ConstraintViolationError):
        torch.compile(lambda t: t * 2, backend="eager", fullgraph=True)(x)
    y = _ShapeInCtx(torch.ones(6, 4))
    with pytest.warns(symbolic.CtxPinsShapeWarning, match="expect one graph per size"):
        symbolic.mark_dynamic(y, {0: Dim.auto()})
