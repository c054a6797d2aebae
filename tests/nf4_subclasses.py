"""A QLoRA-style NF4 weight on the kit, and the mistakes an author makes with it (issue 23).

``NF4``: 4-bit codes packed two per uint8 in a flat inner tensor, one absmax per block of 64
values, the absmaxes double-quantized to int8 with one float factor per 256 of them; an
``F.linear`` torch-function handler (a plain activation times the dequantized weight), and
``t`` / ``view`` / ``as_strided`` handlers that only change the outer size and stride (the
inner tensors are flat, so any view keeps them); ``__fallback__ = fallbacks.to_plain``.
The numel must be a multiple of 64 * 256: the class cannot have arbitrary sizes.

Variants, each with one mistake the checker must name:
``FlatToPlain`` (``to_plain`` returns the flat values), ``CeilShapes`` (``math.ceil`` in
``__inner_shapes__``), ``IfShapes`` (a Python ``if`` on a size), ``ListLinear`` (the
``F.linear`` handler returns a list).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from subclass_kit import WrapperTensor, fallbacks, inner
from symbolic import floor_div

aten = torch.ops.aten

BLOCK, GROUP = 64, 256
NF4_CODES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)


def _quantize(w: torch.Tensor):
    flat = w.detach().float().reshape(-1, BLOCK)
    absmax = flat.abs().amax(dim=1).clamp_min(1e-12)
    groups = absmax.reshape(-1, GROUP)
    factor = groups.abs().amax(dim=1) / 127.0
    scale_q = torch.round(groups / factor[:, None]).clamp(-127, 127).to(torch.int8).reshape(-1)
    deq_absmax = (scale_q.float().reshape(-1, GROUP) * factor[:, None]).reshape(-1, 1)
    codes = (flat / deq_absmax).unsqueeze(-1).sub(torch.tensor(NF4_CODES)).abs().argmin(dim=-1).to(torch.uint8).reshape(-1)
    qdata = (codes[0::2] << 4) | codes[1::2]
    return qdata, scale_q, factor


class NF4(WrapperTensor):
    """NF4 weight: flat packed codes, per-64 absmax (int8, double-quantized per 256)."""

    qdata: torch.Tensor = inner(dtype=torch.uint8)
    scale_q: torch.Tensor = inner(dtype=torch.int8)
    scale_factor: torch.Tensor = inner(dtype=torch.float32)

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = math.prod(outer_size)
        return {"qdata": (floor_div(n, 2),), "scale_q": (floor_div(n, BLOCK),), "scale_factor": (floor_div(n, BLOCK * GROUP),)}

    @classmethod
    def from_float(cls, w: torch.Tensor):
        qdata, scale_q, factor = _quantize(w)
        return cls(qdata, scale_q, factor, size=w.shape, dtype=w.dtype)

    @classmethod
    def from_plain(cls, t: torch.Tensor):
        if t.numel() == 0 or t.numel() % (BLOCK * GROUP) or not t.dtype.is_floating_point:
            raise ValueError(f"{cls.__name__} needs a floating tensor whose numel is a multiple of {BLOCK * GROUP}")
        return cls.from_float(t)

    def _dense_storage(self) -> torch.Tensor:
        codes = torch.stack([self.qdata >> 4, self.qdata & 15], dim=-1).reshape(-1).long()
        absmax = (self.scale_q.float().reshape(-1, GROUP) * self.scale_factor[:, None]).reshape(-1, 1)
        return (torch.tensor(NF4_CODES, device=self.qdata.device)[codes].reshape(-1, BLOCK) * absmax).reshape(-1)

    def to_plain(self) -> torch.Tensor:
        return self._dense_storage().as_strided(self.shape, self.stride()).to(self.dtype)

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(23)
        return [cls.from_float(torch.randn(256, 128, generator=g)), cls.from_float(torch.randn(128, 256, generator=g))]


def _restride(func, args, kwargs, size, stride):
    x = args[0]
    ctx = x.__tensor_flatten__()[1]
    out = type(x).from_parts((x.qdata, x.scale_q, x.scale_factor), ctx, size=tuple(size), stride=tuple(stride), offset=0)
    return WrapperTensor.correct_aliasing(func, args, kwargs, out)


@NF4.implements(aten.t.default)
def _t(func, types, args, kwargs):
    x = args[0]
    return _restride(func, args, kwargs, (x.shape[1], x.shape[0]), (x.stride(1), x.stride(0)))


@NF4.implements(aten.view.default)
def _view(func, types, args, kwargs):
    x, shape = args[0], list(args[1])
    if -1 in shape:
        i = shape.index(-1)
        rest = math.prod(s for j, s in enumerate(shape) if j != i)
        shape[i] = x.numel() // rest
    if not x.is_contiguous():
        raise NotImplementedError("NF4.view of a non-contiguous NF4")
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    return _restride(func, args, kwargs, shape, stride)


@NF4.implements(aten.as_strided.default)
def _as_strided(func, types, args, kwargs):
    x, size, stride = args[0], args[1], args[2]
    return _restride(func, args, kwargs, size, stride)


@NF4.implements_torch_function(F.linear)
def _linear(func, types, args, kwargs):
    act, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return F.linear(act, w.to_plain().to(act.dtype), bias)


class FlatToPlain(NF4):
    """Mistake: ``to_plain`` returns the flat values, not the wrapper's shape."""

    def to_plain(self) -> torch.Tensor:
        return self._dense_storage().to(self.dtype)


class CeilShapes(NF4):
    """Mistake: ``math.ceil`` on a size in ``__inner_shapes__`` (specializes a dynamic dim)."""

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = outer_size[0] * outer_size[1]
        return {"qdata": (math.ceil(n / 2),), "scale_q": (math.ceil(n / BLOCK),), "scale_factor": (math.ceil(n / (BLOCK * GROUP)),)}


class IfShapes(NF4):
    """Mistake: a Python ``if`` on a size in ``__inner_shapes__``."""

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = outer_size[0] * outer_size[1]
        if n > 4096:
            return NF4.__inner_shapes__(outer_size, ctx)
        return {"qdata": (n // 2,), "scale_q": (n // BLOCK,), "scale_factor": (1,)}


class ListLinear(NF4):
    """Mistake: the ``F.linear`` handler returns a one-element list."""


@ListLinear.implements_torch_function(F.linear)
def _list_linear(func, types, args, kwargs):
    return [F.linear(args[0], args[1].to_plain())]
