"""Declared relations reach dynamo: its own guards carry them, and guards.build predicts them.

A kit class honours the outer size ``__tensor_unflatten__`` receives, so without help
dynamo would see unrelated symbols for the outer size and the inner sizes. The kit's
unflatten records each declared equality with ``torch._check``; here we compile for real
and read dynamo's guards, and check them against the kit's guard set on the same inputs.
"""

import torch
from torch._dynamo.testing import CompileCounter

import guards
import symbolic
from guards import _compat as guards_compat
from subclass_kit import WrapperTensor, fallbacks, inner


class Doubled(WrapperTensor):
    """Throwaway: the inner tensor has twice the outer rows (the issue's ``Eq(2*s50, s77)``)."""

    payload: torch.Tensor = inner()
    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"payload": (2 * rows, cols)}

    def to_plain(self):
        return self.payload[: self.shape[0]]


def doubled(rows, cols=3):
    return Doubled(torch.randn(2 * rows, cols), size=(rows, cols))


def broken(rows, payload_rows, cols=3):
    """An instance whose inner size contradicts the declared relation (set after construction)."""
    x = doubled(rows, cols)
    object.__setattr__(x, "payload", torch.randn(payload_rows, cols))
    return x


def _compile_marked():
    cnt = CompileCounter()

    @torch.compile(backend=cnt, dynamic=False)
    def f(x):
        return x.payload * 2

    x = doubled(4)
    symbolic.mark_dynamic(x, 0)
    f(x)
    (entry,) = guards_compat.cache_entries(f._torchdynamo_orig_callable)
    return f, cnt, entry, x


def test_dynamo_guards_carry_the_declared_relation():
    f, cnt, entry, x = _compile_marked()
    text = str(entry.guard_manager)
    # dynamo related the two symbols (the outer one is replaced by the inner one, or the
    # other way round): one guard names both sizes.
    related = [ln for ln in text.splitlines()
               if "L['x'].size()[0]" in ln and "L['x'].payload.size()[0]" in ln and "LAMBDA_GUARD" in ln]
    assert related, text
    # Inputs that keep the relation reuse the graph; one that breaks it fails dynamo's guard.
    for rows in (6, 11):
        f(doubled(rows))
    assert cnt.frame_count == 1
    bad = broken(6, 7)
    assert entry.guard_manager.check({"x": doubled(6)})
    assert not entry.guard_manager.check({"x": bad})


def test_guard_set_predicts_dynamo_on_related_and_broken_inputs():
    f, cnt, entry, x = _compile_marked()
    gs = guards.build(x)
    assert "L['x'].payload.size()[0] == 2*L['x'].size()[0]" in gs.describe()
    inputs = [doubled(6), doubled(2), doubled(40), broken(6, 7), broken(6, 11), broken(3, 6)]
    for v in inputs:
        assert gs.check(v) == bool(entry.guard_manager.check({"x": v})), (tuple(v.shape), tuple(v.payload.shape))
    assert gs.explain(broken(6, 7)) == ["L['x'].payload.size()[0]: expected 2*L['x'].size()[0] = 12, got 7"]


def test_recompile_report_agrees_on_a_relation_violation():
    def mk(rows):
        x = doubled(rows)
        symbolic.mark_dynamic(x, 0)
        return x

    # (A broken instance cannot be marked: symbolic.mark_dynamic reports the contradiction.
    # Unmarked, dynamo compiles it statically, and no relation is needed.)
    r = guards.explain_recompiles(lambda x: x.payload * 2, [(mk(4),), (mk(9),), (broken(5, 12),)], dynamic=False)
    assert r.agrees, str(r)
    assert [c.compiled for c in r.calls] == [True, False, True], str(r)
    assert any("payload.size()[0]" in reason for reason in r.calls[2].reasons), str(r)
    assert any("payload.size()[0]" in reason for reason in r.calls[2].predicted_reasons), str(r)
