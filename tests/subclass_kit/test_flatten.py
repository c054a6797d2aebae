"""The derived protocol: the flatten/unflatten round-trip law, the ctx, stable hashing, repr,
deepcopy, pickling and the tangent-coercion hooks."""

from __future__ import annotations

import copy
import enum
import io
import json
import pickle

import pytest
import torch
from expecttest import assert_expected_inline
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from kit_helpers.compiling import compile_counted
from subclass_kit import SubclassCtx, WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Tagged(WrapperTensor):
    """Outer-shaped inners plus meta values of several kinds (enum, frozenset, float)."""

    left: torch.Tensor = inner()
    right: torch.Tensor = inner(optional=True)
    color: Color = meta(default=Color.RED)
    names: frozenset = meta(default=frozenset({"x", "y", "z"}))
    eps: float = meta(default=0.1)
    __fallback__ = fallbacks.map_inner


def samples():
    """Every exemplar sample plus a Tagged with its optional inner absent."""
    out = []
    for cls in (TwoTensor, ScaledTensor, BlockScaled):
        out += [pytest.param(s, id=f"{cls.__name__}{i}") for i, s in enumerate(cls.__samples__())]
    out.append(pytest.param(Tagged(torch.randn(3, 2)), id="Tagged-absent"))
    return out


def _round_trip(t, size=None, stride=None):
    names, ctx = t.__tensor_flatten__()
    inners = {n: getattr(t, n) for n in names}
    size = t.shape if size is None else size
    stride = t.stride() if stride is None else stride
    u = type(t).__tensor_unflatten__(inners, ctx, size, stride)
    # The law (flatten.py): same type, same ctx, the given outer size/stride, the given inners.
    assert type(u) is type(t)
    assert u.__tensor_flatten__()[0] == names
    assert u.__tensor_flatten__()[1] == ctx
    assert tuple(u.shape) == tuple(size)
    assert tuple(u.stride()) == tuple(stride)
    assert u.dtype == ctx.dtype and u.device == inners[names[0]].device
    for n in names:
        assert getattr(u, n) is inners[n]
    return u


class Labeled(WrapperTensor):
    left: torch.Tensor = inner()
    label: str = meta(default="x")
    __fallback__ = fallbacks.map_inner


class Relabeling(Labeled):
    """Accepts tangents with another label by re-labelling them (the documented override)."""

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        if expected_type not in (None, type(self)):
            return None
        return type(self).__tensor_unflatten__({"left": self.left}, expected_metadata, self.shape, self.stride())


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("t", samples())
def test_round_trip_real(t):
    u = _round_trip(t)
    if hasattr(t, "to_plain"):
        torch.testing.assert_close(u.to_plain(), t.to_plain())


@pytest.mark.parametrize("t", samples())
def test_round_trip_honours_a_non_contiguous_outer_stride(t):
    rows, cols = t.shape
    u = _round_trip(t, t.shape, (1, rows))  # column-major outer, inners untouched
    assert not u.is_contiguous()


def test_round_trip_of_a_transposed_twotensor_keeps_views():
    x = TwoTensor(torch.randn(3, 5), torch.randn(3, 5)).t()
    assert x.stride() == (1, 5) and x.a.stride() == (1, 5)
    u = _round_trip(x)
    assert torch.equal(u.a, x.a)


@pytest.mark.parametrize("t", samples())
def test_round_trip_fake(t):
    mode = FakeTensorMode()
    ft = mode.from_tensor(t)
    assert type(ft) is type(t)
    names, ctx = ft.__tensor_flatten__()
    assert ctx == t.__tensor_flatten__()[1]
    assert all(isinstance(getattr(ft, n), FakeTensor) for n in names)
    u = _round_trip(ft)
    with mode:
        _round_trip(ft, ft.shape, (1, ft.shape[0]))
    assert all(isinstance(getattr(u, n), FakeTensor) for n in names)


