"""A float8 wrapper written as a newcomer would: float8 data, a scalar scale, to_plain fallback."""

from __future__ import annotations

import torch

from subclass_kit import WrapperTensor, fallbacks, inner


class Float8Scaled(WrapperTensor):
    """float8_e4m3fn data times one float32 scale."""

    qdata: torch.Tensor = inner(dtype=torch.float8_e4m3fn)
    scale: torch.Tensor = inner(dtype=torch.float32)

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"qdata": tuple(outer_size), "scale": ()}

    @classmethod
    def from_float(cls, x):
        scale = (x.abs().amax().clamp_min(1e-12) / 448.0).float()
        return cls((x / scale).to(torch.float8_e4m3fn), scale, dtype=x.dtype)

    def to_plain(self):
        return (self.qdata.to(torch.float32) * self.scale).to(self.dtype)

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(0)
        return [cls.from_float(torch.randn(8, 16, generator=g)), cls.from_float(torch.randn(12, 16, generator=g))]
