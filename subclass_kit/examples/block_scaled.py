"""``BlockScaled``: int8 data with one float scale per block of rows."""

from __future__ import annotations

import torch

from symbolic import ceil_div

from .. import fallbacks
from ..base import WrapperTensor
from ..fields import inner, meta

__all__ = ["BlockScaled"]


def _positive(block: int) -> str | None:
    # The type (an int, not a bool) is checked by the annotation; the rule here is the range.
    return None if block > 0 else "a positive int (rows per scale)"


class BlockScaled(WrapperTensor):
    """int8 data with one float scale per block of ``block`` rows.

    Exercises: an inner shape derived by arithmetic that is not an identity
    (``ceil(rows / block)``), a meta field that changes that shape and is guarded, and the
    to_plain fallback.

    Example:
        >>> import torch
        >>> x = BlockScaled.from_float(torch.randn(70, 4), block=32)
        >>> tuple(x.scale.shape), x.block
        ((3, 1), 32)
    """

    qdata: torch.Tensor = inner(dtype=torch.int8)
    scale: torch.Tensor = inner(dtype=(torch.float32, torch.bfloat16, torch.float16))
    block: int = meta(default=32, doc="rows per scale", check=_positive)

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"qdata": (rows, cols), "scale": (ceil_div(rows, ctx.block), 1)}

    @classmethod
    def from_float(cls, x: torch.Tensor, block: int = 32) -> "BlockScaled":
        """Quantize a 2-D float tensor with one symmetric scale per block of rows."""
        rows, cols = x.shape
        nb = ceil_div(rows, block)
        padded = torch.nn.functional.pad(x, (0, 0, 0, nb * block - rows))
        amax = padded.reshape(nb, block * cols).abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
        scale = (amax / 127.0).to(torch.float32)
        q = torch.round(x / scale.repeat_interleave(block, dim=0)[:rows]).clamp(-127, 127)
        return cls(q.to(torch.int8), scale, block=block, dtype=x.dtype)  # type: ignore[call-arg]  # outer keywords: dataclass_transform shows only the fields

    @classmethod
    def from_plain(cls, t: torch.Tensor) -> "BlockScaled":
        """Quantize ``t`` (the hook the checker's OpInfo sweep builds instances with); 2-D
        floating tensors only, anything else is a ValueError."""
        if t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"BlockScaled holds 2-D floating tensors; got {t.dim()}-D {t.dtype}")
        return cls.from_float(t)

    def to_plain(self) -> torch.Tensor:
        """Dequantized dense tensor in the outer dtype."""
        rows = self.qdata.shape[0]
        s = self.scale.repeat_interleave(self.block, dim=0)[:rows]
        return (self.qdata.to(s.dtype) * s).to(self.dtype)

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(2)
        dense = torch.randn(64, 8, generator=g)
        # The first two differ only in `block`: the same shape with another ctx.
        return [
            cls.from_float(dense),
            cls.from_float(dense, block=16),
            cls.from_float(torch.randn(70, 8, generator=g), block=16),
        ]