@pytest.mark.parametrize("t", samples())
def test_round_trip_symbolic_shape_env(t):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    from torch._dynamo.source import LocalSource

    ft = mode.from_tensor(t, source=LocalSource("x"))
    assert all(isinstance(s, torch.SymInt) for s in ft.shape)
    rows, cols = ft.shape
    u = _round_trip(ft, (rows, cols), (1, rows))
    assert isinstance(u.shape[0], torch.SymInt)


@pytest.mark.parametrize("t", samples())
def test_round_trip_meta(t):
    names, ctx = t.__tensor_flatten__()
    m = type(t).__tensor_unflatten__({n: getattr(t, n).to("meta") for n in names}, ctx, t.shape, t.stride())
    assert m.is_meta and all(getattr(m, n).is_meta for n in names)
    _round_trip(m, m.shape, (1, m.shape[0]))
    # .to("meta") goes through the built-in _to_copy handler and gives the same thing.
    m2 = t.to("meta")
    assert type(m2) is type(t) and m2.is_meta and m2.__tensor_flatten__()[1] == ctx
    assert [tuple(getattr(m2, n).shape) for n in names] == [tuple(getattr(t, n).shape) for n in names]


def test_construction_from_meta_tensors_validates_shapes():
    q = torch.empty(70, 8, dtype=torch.int8, device="meta")
    s = torch.empty(3, 1, device="meta")
    x = BlockScaled(q, s, block=32, dtype=torch.float32)
    assert x.is_meta and x.shape == (70, 8)
    with pytest.raises(ValueError, match="BlockScaled.scale"):
        BlockScaled(q, torch.empty(2, 1, device="meta"), block=32)


@pytest.mark.parametrize(
    "t",
    [
        pytest.param(TwoTensor.__samples__()[0], id="TwoTensor"),
        pytest.param(TwoTensor.__samples__()[1].t(), id="TwoTensor-transposed"),
        pytest.param(ScaledTensor.__samples__()[0], id="ScaledTensor"),
        pytest.param(BlockScaled.__samples__()[-1], id="BlockScaled"),
    ],
)
def test_round_trip_symbolic_under_compile_dynamic(t):
    """Dynamo builds the graph input with __tensor_unflatten__ on fake inners and SymInt outer
    sizes; the law must hold on that value too, including a non-contiguous outer stride."""
    checked = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            v = node.meta.get("example_value")
            if node.op == "placeholder" and isinstance(v, WrapperTensor):
                assert isinstance(v.shape[0], torch.SymInt) and isinstance(v.shape[1], torch.SymInt)
                _round_trip(v)
                _round_trip(v, v.shape, (1, v.shape[0]))
                # The stable hash works on symbolic sizes (they enter by name).
                h = v._stable_hash_for_caching()
                assert isinstance(h, str) and len(h) == 64
                checked.append(v)
        return gm

    compiled, cnt = compile_counted(lambda x: x * 2, backend, dynamic=True)
    out = compiled(t)
    assert len(checked) == 1 and cnt.frame_count == 1
    expected = t * 2
    if hasattr(t, "to_plain"):
        torch.testing.assert_close(
            out.to_plain() if isinstance(out, WrapperTensor) else out, expected.to_plain() if isinstance(expected, WrapperTensor) else expected
        )
    # The transposed input keeps its layout through dynamo's re-creation.
    unit_dim = 0 if t.stride()[0] == 1 else 1
    assert checked[0].stride()[unit_dim] == 1


# ---- ctx -------------------------------------------------------------------------------------


def test_ctx_reads_meta_fields_dtype_fields_and_is_immutable():
    x = BlockScaled.__samples__()[1]
    ctx = x.__tensor_flatten__()[1]
    assert isinstance(ctx, SubclassCtx)
    assert ctx.block == 16 and ctx.dtype == torch.float32
    assert ctx.fields == (("block", 16),)
    assert ctx.present == ("qdata", "scale")
    with pytest.raises(AttributeError):
        ctx.block = 3
    with pytest.raises(AttributeError, match="no meta field 'blok'"):
        ctx.blok
    assert_expected_inline(repr(ctx), """BlockScaled.ctx(block=16, dtype=torch.float32)""")


