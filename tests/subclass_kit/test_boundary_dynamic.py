"""``subclass_kit.compile`` on arguments with dims marked dynamic: one body for every size
(``_boundary_dynamic``), served by dynamo's guards directly, wrapper outputs of symbolic
size rebuilt with this call's sizes, and a size outside dynamo's guards recompiles (never a
stale artifact). Compiles are counted with dynamo's counter; values against eager."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import subclass_kit
from kit_helpers.compiling import assert_same, storage_id
from subclass_kit.examples import ScaledTensor, TwoTensor


def _two(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TwoTensor(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


def _marked(*shape, seed=0):
    x, y = _two(*shape, seed=seed), torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(y, 0)
    return x, y


def _fn(x, y):
    # A wrapper of symbolic size, a 0-d one, and a transposed view: every output rebuilt.
    return x * y + 1, [x.sum(), (x + 1).t()]


def _served(backend="aot_eager"):
    cnt = CompileCounterWithBackend(backend)
    return subclass_kit.compile(_fn, backend=cnt, fullgraph=True), cnt


def _entry(f):
    (e,) = [e for b in f._table.values() for e in b]
    return e


def test_marked_dims_compile_once_for_every_size_and_run_directly():
    f, cnt = _served()
    with torch.no_grad():
        for n in (5, 7, 12, 9):
            x, y = _marked(n, 3, seed=n)
            assert_same(f(x, y), _fn(x, y))
    assert cnt.frame_count == 1 and f.fallback_calls == 0 and len(f) == 1
    e = _entry(f)
    assert e.direct is not None and len(e.direct.runs) == 1  # dynamo's guards, without its frame entry
    assert e.record is not None and e.record.unsafe is None
    with torch.no_grad():
        x, y = _two(6, 3), torch.randn(6, 3)  # unmarked, another size: the same body serves
        assert_same(f(x, y), _fn(x, y))
    assert cnt.frame_count == 1
    assert f.explain(x, y) == ["artifact 0: accepts"]
    assert f.explain(_two(6, 3, 1), torch.randn(6, 3, 1)) == ["artifact 0: args[0].dim(): expected 2, got 3"]


def test_a_size_outside_dynamos_guards_recompiles_never_stale():
    f, cnt = _served()
    with torch.no_grad():
        x, y = _marked(5, 3)
        assert_same(f(x, y), _fn(x, y))
        x4, y4 = _marked(5, 4, seed=1)  # dim 1 was not marked: static in the graph
        assert_same(f(x4, y4), _fn(x4, y4))
        assert cnt.frame_count == 2
        for n in (8, 11):  # each size reaches the entry dynamo guards it with
            for d in (3, 4):
                x, y = _marked(n, d, seed=n + d)
                assert_same(f(x, y), _fn(x, y))
        x1, y1 = _two(1, 3), torch.randn(1, 3)  # size 1: dynamo specializes it, apart
        assert_same(f(x1, y1), _fn(x1, y1))
    assert cnt.frame_count == 3 and f.fallback_calls == 0 and len(f) == 1


def test_views_with_a_symbolic_offset_keep_their_layout_and_aliasing():
    def views(x):
        return x[1:], x.t()[1:]

    cnt = CompileCounterWithBackend("aot_eager")
    f = subclass_kit.compile(views, backend=cnt, fullgraph=True)
    with torch.no_grad():
        for n in (5, 7, 9):
            x = _two(n, n + 2, seed=n)
            torch._dynamo.mark_dynamic(x, [0, 1])
            for got, want in zip(f(x), views(x)):
                assert_same(got, want)
                assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset())
                assert storage_id(got) == storage_id(x) and storage_id(got.a) == storage_id(x.a)
    assert cnt.frame_count == 1 and f.fallback_calls == 0


def test_a_dtype_change_is_still_a_new_key():
    f = subclass_kit.compile(lambda w, a: w * a, backend="aot_eager")
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64, torch.float32):
            w, a = ScaledTensor.from_float(torch.randn(8, 4, dtype=dtype)), torch.randn(8, 4, dtype=dtype)
            torch._dynamo.mark_dynamic(w, 0)
            torch._dynamo.mark_dynamic(a, 0)
            assert_same(f(w, a), w * a)
    assert len(f) == 2 and f.fallback_calls == 0


@pytest.mark.slow
def test_inductor_marked_dims_compile_once():
    f, cnt = _served("inductor")
    with torch.no_grad():
        for n in (5, 7, 12):
            x, y = _marked(n, 3, seed=n)
            assert_same(f(x, y), _fn(x, y))
    assert cnt.frame_count == 1 and f.fallback_calls == 0
    assert len(_entry(f).direct.runs) == 1
