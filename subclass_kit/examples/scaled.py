"""``ScaledTensor``: int8 data with one float scale per row; outer dtype float32."""

from __future__ import annotations

import torch

from .. import fallbacks
from ..base import WrapperTensor
from ..fields import inner, meta

__all__ = ["ScaledTensor"]

aten = torch.ops.aten


class ScaledTensor(WrapperTensor):
    """int8 data with a per-row scale: ``value = qdata * scale``.

    Exercises: an outer dtype (float32) that differs from the primary's (int8), a derived
    inner shape (scale is ``(rows, 1)``), a real op handler (``mm`` without dequantizing the
    whole matrix), and ``fallbacks.to_plain`` for everything else. Results of ops are
    dense: gradients of a quantized tensor arrive dense, so an op that returned a
    ScaledTensor would make the compiled backward expect a wrapped tangent that never comes.

    Example:
        >>> import torch
        >>> w = ScaledTensor.from_float(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))
        >>> w.dtype, w.qdata.dtype, tuple(w.scale.shape)
        (torch.float32, torch.int8, (2, 1))
        >>> torch.allclose(w.to_plain(), torch.tensor([[1.0, -2.0], [0.5, 0.25]]), atol=0.02)
        True
    """

    qdata: torch.Tensor = inner(dtype=torch.int8, doc="int8 values, outer shape")
    scale: torch.Tensor = inner(dtype=(torch.float32, torch.bfloat16, torch.float16), doc="(rows, 1)")
    granularity: str = meta(default="row", doc="only 'row' is implemented")

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"qdata": (rows, cols), "scale": (rows, 1)}

    @classmethod
    def from_float(cls, x: torch.Tensor) -> "ScaledTensor":
        """Quantize a 2-D float tensor symmetrically per row."""
        amax = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
        scale = (amax / 127.0).to(torch.float32)
        qdata = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
        return cls(qdata, scale, dtype=x.dtype)  # type: ignore[call-arg]  # outer keywords: dataclass_transform shows only the fields

    @classmethod
    def from_plain(cls, t: torch.Tensor) -> "ScaledTensor":
        """Quantize ``t`` (the hook the checker's OpInfo sweep builds instances with); 2-D
        floating tensors only, anything else is a ValueError."""
        if t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"ScaledTensor holds 2-D floating tensors; got {t.dim()}-D {t.dtype}")
        return cls.from_float(t)

    def to_plain(self) -> torch.Tensor:
        """Dequantized dense tensor in the outer dtype."""
        return (self.qdata.to(self.scale.dtype) * self.scale).to(self.dtype)

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(1)
        return [cls.from_float(torch.randn(16, 8, generator=g)), cls.from_float(torch.randn(5, 3, generator=g))]


@ScaledTensor.implements(aten.mm.default)
def _mm(func, types, args, kwargs):
    a, b = args
    if isinstance(b, ScaledTensor) and not isinstance(a, ScaledTensor):
        # a @ (q * s) == (a * s^T) @ q: scale the activations, never materialize b densely.
        return torch.mm(a * b.scale.t().to(a.dtype), b.qdata.to(a.dtype))
    if isinstance(a, ScaledTensor) and not isinstance(b, ScaledTensor):
        return a.scale.to(b.dtype) * torch.mm(a.qdata.to(b.dtype), b)
    return torch.mm(a.to_plain(), b.to_plain())
