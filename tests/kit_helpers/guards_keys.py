"""Deterministic values whose cache keys the subprocess tests compare across processes."""

import torch
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


def values() -> dict:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    marked = BlockScaled.from_float(r(64, 8), block=32)
    symbolic.mark_dynamic(marked, 0)
    tt = TorchTwoTensor(r(4, 3), r(4, 3))
    torch._dynamo.mark_dynamic(tt, 1)
    return {
        "plain": r(4, 3),
        "transposed": r(3, 4).t(),
        "block32": BlockScaled.from_float(r(64, 8), block=32),
        "block16": BlockScaled.from_float(r(64, 8), block=16),
        "scaled": ScaledTensor.from_float(r(5, 3)),
        "two": TwoTensor(r(4, 3), r(4, 3)),
        "torch_two_marked": tt,
        "nested": TwoTensor(ScaledTensor.from_float(r(4, 3)), ScaledTensor.from_float(r(4, 3))),
        "block_marked": marked,
        "pytree": {"w": TwoTensor(r(2, 2), r(2, 2)), "n": 3, "f": 0.1, "s": "relu", "none": None,
                   "l": [r(1), True, torch.float16]},
    }
