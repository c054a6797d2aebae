"""GuardedDispatcher: reuse the artifact whose guards accept, across torch.compile and torch.export."""

import pytest
import torch
from expecttest import assert_expected_inline
from torch._dynamo.testing import CompileCounter

import guards
from subclass_kit.examples import BlockScaled, TwoTensor


def f(x):
    return x * 2 + 1


class M(torch.nn.Module):
    def forward(self, x):
        return f(x)


def test_dispatches_between_compile_and_export_artifacts():
    made = []

    def compile_fn(x):
        # Wrapped inputs get an exported program (which itself rejects any other shape);
        # plain tensors a torch.compile(dynamic=False) function with its own counter.
        if isinstance(x, TwoTensor):
            made.append(("export", None))
            return torch.export.export(M(), (x,)).module()
        cnt = CompileCounter()
        made.append(("compile", cnt))
        return torch.compile(f, backend=cnt, dynamic=False)

    d = guards.GuardedDispatcher(compile_fn)
    two = lambda r: TwoTensor(torch.randn(r, 3), torch.randn(r, 3))  # noqa: E731
    calls = [torch.randn(4, 3), two(4), torch.randn(4, 3), two(4), torch.randn(5, 3), two(5), two(4), torch.randn(5, 3)]
    for x in calls:
        out = d(x)
        ref = f(x)
        if isinstance(x, TwoTensor):
            assert isinstance(out, TwoTensor) and torch.equal(out.a, ref.a) and torch.equal(out.b, ref.b)
        else:
            assert torch.equal(out, ref)
    assert [k for k, _ in made] == ["compile", "export", "compile", "export"]
    assert [e.hits for e in d.entries] == [1, 2, 1, 0]
    # Every torch.compile artifact compiled exactly once: the dispatcher never handed one
    # an input its guards would reject (an export artifact would have raised instead).
    assert [c.frame_count for k, c in made if k == "compile"] == [1, 1]
    assert_expected_inline(
        "\n".join(d.explain(two(6))),
        """\
artifact 0: type(L['x']): expected Tensor, got TwoTensor
artifact 1: L['x'].size()[0]: expected 4, got 6
artifact 1: L['x'].a.size()[0]: expected 4, got 6
artifact 1: L['x'].b.size()[0]: expected 4, got 6
artifact 2: type(L['x']): expected Tensor, got TwoTensor
artifact 3: L['x'].size()[0]: expected 5, got 6
artifact 3: L['x'].a.size()[0]: expected 5, got 6
artifact 3: L['x'].b.size()[0]: expected 5, got 6""",
    )


def test_meta_value_selects_the_artifact():
    d = guards.GuardedDispatcher(lambda x: torch.compile(lambda y: y * 3, backend="eager", dynamic=False))
    a = BlockScaled.from_float(torch.randn(64, 8), block=32)
    b = BlockScaled.from_float(torch.randn(64, 8), block=16)
    for x in (a, b, a, b):
        torch.testing.assert_close(d(x), x.to_plain() * 3)
    assert len(d) == 2 and [e.hits for e in d.entries] == [1, 1]
    assert d.explain(a) == ["artifact 0: accepts",
                            "artifact 1: L['x'].__tensor_flatten__()[1].block: expected 16, got 32",
                            "artifact 1: L['x'].scale.size()[0]: expected 4, got 2"]


def test_several_inputs_are_named():
    d = guards.GuardedDispatcher(lambda a, b: (lambda a, b: a + b), names=("a", "b"))
    d(torch.ones(2), torch.ones(2))
    assert d.explain(torch.ones(2), torch.ones(3)) == ["artifact 0: L['b'].size()[0]: expected 2, got 3"]
    with pytest.raises(TypeError, match="names"):
        d(torch.ones(2))
