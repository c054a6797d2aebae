"""The real subclasses of the foreign suite: how to build each on CPU, a variant with one ctx
field changed, the op it is compiled through, and the dim made dynamic.

torchao 0.18 (CPU): Int8Tensor, IntxUnpackedToInt8Tensor, Float8Tensor, NF4Tensor,
Float8TrainingTensor, OptimState8bit; torch: the jagged NestedTensor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

logging.getLogger("torchao").setLevel(logging.ERROR)

K = 64  # in_features of every weight


def _w(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))


def int8(rows, variant=False):
    from torchao.quantization import Int8Tensor
    from torchao.quantization.granularity import PerRow, PerTensor

    return Int8Tensor.from_hp(_w(rows), PerTensor() if variant else PerRow())


def intx(rows, variant=False):
    from torchao.quantization import IntxUnpackedToInt8Tensor

    return IntxUnpackedToInt8Tensor.from_hp(_w(rows), (1, 16 if variant else 32), torch.int4)


def float8(rows, variant=False):
    from torchao.quantization import Float8Tensor
    from torchao.quantization.granularity import PerRow, PerTensor

    return Float8Tensor.from_hp(_w(rows), granularity=PerTensor() if variant else PerRow())


def nf4(rows, variant=False):
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    return to_nf4(_w(rows), 32 if variant else 64, 16)


def _mm_config(variant=False):
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    emulate = ScaledMMConfig(emulate=True)  # no float8 GEMM on CPU: emulated
    # the variant changes one nested field: grad_weight's use_fast_accum
    last = ScaledMMConfig(emulate=True, use_fast_accum=True) if variant else emulate
    return LinearMMConfig(emulate, emulate, last)


def f8train(rows, variant=False, *, seed=0):
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole

    return hp_tensor_to_float8_dynamic(_w(rows, seed), torch.float8_e4m3fn, _mm_config(variant),
                                       gemm_input_role=GemmInputRole.WEIGHT)


def optim8(rows, variant=False):
    from torchao.optim.subclass_8bit import OptimState8bit

    s = OptimState8bit.zeros((rows, K), signed=not variant)
    s.copy_(_w(rows).abs() if variant else _w(rows))
    return s


def njt(rows, variant=False):
    # rows // 16 sequences of lengths 2, 3, ...; the variant has one sequence more
    n = rows // 16 + (1 if variant else 0)
    g = torch.Generator().manual_seed(rows)
    return torch.nested.nested_tensor([torch.randn(i + 2, K, generator=g) for i in range(n)], layout=torch.jagged)


def _linear(x, w):
    return F.linear(x, w)


def _f8_mm(x, w):
    return torch.mm(x, w.t())


def _dequant_mm(x, s):
    return x @ s.dequantize().t()


def _njt_linear(x, t):
    return F.linear(t, x).sin()


@dataclass(frozen=True)
class Foreign:
    name: str
    make: Callable  # (rows, variant=False) -> tensor
    op: Callable  # (x, t) -> result, the compiled function
    field: object  # the ctx key the variant changes (None: a size changes instead)
    mark: dict = field(default_factory=dict)  # kwargs for symbolic.mark_dynamic(t, 0, ...)
    pinned: bool = False  # the ctx stores the shape: dim 0 cannot be dynamic

    def x(self, rows):
        """The other operand of ``op`` for a subject of ``rows`` rows."""
        g = torch.Generator().manual_seed(1)
        if self.name == "NestedTensor":
            return torch.randn(16, K, generator=g)
        x = torch.randn(4, K, generator=g)
        if self.name == "Float8TrainingTensor":
            from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
            from torchao.float8.float8_training_tensor import GemmInputRole

            return hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, _mm_config(), gemm_input_role=GemmInputRole.INPUT)
        return x


CLASSES = [
    Foreign("Int8Tensor", int8, _linear, "block_size"),
    Foreign("IntxUnpackedToInt8Tensor", intx, _linear, "block_size"),
    Foreign("Float8Tensor", float8, _linear, "block_size"),
    Foreign("NF4Tensor", nf4, _linear, "block_size", pinned=True),
    Foreign("Float8TrainingTensor", f8train, _f8_mm, "_linear_mm_config"),
    # its scale is flat (rows * 64 / 256 blocks): no same-index relation, so named
    Foreign("OptimState8bit", optim8, _dequant_mm, 0, mark={"inner": {"scale": [0]}}),
    Foreign("NestedTensor", njt, _njt_linear, None),
]
BY_NAME = {c.name: c for c in CLASSES}
SIZES = (32, 48, 64)


# ---- ops for check_subclass(ops=[...]): called as op(sample) ------------------------------------
_X = torch.randn(4, K, generator=torch.Generator().manual_seed(2))


def linear_of(w):
    """F.linear(x, w) for a fixed activation x."""
    return F.linear(_X, w)


_X8 = []


def f8_mm_of(w):
    """mm of a float8 training activation with ``w.t()``."""
    if not _X8:
        _X8.append(BY_NAME["Float8TrainingTensor"].x(0))
    return _f8_mm(_X8[0], w)


def dequant_mm_of(s):
    """x @ s.dequantize().t()."""
    return _dequant_mm(_X, s)


_XN = torch.randn(16, K, generator=torch.Generator().manual_seed(3))


def njt_linear_of(t):
    """sin(F.linear(t, x)) on a jagged tensor."""
    return _njt_linear(_XN, t)


CHECK_OPS = {
    "Int8Tensor": linear_of,
    "IntxUnpackedToInt8Tensor": linear_of,
    "Float8Tensor": linear_of,
    "NF4Tensor": linear_of,
    "Float8TrainingTensor": f8_mm_of,
    "OptimState8bit": dequant_mm_of,
    "NestedTensor": njt_linear_of,
}
