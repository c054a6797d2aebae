"""A compiled function that runs ``backward()`` inside it matches eager (loss and gradients).

Dynamo does not trace ``Tensor.backward()``: it breaks the graph there and runs the backward
eagerly, with its frame hook still live. The autograd engine then calls the class's
``__torch_dispatch__``, and AOTAutograd's runtime its ``__tensor_unflatten__``, from C, so
dynamo sees them as frames of their own. The dispatcher must not become a graph of its own
(the kit's handlers read ``__dict__``, which dynamo cannot), and an unflatten that dynamo
compiles must rebuild through the trusted path, not through the class's ``__new__``
(ShardedTensor's takes no ``dtype=``). The same in-graph rebuild serves user code that calls
``__tensor_unflatten__`` under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import pytest
import torch

from kit_helpers.compiling import assert_same, compile_counted
from subclass_kit.examples import TwoTensor
from subclass_kit.sharded import MeshRef, Shard, ShardedTensor, distribute


def _two():
    g = torch.Generator().manual_seed(0)
    return TwoTensor(torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g))


def _sharded():
    g = torch.Generator().manual_seed(1)
    return distribute(torch.randn(4, 3, generator=g), MeshRef.local(), [Shard(0)])


def _loss_and_backward(w, x):
    loss = (w * x + w.sin()).sum()
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("make", [_two, _sharded], ids=["TwoTensor", "ShardedTensor"])
def test_backward_inside_a_compiled_function_matches_eager(make):
    torch._dynamo.reset()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    w_eager = make().requires_grad_(True)
    w_compiled = make().requires_grad_(True)
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_loss_and_backward, backend=cnt)

    expected = _loss_and_backward(w_eager, x)
    got = compiled(w_compiled, x)

    assert cnt.frame_count >= 1  # the forward before the break was compiled, not skipped
    assert_same(got, expected)
    assert type(w_compiled.grad) is type(w_eager.grad)
    assert_same(w_compiled.grad, w_eager.grad)
    # A second call reuses what was compiled and accumulates the same gradient again.
    frames = cnt.frame_count
    _loss_and_backward(w_eager, x)
    compiled(w_compiled, x)
    assert cnt.frame_count == frames
    assert_same(w_compiled.grad, w_eager.grad)


def test_unflatten_traced_by_dynamo_is_one_node_through_the_trusted_rebuild():
    # ShardedTensor.__new__ has its own signature (no dtype=); rebuilding through it failed.
    torch._dynamo.reset()
    t = _sharded()
    names, ctx = t.__tensor_flatten__()
    size, stride = tuple(t.shape), t.stride()

    def rebuild_and_use(local):
        w = ShardedTensor.__tensor_unflatten__({"local": local}, ctx, size, stride)
        return (w * 2).to_local()

    compiled, cnt = compile_counted(rebuild_and_use, "aot_eager")
    local = t.to_local()
    assert_same(compiled(local), rebuild_and_use(local))
    assert cnt.frame_count == 1
