"""``subclass_kit.examples.JaggedTensor`` (issue 28, item 4): values and gradients against
the dense padded model on the meaningful positions, compile counts under every marking
style beside torch's NJT, and the checker.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import subclass_kit
import symbolic
from subclass_kit.examples import JaggedTensor
from subclass_kit.examples.jagged import JaggedLayoutError

D = 6


def _parts(lengths, d=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_() for n in lengths]


def _dense(parts):
    """The padded batch and its (B, max_len, 1) mask of meaningful rows."""
    padded = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)
    n = padded.shape[1]
    mask = (torch.arange(n)[None, :] < torch.tensor([p.shape[0] for p in parts])[:, None]).unsqueeze(-1)
    return padded, mask


def _masked_mean(h, mask):
    return (h * mask).sum(1) / mask.sum(1)


def _masked_softmax(h, mask):
    return torch.softmax(h.masked_fill(~mask, float("-inf")), dim=1)


_G = torch.Generator().manual_seed(7)
_W = torch.randn(4, D, generator=_G, dtype=torch.float64)
_BIAS = torch.randn(4, generator=_G, dtype=torch.float64)
_ROW = torch.randn(D, generator=_G, dtype=torch.float64)

# name -> (jagged fn, dense fn on (padded, mask)); each fn gets its input twice where it is binary.
OPS = {
    "sin": (torch.sin, lambda p, m: torch.sin(p)),
    "gelu": (F.gelu, lambda p, m: F.gelu(p)),
    "relu": (torch.relu, lambda p, m: torch.relu(p)),
    "mul_self": (lambda x: x * x, lambda p, m: p * p),
    "add_scalar": (lambda x: 2.5 - x, lambda p, m: 2.5 - p),
    "div_row": (lambda x: x / (_ROW.abs() + 1), lambda p, m: p / (_ROW.abs() + 1)),
    "mul_batch_row": (lambda x: x * _ROW[None, None], lambda p, m: p * _ROW[None, None]),
    "linear_bias": (lambda x: F.linear(x, _W, _BIAS), lambda p, m: F.linear(p, _W, _BIAS)),
    "sum_dim1": (lambda x: x.sum(dim=1), lambda p, m: (p * m).sum(1)),
    "mean_dim1": (lambda x: torch.mean(x, 1), _masked_mean),
    "softmax_dim1": (lambda x: torch.softmax(x, dim=1), _masked_softmax),
    "softmax_last": (lambda x: F.softmax(x, dim=-1), lambda p, m: F.softmax(p, dim=-1)),
}


def _compare(got, want, mask, parts_a, parts_b):
    """Values on the meaningful positions, then the gradients of the same weighted loss."""
    if isinstance(got, JaggedTensor):
        got = got.to_padded()
        m = mask.expand_as(want)
        torch.testing.assert_close(got[m], want[m])
        weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=want.dtype)
        loss_got, loss_want = (got * m * weights).sum(), (want.masked_fill(~m, 0) * weights).sum()
    else:
        torch.testing.assert_close(got, want)
        weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=want.dtype)
        loss_got, loss_want = (got * weights).sum(), (want * weights).sum()
    ga = torch.autograd.grad(loss_got, parts_a)
    gb = torch.autograd.grad(loss_want, parts_b)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("op", list(OPS))
def test_op_values_and_gradients_equal_the_dense_padded_model(op):
    fn, ref = OPS[op]
    lengths = (3, 7, 1, 5)
    parts_a, parts_b = _parts(lengths), _parts(lengths)
    padded, mask = _dense(parts_b)
    _compare(fn(JaggedTensor.from_list(parts_a)), ref(padded, mask), mask, parts_a, parts_b)


def test_binary_ops_on_two_jagged_tensors_need_the_same_sequences():
    x = JaggedTensor.from_list(_parts((2, 3)))
    y = JaggedTensor.from_list(_parts((2, 3), seed=1))
    torch.testing.assert_close((x + y).packed, x.packed + y.packed)
    with pytest.raises(JaggedLayoutError, match=r"seq_offsets \[0, 2, 5\] vs \[0, 3, 5\]"):
        x + JaggedTensor.from_list(_parts((3, 2)))
    with pytest.raises(JaggedLayoutError, match="tensor 1 has shape"):
        JaggedTensor.from_list([torch.ones(2, 3), torch.ones(2, 4)])


def test_layout_and_dense_views():
    x = JaggedTensor.from_list([torch.ones(2, 3), 2 * torch.ones(4, 3), torch.ones(0, 3)])
    assert tuple(x.shape) == (3, 4, 3) and x.lengths().tolist() == [2, 4, 0]
    padded = x.to_padded(-1.0)
    assert padded[0, 2:].eq(-1).all() and padded[1].eq(2).all() and padded[2].eq(-1).all()
    torch.testing.assert_close(x.to_plain(), x.to_padded(0.0))
    assert x.__plain_mask__()[:, :, 0].tolist() == [[True, True, False, False], [True] * 4, [False] * 4]


class _Model(torch.nn.Module):
    def __init__(self, d=D, hidden=10):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x))).mean(dim=1)

    def dense(self, padded, mask):
        return _masked_mean(self.down(F.gelu(self.up(padded))), mask)


def _batches(n=6, seed=0):
    """Batches of 5-200 tokens per sequence; B, max_len and the total all change from each
    batch to the next."""
    g = torch.Generator().manual_seed(seed)
    out, last = [], None
    while len(out) < n:
        b = int(torch.randint(2, 6, (1,), generator=g))
        lengths = torch.randint(5, 201, (b,), generator=g).tolist()
        key = (b, max(lengths), sum(lengths))
        if last is None or all(k != v for k, v in zip(key, last)):
            out.append(lengths)
            last = key
    return out


def _model_grads(model, out):
    return torch.autograd.grad(out.sum(), list(model.parameters()))


def test_model_values_and_gradients_equal_dense():
    model = _Model().double()
    for lengths in _batches(3):
        parts_a, parts_b = _parts(lengths), _parts(lengths)
        padded, mask = _dense(parts_b)
        got, want = model(JaggedTensor.from_list(parts_a)), model.dense(padded, mask)
        torch.testing.assert_close(got, want)
        for a, b in zip(_model_grads(model, got), _model_grads(model, want)):
            torch.testing.assert_close(a, b)
        got, want = model(JaggedTensor.from_list(parts_a)), model.dense(padded, mask)
        for a, b in zip(torch.autograd.grad(got.sum(), parts_a), torch.autograd.grad(want.sum(), parts_b)):
            torch.testing.assert_close(a, b)


def test_the_sequence_index_is_carried_and_equals_the_offsets_search():
    x = JaggedTensor.from_list([p.detach() for p in _parts((3, 1, 4))])
    searched = torch.searchsorted(x.seq_offsets[1:], torch.arange(8), right=True)
    assert torch.equal(x.seq_index, searched)
    assert JaggedTensor.from_plain(torch.ones(2, 3, 4)).seq_index.tolist() == [0, 0, 0, 1, 1, 1]
    y = F.gelu(F.linear(x, _W, _BIAS))
    assert y.seq_index.data_ptr() == x.seq_index.data_ptr()  # passed on, not recomputed
    # A wrapper built without it (wrap(packed, offsets)) derives it: the same values.
    bare = JaggedTensor.wrap(x.packed, x.seq_offsets, size=x.shape)
    assert bare.seq_index is None and "seq_index" not in bare.__tensor_flatten__()[0]
    for f in (lambda t: t.mean(dim=1), lambda t: torch.softmax(t, dim=1).to_padded(), lambda t: t.to_padded()):
        torch.testing.assert_close(f(bare), f(x))


def _searches_offsets(x) -> bool:
    """Whether the compiled forward graph of Linear -> mean over dim 1 searches the offsets."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    backend = AotEagerAndRecordGraphs()
    fn = torch.compile(lambda t: F.linear(t, _W, _BIAS).mean(dim=1), backend=backend, fullgraph=True)
    torch.testing.assert_close(fn(x), F.linear(x, _W, _BIAS).mean(dim=1))
    targets = {n.target for g in backend.fw_graphs for n in g.graph.nodes}
    return torch.ops.aten.searchsorted.Tensor in targets


