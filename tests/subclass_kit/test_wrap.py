"""Differentiable wrapping: ``Cls.wrap`` / ``x.unwrap()`` (issue 28, item 2).

A packed variable-length batch (packed (total, D), seq_offsets (B+1,), outer the padded
(B, max_len, D)) with torch-function handlers for ``F.linear``, ``F.gelu`` and the
per-sequence mean, built on wrap/unwrap; its gradients are compared with a dense padded
reference (masked mean), eagerly and under torch.compile (fullgraph). On main the handlers
could only use the constructor, which drops the graph: ``w.grad`` was None.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit import WrapGradientError, WrapperTensor, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


class Packed(WrapperTensor):
    """Sequences packed along dim 0; the outer tensor is the zero-padded (B, max_len, D)."""

    packed: torch.Tensor = inner()
    seq_offsets: torch.Tensor = inner(dtype=torch.int64)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"seq_offsets": (outer_size[0] + 1,)}  # packed: free (total tokens, D)

    def _index(self):
        total = self.packed.shape[0]
        tok = torch.arange(total, device=self.packed.device)
        batch = torch.searchsorted(self.seq_offsets[1:], tok, right=True)
        return batch, tok - self.seq_offsets[batch]

    def to_plain(self):
        B, L, D = self.shape
        batch, pos = self._index()
        return self.packed.new_zeros(B, L, D).index_put((batch, pos), self.packed)


def _size(x, d):
    return (x.shape[0], x.shape[1], d)


@Packed.implements_torch_function(F.linear)
def _linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    p, offs = x.unwrap()
    return Packed.wrap(F.linear(p, w, b), offs, size=_size(x, w.shape[0]))


@Packed.implements_torch_function(F.gelu)
def _gelu(func, types, args, kwargs):
    p, offs = args[0].unwrap()
    return Packed.wrap(F.gelu(p), offs, size=args[0].shape)


@Packed.implements_torch_function(torch.Tensor.mean, torch.mean)
def _mean(func, types, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    assert dim == 1, "the per-sequence mean only"
    p, offs = x.unwrap()
    batch, _ = x._index()
    lengths = (offs[1:] - offs[:-1]).to(p.dtype)
    sums = p.new_zeros(x.shape[0], p.shape[1]).index_add(0, batch, p)
    return sums / lengths[:, None]


def _batch(lengths, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    offs = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return torch.randn(int(offs[-1]), d, generator=g), offs


def _params(d=4, h=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in ((h, d), (h,), (3, h), (3,))]


def _model(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).mean(dim=1)


def _dense_model(padded, mask, w1, b1, w2, b2):
    y = F.linear(F.gelu(F.linear(padded, w1, b1)), w2, b2)
    m = mask[..., None].to(y.dtype)
    return (y * m).sum(1) / m.sum(1)


def _wrapped_model(packed, offs, size, *params):
    return _model(Packed.wrap(packed, offs, size=size), *params)


def _kit_grads(lengths, fn=_wrapped_model):
    packed, offs = _batch(lengths)
    packed.requires_grad_()
    params = _params()
    out = fn(packed, offs, (len(lengths), max(lengths), packed.shape[1]), *params)
    (out * torch.arange(1.0, out.numel() + 1).reshape(out.shape)).sum().backward()
    return out.detach(), packed.grad, [p.grad for p in params]


def _dense_grads(lengths):
    packed, offs = _batch(lengths)
    x = Packed(packed, offs, size=(len(lengths), max(lengths), packed.shape[1]))
    padded = x.to_plain().requires_grad_()
    mask = Packed(torch.ones(packed.shape[0], 1), offs, size=(len(lengths), max(lengths), 1)).to_plain()[..., 0] > 0
    params = _params()
    out = _dense_model(padded, mask, *params)
    (out * torch.arange(1.0, out.numel() + 1).reshape(out.shape)).sum().backward()
    batch, pos = x._index()
    return out.detach(), padded.grad[batch, pos], [p.grad for p in params]


def _assert_close(got, want):
    out, gp, gparams = got
    dout, dgp, dparams = want
    torch.testing.assert_close(out, dout)
    torch.testing.assert_close(gp, dgp)
    for a, b in zip(gparams, dparams):
        assert a is not None
        torch.testing.assert_close(a, b)


LENGTHS = [3, 7, 1, 5]


def test_wrap_eager_gradients_equal_dense():
    _assert_close(_kit_grads(LENGTHS), _dense_grads(LENGTHS))


def test_constructor_in_a_handler_drops_the_graph_and_wrap_does_not():
    packed, offs = _batch(LENGTHS)
    w = torch.randn(6, 4, requires_grad=True)
    x = Packed(packed, offs, size=(4, 7, 4))
    leaf = Packed(F.linear(packed, w), offs, size=(4, 7, 6))
    assert leaf.grad_fn is None  # the constructor: a leaf, w is cut off
    y = F.linear(x, w)
    assert y.grad_fn is not None and not y.is_leaf
    p, _ = y.unwrap()
    p.sum().backward()
    torch.testing.assert_close(w.grad, packed.sum(0).expand(6, 4))


def test_unwrap_gradient_is_a_wrapper_of_the_class_with_its_ctx():
    packed, offs = _batch(LENGTHS)
    x = Packed(packed, offs, size=(4, 7, 4)).requires_grad_()
    p, o = x.unwrap()
    assert o is not None and not o.requires_grad
    (p * 2).sum().backward()
    g = x.grad
    assert type(g) is Packed and g.shape == x.shape and g.stride() == x.stride()
    assert g.__tensor_flatten__()[1] == x.__tensor_flatten__()[1]
    torch.testing.assert_close(g.packed, torch.full_like(packed, 2.0))
    assert torch.equal(g.seq_offsets, offs)


def test_plain_gradient_is_split_by_to_plain():
    # A loss on to_plain(): the dense gradient reaches wrap's backward, which splits it with
    # the VJP of to_plain (the padding positions' gradient goes nowhere).
    packed, offs = _batch(LENGTHS)
    leaf = packed.clone().requires_grad_()
    x = Packed.wrap(leaf * 1.0, offs, size=(4, 7, 4))
    weight = torch.randn(4, 7, 4)
    (x.to_plain() * weight).sum().backward()
    batch, pos = x._index()
    torch.testing.assert_close(leaf.grad, weight[batch, pos])


def test_exemplars_wrap_and_unwrap_gradients_equal_dense():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4, requires_grad=True)
    t = TwoTensor.wrap(a * 2, b.exp())
    u = t * 3  # map_inner: the gradient is a TwoTensor
    ua, ub = u.unwrap()
    (ua.sum() + (ub * ub).sum()).backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 6.0))
    torch.testing.assert_close(b.grad, 2 * (3 * b.exp()) * 3 * b.exp())

    # BlockScaled: int8 data (no gradient) and a float scale; a plain gradient (through
    # fallbacks.to_plain) split by to_plain's VJP, compared with the dense dequantization.
    q = BlockScaled.from_float(torch.randn(64, 8), block=16)
    s = torch.rand(4, 1, requires_grad=True)
    x = BlockScaled.wrap(q.qdata, s * 1.0, block=16, dtype=torch.float32)
    (x.sum() * 2).backward()
    s_ref = s.detach().clone().requires_grad_()
    (q.qdata.float() * s_ref.repeat_interleave(16, 0)).sum().mul(2).backward()
    torch.testing.assert_close(s.grad, s_ref.grad)

    st = ScaledTensor.from_float(torch.randn(5, 3))
    s = st.scale.clone().requires_grad_()
    y = ScaledTensor.wrap(st.qdata, s * 1.0, dtype=torch.float32)
    y.to_plain().pow(2).sum().backward()
    q = st.qdata.float()
    torch.testing.assert_close(s.grad, (2 * q * q * s.detach()).sum(1, keepdim=True))


def test_wrap_without_grad_is_the_constructor():
    packed, offs = _batch(LENGTHS)
    x = Packed.wrap(packed, offs, size=(4, 7, 4))
    assert x.is_leaf and not x.requires_grad
    assert Packed.wrap(packed, offs, size=(4, 7, 4), requires_grad=True).requires_grad
    with torch.no_grad():
        assert Packed.wrap(packed.requires_grad_(), offs, size=(4, 7, 4)).is_leaf


def test_wrap_checks_as_the_constructor():
    from subclass_kit import ConstructionError, InnerShapeError

    packed, offs = _batch(LENGTHS)
    p = packed.requires_grad_()
    with pytest.raises(InnerShapeError, match="seq_offsets"):
        Packed.wrap(p, offs[:-1], size=(4, 7, 4))
    with pytest.raises(ConstructionError, match="unexpected keyword argument 'offsets'"):
        Packed.wrap(p, offsets=offs, size=(4, 7, 4))


class NoPlain(WrapperTensor):
    payload: torch.Tensor = inner()
    tag: int = meta(default=0)


def test_plain_gradient_without_to_plain_names_the_fix():
    a = torch.randn(3, requires_grad=True)
    x = NoPlain.wrap(a * 1.0)
    # _DenseGrad's path: a plain dense gradient into a class with no to_plain.
    from subclass_kit._pre_dispatch import _DenseGrad

    y = _DenseGrad.apply(x, torch.ones(3))
    with pytest.raises(WrapGradientError, match=r"NoPlain has no to_plain\(\).*NoPlain.wrap"):
        y.sum().backward()


def test_wrap_compiled_fullgraph_gradients_equal_dense():
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_wrapped_model, backend=cnt, fullgraph=True)
    _assert_close(_kit_grads(LENGTHS, compiled), _dense_grads(LENGTHS))
    assert cnt.frame_count == 1


def test_wrap_compiled_dynamic_one_graph_for_a_batch_sweep():
    # Sizes reach wrap as SymInts (total tokens, max_len, B): one graph for every batch.
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_wrapped_model, backend=cnt, fullgraph=True, dynamic=True)
    for lengths in ([3, 7, 1, 5], [2, 9, 4, 4], [5, 5, 6, 1, 2]):
        _assert_close(_kit_grads(lengths, compiled), _dense_grads(lengths))
    assert cnt.frame_count == 1


def test_wrap_inside_the_compiled_region_fullgraph():
    # wrap and unwrap themselves traced: one graph node each, gradients flow through both.
    def fn(packed, offs, w):
        x = Packed.wrap(packed * 1.0, offs, size=(4, 7, 4))
        p, _ = F.linear(x, w).unwrap()
        return p.pow(2).sum()

    packed, offs = _batch(LENGTHS)
    w = torch.randn(5, 4, requires_grad=True)
    leaf = packed.clone().requires_grad_()
    fn(leaf, offs, w).backward()
    want = (leaf.grad.clone(), w.grad.clone())
    leaf.grad = None
    w.grad = None
    cnt = CompileCounterWithBackend("aot_eager")
    torch.compile(fn, backend=cnt, fullgraph=True)(leaf, offs, w).backward()
    torch.testing.assert_close(leaf.grad, want[0])
    torch.testing.assert_close(w.grad, want[1])
    assert cnt.frame_count == 1


@pytest.mark.slow
def test_wrap_inductor_gradients_equal_dense():
    compiled = torch.compile(_wrapped_model, backend="inductor", fullgraph=True)
    _assert_close(_kit_grads(LENGTHS, compiled), _dense_grads(LENGTHS))


# ---- a handler that drops the graph is named (issue 28, item 5e) ------------------------------


class Leafy(WrapperTensor):
    """A handler written the way the issue's newcomer wrote it: the constructor."""

    packed: torch.Tensor = inner()
    seq_offsets: torch.Tensor = inner(dtype=torch.int64)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"seq_offsets": (outer_size[0] + 1,)}


