"""A QLoRA-style NF4 weight written on the kit, as a newcomer would (issue 23).

4-bit codes packed two per uint8 in a flat ``qdata``; one absmax per block of 64 values,
double-quantized: int8 ``scalers`` with one float ``factors`` entry per block of 256
scalers. Every inner tensor is flat, so its size is ``rows * cols`` divided by a constant:
a weight needs ``rows * cols`` to be a multiple of 64 * 256. ``NF4WithBlocks`` is the same
class keeping the block count in a meta field (torchao's habit), which pins the size.
"""

from __future__ import annotations

import torch

from subclass_kit import WrapperTensor, fallbacks, inner, meta
from symbolic import floor_div

BLOCK = 64
SCALER_BLOCK = 256

# The 16 NF4 levels (normal-float quantiles), as in QLoRA.
_LEVELS = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]
LEVELS = torch.tensor(_LEVELS)


def _quantize(x: torch.Tensor):
    flat = x.reshape(-1).float()
    absmax = flat.reshape(-1, BLOCK).abs().amax(dim=1).clamp_min(1e-12)
    factors = absmax.reshape(-1, SCALER_BLOCK).abs().amax(dim=1) / 127.0
    scalers = torch.round(absmax.reshape(-1, SCALER_BLOCK) / factors[:, None]).clamp(-127, 127)
    scalers = scalers.to(torch.int8).reshape(-1)
    deq_absmax = (scalers.float().reshape(-1, SCALER_BLOCK) * factors[:, None]).reshape(-1)
    normed = flat.reshape(-1, BLOCK) / deq_absmax[:, None]
    codes = (normed.reshape(-1, 1) - LEVELS).abs().argmin(dim=1).to(torch.uint8)
    qdata = (codes[0::2] << 4) | codes[1::2]
    return qdata, scalers, factors


def _dequantize(qdata, scalers, factors, shape, dtype):
    codes = torch.stack([qdata >> 4, qdata & 15], dim=1).reshape(-1).long()
    absmax = (scalers.float().reshape(-1, SCALER_BLOCK) * factors[:, None]).reshape(-1)
    # Built here, not read from the module: to_plain also runs on fake tensors (in graphs).
    levels = torch.tensor(_LEVELS, dtype=torch.float32, device=qdata.device)
    vals = levels[codes].reshape(-1, BLOCK) * absmax[:, None]
    return vals.reshape(shape).to(dtype)


class NF4(WrapperTensor):
    """NF4 weight: flat packed codes, int8 absmax per 64 values, float factor per 256 absmax."""

    qdata: torch.Tensor = inner(dtype=torch.uint8)
    scalers: torch.Tensor = inner(dtype=torch.int8)
    factors: torch.Tensor = inner(dtype=torch.float32)

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        n = rows * cols
        return {
            "qdata": (floor_div(n, 2),),
            "scalers": (floor_div(n, BLOCK),),
            "factors": (floor_div(n, BLOCK * SCALER_BLOCK),),
        }

    @classmethod
    def from_float(cls, x: torch.Tensor) -> "NF4":
        return cls(*_quantize(x), size=x.shape, dtype=x.dtype)

    def to_plain(self):
        return _dequantize(self.qdata, self.scalers, self.factors, self.shape, self.dtype)


class NF4WithBlocks(WrapperTensor):
    """The same layout with the block count kept in a meta field: every size is a new ctx."""

    qdata: torch.Tensor = inner(dtype=torch.uint8)
    scalers: torch.Tensor = inner(dtype=torch.int8)
    factors: torch.Tensor = inner(dtype=torch.float32)
    n_blocks: int = meta()

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {
            "qdata": (ctx.n_blocks * (BLOCK // 2),),
            "scalers": (ctx.n_blocks,),
            "factors": (floor_div(ctx.n_blocks, SCALER_BLOCK),),
        }

    @classmethod
    def from_float(cls, x: torch.Tensor) -> "NF4WithBlocks":
        q, s, f = _quantize(x)
        return cls(q, s, f, n_blocks=s.numel(), size=x.shape, dtype=x.dtype)

    def to_plain(self):
        return _dequantize(self.qdata, self.scalers, self.factors, self.shape, self.dtype)


def weight(rows: int, cols: int = 128, *, cls=NF4, seed: int | None = None):
    g = torch.Generator().manual_seed(rows * 7 + cols if seed is None else seed)
    return cls.from_float(torch.randn(rows, cols, generator=g))