def test_ctx_equality_hash_pickle_deepcopy():
    a = Tagged(torch.ones(2)).__tensor_flatten__()[1]
    b = Tagged(torch.zeros(2)).__tensor_flatten__()[1]
    c = Tagged(torch.zeros(2), color=Color.BLUE).__tensor_flatten__()[1]
    d = Tagged(torch.zeros(2), torch.zeros(2)).__tensor_flatten__()[1]
    e = Tagged(torch.zeros(2, dtype=torch.float64)).__tensor_flatten__()[1]
    assert a == b and hash(a) == hash(b)
    assert len({a, c, d, e}) == 4  # meta value, presence and dtype all matter
    for v in (a, c, d, e):
        w = pickle.loads(pickle.dumps(v))
        assert w == v and type(w) is SubclassCtx and w.color == v.color
        assert copy.deepcopy(v) == v and copy.copy(v) == v
    # A ctx of another class with the same field values is not equal.
    class_a = TwoTensor(torch.ones(1), torch.ones(1)).__tensor_flatten__()[1]
    class_b = Tagged(torch.ones(1)).__tensor_flatten__()[1].replace()
    assert class_a != class_b


def test_ctx_replace_and_canonical():
    ctx = Tagged(torch.ones(2)).__tensor_flatten__()[1]
    r = ctx.replace(eps=0.5, dtype=torch.float16)
    assert (r.eps, r.dtype, r.color) == (0.5, torch.float16, Color.RED) and ctx.eps == 0.1
    with pytest.raises(AttributeError):
        ctx.replace(nope=1)
    canon = ctx.canonical()
    json.dumps(canon)  # JSON-able
    assert canon["owner"] == "Tagged" and canon["dtype"] == "torch.float32"
    # frozenset order must not depend on the hash seed: canonical sorts it.
    fields = dict((n, v) for n, v in canon["fields"])
    assert fields["names"] == ["frozenset", ["x", "y", "z"]]
    assert fields["eps"] == ["float", (0.1).hex()]


def test_ctx_canonical_is_the_guards_canonicaliser():
    # One canonicaliser in the distribution: a ctx's meta values render exactly as guards'
    # cache keys render them (enums by name, not by value; floats exactly).
    from guards._canonical import canonical

    ctx = Tagged(torch.ones(2), color=Color.BLUE).__tensor_flatten__()[1]
    for name, value in ctx.fields:
        assert dict(ctx.canonical()["fields"])[name] == canonical(value)
    color = dict(ctx.canonical()["fields"])["color"]
    assert color[0] == "enum" and color[-1] == "BLUE"  # by name (Color.BLUE.value is 2)


# ---- stable hash -----------------------------------------------------------------------------


def test_stable_hash_depends_on_metadata_not_values():
    x = BlockScaled.from_float(torch.randn(64, 8), block=16)
    y = BlockScaled.from_float(torch.randn(64, 8), block=16)
    assert x._stable_hash_for_caching() == y._stable_hash_for_caching()
    others = [
        BlockScaled.from_float(torch.randn(64, 8), block=32),  # meta
        BlockScaled.from_float(torch.randn(48, 8), block=16),  # shape
        BlockScaled.from_float(torch.randn(64, 8, dtype=torch.float64), block=16),  # outer dtype
        type(x).__tensor_unflatten__({"qdata": x.qdata, "scale": x.scale}, x.__tensor_flatten__()[1], x.shape, (1, 64)),
    ]
    hashes = {o._stable_hash_for_caching() for o in others} | {x._stable_hash_for_caching()}
    assert len(hashes) == 5


# ---- repr, deepcopy, pickling ------------------------------------------------------------------


