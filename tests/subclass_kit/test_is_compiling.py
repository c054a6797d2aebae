"""``is_compiling()``: True under torch.compile and torch.export (strict and non-strict), also
where it matters most, inside a handler while the op is traced; False in eager."""

from __future__ import annotations

import pytest
import torch

from kit_helpers.compiling import compile_counted
from subclass_kit import WrapperTensor, fallbacks, inner, is_compiling

SEEN: list = []


class Observed(WrapperTensor):
    val: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner


@Observed.implements(torch.ops.aten.mul.Tensor)
def _mul(func, types, args, kwargs):
    SEEN.append(is_compiling())
    return fallbacks.map_inner(func, types, args, kwargs)


class AddFlag(torch.nn.Module):
    def forward(self, x):
        return x + (1.0 if is_compiling() else 0.0)


class Mul(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_false_in_eager():
    assert is_compiling() is False
    assert torch.equal(AddFlag()(torch.zeros(2)), torch.zeros(2))
    SEEN.clear()
    Observed(torch.ones(2)) * 2
    assert SEEN == [False]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_true_under_compile(backend):
    compiled, cnt = compile_counted(AddFlag(), backend)
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2)) and cnt.frame_count == 1


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_true_under_export(strict):
    ep = torch.export.export(AddFlag(), (torch.zeros(2),), strict=strict)
    assert torch.equal(ep.module()(torch.zeros(2)), torch.ones(2))


def test_true_inside_a_handler_while_tracing():
    SEEN.clear()
    compiled, _ = compile_counted(lambda x: x * 2, "aot_eager")
    out = compiled(Observed(torch.ones(3)))
    assert torch.equal(out.val, torch.full((3,), 2.0))
    # Dynamo's fake propagation and AOTAutograd's trace both see True; the compiled graph
    # runs on plain tensors, so the handler is not called at run time.
    assert SEEN and all(SEEN)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_true_inside_a_handler_under_export(strict):
    SEEN.clear()
    torch.export.export(Mul(), (Observed(torch.ones(2)),), strict=strict)
    assert SEEN and all(SEEN)