def test_compiled_reduction_reads_the_carried_index_instead_of_searching_the_offsets():
    x = JaggedTensor.from_list([p.detach() for p in _parts((3, 5, 2))])
    assert not _searches_offsets(x)
    assert _searches_offsets(JaggedTensor.wrap(x.packed, x.seq_offsets, size=x.shape))


def _mark_kit(x):
    symbolic.mark_dynamic(x, [0, 1], inner={"packed": [0]})


def _mark_symbolic(x):
    symbolic.mark_dynamic(x, [0, 1])


def _mark_torch(x):
    torch._dynamo.mark_dynamic(x, [0, 1])


MARKINGS = {"symbolic_inner": _mark_kit, "symbolic": _mark_symbolic, "torch": _mark_torch, "automatic": None}


def _marks_free_dims(mark) -> bool:
    """Whether marking the outer dims reaches the FREE total-token dim (the marking rule of
    docs/symbolic.md, "Free dims under marking")."""
    x = JaggedTensor.__samples__()[0]
    mark(x)
    return 0 in symbolic.marks(x).inner.get("packed", {})


def _compiled_counts(build, mark, backend="aot_eager", *, backward=True, compiler=torch.compile):
    model = _Model()
    cnt = CompileCounterWithBackend(backend)
    compiled = compiler(model, backend=cnt, fullgraph=True)
    for lengths in _batches():
        parts = [p.detach().float() for p in _parts(lengths)]
        x = build(parts)
        if mark is not None:
            mark(x)
        with torch.set_grad_enabled(backward):
            got, want = compiled(x), model(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if backward:
            for a, b in zip(_model_grads(model, got), _model_grads(model, want)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert getattr(compiled, "fallback_calls", 0) == 0  # the boundary served every batch itself
    return cnt.frame_count


@pytest.mark.parametrize("marking", list(MARKINGS))
def test_one_compile_for_a_batch_sweep(marking):
    mark = MARKINGS[marking]
    assert mark is None or _marks_free_dims(mark)
    want = 2 if marking == "automatic" else 1  # automatic: the first batch compiles static
    assert _compiled_counts(JaggedTensor.from_list, mark) == want


def _njt(parts):
    return torch.nested.nested_tensor(parts, layout=torch.jagged)


def _mark_njt(x):
    # NJT's batch dim follows its offsets: both must be marked for one compile.
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x._offsets, 0)


@pytest.mark.parametrize("marking", ["torch", "automatic"])
def test_njt_anchor_counts(marking):
    # NJT's mean(dim=1) has no backward in torch 2.13 (a graph that needs one fails to
    # trace): forward only, under no_grad.
    want = 2 if marking == "automatic" else 1
    assert _compiled_counts(_njt, _mark_njt if marking == "torch" else None, backward=False) == want


@pytest.mark.slow
def test_inductor_one_compile_values_and_gradients():
    assert _compiled_counts(JaggedTensor.from_list, _mark_kit, backend="inductor") == 1


def test_the_compile_boundary_compiles_once_for_a_batch_sweep():
    # subclass_kit.compile: the model's body takes the plain inner tensors and a carrier of
    # each batch's outer size; one body serves every batch (gradients into the weights too).
    # torch's mark_dynamic sets the same marks (test_one_compile_for_a_batch_sweep).
    assert _compiled_counts(JaggedTensor.from_list, _mark_symbolic, compiler=subclass_kit.compile) == 1


def test_a_jagged_result_through_the_boundary_is_a_new_wrapper_keeping_the_offsets():
    # New packed rows beside the input's offsets: rebuilt as eager builds it (its own
    # wrapper storage), not as a view of the input, and served by the boundary every time.
    def fn(x):
        return F.gelu(F.linear(x, _W.float(), _BIAS.float()))

    cnt = CompileCounterWithBackend("aot_eager")
    served = subclass_kit.compile(fn, backend=cnt, fullgraph=True)
    with torch.no_grad():
        for lengths in _batches(2):
            x = JaggedTensor.from_list([p.detach().float() for p in _parts(lengths)])
            _mark_symbolic(x)
            got, want = served(x), fn(x)
            assert type(got) is JaggedTensor and got.shape == want.shape
            torch.testing.assert_close(got.packed, want.packed)
            assert torch.equal(got.seq_offsets, x.seq_offsets)
            assert got.untyped_storage()._cdata != x.untyped_storage()._cdata  # as eager: not a view
    assert cnt.frame_count == 1 and served.fallback_calls == 0


@pytest.mark.slow
def test_the_compile_boundary_under_inductor_compiles_once():
    assert _compiled_counts(JaggedTensor.from_list, _mark_symbolic, backend="inductor", backward=False,
                            compiler=subclass_kit.compile) == 1


def test_softmax_and_sum_compile_once_with_gradients_into_a_jagged_leaf():
    def fn(x):
        return torch.softmax(x * 2, dim=1).sum(dim=1) + x.mean(dim=1)

    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)
    for lengths in _batches(4, seed=1):
        parts = _parts(lengths)
        x = JaggedTensor.from_list([p.detach() for p in parts]).requires_grad_()
        _mark_kit(x)
        padded, mask = _dense(parts)
        got = compiled(x)
        want = _masked_softmax(padded * 2, mask).masked_fill(~mask, 0).sum(1) + _masked_mean(padded, mask)
        torch.testing.assert_close(got, want)
        (gx,) = torch.autograd.grad(got.sum(), x)
        (gd,) = torch.autograd.grad(want.sum(), padded)
        assert type(gx) is JaggedTensor
        m = mask.expand_as(gd)
        torch.testing.assert_close(gx.to_padded()[m], gd[m])
    assert cnt.frame_count == 1