def test_repr_names_fields_meta_size_dtype():
    x = BlockScaled(
        torch.tensor([[1, -2], [3, 4]], dtype=torch.int8), torch.tensor([[0.5]]), block=2, dtype=torch.float32
    )
    assert_expected_inline(
        repr(x),
        """\
BlockScaled(
  qdata=tensor([[ 1, -2],
          [ 3,  4]], dtype=torch.int8),
  scale=tensor([[0.5000]]),
  block=2,
  size=(2, 2),
  dtype=torch.float32)""",
    )
    g = TwoTensor(torch.zeros(1), torch.ones(1), requires_grad=True)
    assert repr(g).endswith("dtype=torch.float32,\n  requires_grad=True)")


@pytest.mark.parametrize("t", samples())
def test_deepcopy_copies_inner_tensors_and_keeps_ctx(t):
    u = copy.deepcopy(t)
    assert type(u) is type(t) and u is not t
    names, ctx = t.__tensor_flatten__()
    assert u.__tensor_flatten__() == (names, ctx)
    assert u.shape == t.shape and u.stride() == t.stride()
    for n in names:
        assert getattr(u, n).data_ptr() != getattr(t, n).data_ptr()
        assert torch.equal(getattr(u, n), getattr(t, n))


def test_deepcopy_keeps_shared_references_and_requires_grad():
    x = TwoTensor(torch.ones(2), torch.zeros(2), requires_grad=True)
    a, b = copy.deepcopy([x, x])
    assert a is b and a.requires_grad


@pytest.mark.parametrize("t", samples())
def test_pickle_round_trip(t):
    u = pickle.loads(pickle.dumps(t))
    assert type(u) is type(t)
    assert u.__tensor_flatten__() == t.__tensor_flatten__()
    assert u.shape == t.shape and u.stride() == t.stride() and u.requires_grad == t.requires_grad
    for n in t.__tensor_flatten__()[0]:
        assert torch.equal(getattr(u, n), getattr(t, n))


def test_pickle_keeps_requires_grad_and_non_contiguous_stride():
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).t()
    x.requires_grad_(True)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    y = torch.load(buf, weights_only=False)
    assert y.requires_grad and y.stride() == x.stride() and torch.equal(y.a, x.a)


# ---- hooks -----------------------------------------------------------------------------------


def test_torch_function_is_disabled_by_default():
    assert TwoTensor.__torch_function__ is torch._C._disabled_torch_function_impl
    x = TwoTensor(torch.ones(2), torch.ones(2))
    # Dispatch still sees the op and keeps the type.
    assert type(torch.add(x, 1)) is TwoTensor


def test_coerce_tangent_hooks():
    x = BlockScaled.__samples__()[1]
    ctx = x.__tensor_flatten__()[1]
    assert x.__coerce_tangent_metadata__() is x
    assert x.__coerce_same_metadata_as_tangent__(ctx) is x
    assert x.__coerce_same_metadata_as_tangent__(ctx, BlockScaled) is x
    assert x.__coerce_same_metadata_as_tangent__(ctx.replace(block=32)) is None
    plain = x.__coerce_same_metadata_as_tangent__(None, torch.Tensor)
    assert type(plain) is torch.Tensor and torch.equal(plain, x.to_plain())
    assert x.__coerce_same_metadata_as_tangent__(ctx, ScaledTensor) is None


@pytest.mark.parametrize("cls", [Labeled, Relabeling])
def test_coerce_same_metadata_as_tangent_is_used_by_compiled_backward_and_overridable(cls):
    x = cls(torch.ones(3), requires_grad=True)
    compiled, _ = compile_counted(lambda x: x * 2, "aot_eager")
    out = compiled(x)
    tangent = cls(torch.full((3,), 0.5), label="other")  # traced with label "x"
    if cls is Labeled:
        # The default refuses another ctx; torch reports it and names the hook to implement.
        with pytest.raises(RuntimeError, match="__coerce_same_metadata_as_tangent__"):
            out.backward(tangent)
    else:
        out.backward(tangent)
        assert type(x.grad) is cls and x.grad.label == "x"
        assert torch.equal(x.grad.left, torch.ones(3))