@Leafy.implements_torch_function(F.linear)
def _leafy_linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    return Leafy(F.linear(x.packed, w), x.seq_offsets, size=(x.shape[0], x.shape[1], w.shape[0]))


@Leafy.implements_torch_function(torch.zeros_like)
def _leafy_zeros(func, types, args, kwargs):
    x = args[0]
    return Leafy(torch.zeros_like(x.packed), x.seq_offsets, size=x.shape)


def test_a_handler_that_drops_the_graph_is_named():
    from subclass_kit import GradientDroppedError

    packed, offs = _batch(LENGTHS)
    x = Leafy(packed, offs, size=(4, 7, 4))
    w = torch.randn(6, 4, requires_grad=True)
    with pytest.raises(GradientDroppedError) as e:
        F.linear(x, w)
    msg = str(e.value)
    assert "torch.nn.functional.linear" in msg and "_leafy_linear" in msg and "Leafy.wrap(" in msg
    assert isinstance(e.value, RuntimeError)
    # Without grad, or for a function with no gradient by definition, nothing to say.
    with torch.no_grad():
        F.linear(x, w)
    F.linear(x, w.detach())
    torch.zeros_like(Leafy(packed.requires_grad_(), offs, size=(4, 7, 4)))


class Param(WrapperTensor):
    payload: torch.Tensor = inner()


@Param.implements(torch.ops.aten.mul.Tensor)
def _param_mul(func, types, args, kwargs):
    # Below autograd: wrap is the constructor (no autograd node is recorded in dispatch).
    x, other = args
    return Param.wrap(x.payload * other)


def test_wrap_in_an_aten_handler_is_the_constructor():
    p = Param(torch.ones(3)).requires_grad_()
    out = p * 2.0
    assert type(out) is Param and out.grad_fn is not None  # autograd's own node, above dispatch
    out.unwrap()[0].sum().backward()
    assert type(p.grad) is Param
    torch.testing.assert_close(p.grad.payload, torch.full((3,), 2.0))


def test_exemplar_wrap_compiled_equals_eager():
    def fn(a, b):
        t = TwoTensor.wrap(a * 2, b.exp()) * 3  # map_inner on the wrapper
        ua, ub = t.unwrap()
        return ua.sum() + (ub * ub).sum()

    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4, requires_grad=True)
    fn(a, b).backward()
    want = (a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    cnt = CompileCounterWithBackend("aot_eager")
    torch.compile(fn, backend=cnt, fullgraph=True)(a, b).backward()
    torch.testing.assert_close((a.grad, b.grad), want)
    torch.testing.assert_close(want[0], torch.full_like(a, 6.0))
    assert cnt.frame_count == 1
