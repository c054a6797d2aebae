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
    inner shape (scale is ``(rows, 1)``), real op handlers (``mm`` without dequantizing the
    whole matrix), and ``fallbacks.to_plain`` for everything else. Results of ops are
    dense: gradients of a quantized tensor arrive dense, so an op that returned a
    ScaledTensor would make the compiled backward expect a wrapped tangent that never comes.
    The one exception is the transpose of a weight that does not require grad: a view with
    the scale per column (``granularity='col'``), so ``F.linear`` (``addmm(b, x, w.t())``
    once decomposed) runs ``x`` against the int8 data in one kernel
    (``aten._weight_int8pack_mm`` for float32 on CPU), in eager and in compiled graphs.

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
    granularity: str = meta(default="row", doc="'row' (scale (rows, 1)) or 'col' (scale (1, cols), a transpose)")

    __fallback__ = fallbacks.to_plain

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        rows, cols = outer_size
        return {"qdata": (rows, cols), "scale": (1, cols) if ctx.granularity == "col" else (rows, 1)}

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


def _rows_of(a: torch.Tensor, b: ScaledTensor) -> torch.Tensor | None:
    """``a @ b`` for a column-scaled ``b`` in one int8 kernel, or None where the kernel does not
    apply. ``_weight_int8pack_mm(x, q, s)`` is ``x @ (q * s[:, None])^T``: ``b``'s ``qdata`` is
    then ``q^T``. Its CPU kernel takes float32 (a bfloat16 or float16 call is not used here: not
    every build has it) with a contiguous ``q`` and scale; a strided scale reads wrong values."""
    q, s = b.qdata.t(), b.scale
    if not (a.dtype == b.dtype == s.dtype == torch.float32 and a.device.type == "cpu" and q.device == a.device
            and s.device == a.device and q.is_contiguous() and s.is_contiguous() and a.dim() == 2):
        return None
    return aten._weight_int8pack_mm(a.contiguous(), q, s.view(-1))


@ScaledTensor.implements(aten.mm.default)
def _mm(func, types, args, kwargs):
    a, b = args
    if isinstance(b, ScaledTensor) and not isinstance(a, ScaledTensor):
        if b.granularity == "col":
            out = _rows_of(a, b)
            # a @ (q * s) == (a @ q) * s for a scale per column
            return out if out is not None else torch.mm(a, b.qdata.to(a.dtype)) * b.scale.to(a.dtype)
        # a @ (q * s) == (a * s^T) @ q: scale the activations, never materialize b densely.
        return torch.mm(a * b.scale.t().to(a.dtype), b.qdata.to(a.dtype))
    if isinstance(a, ScaledTensor) and not isinstance(b, ScaledTensor):
        if a.granularity == "col":
            return torch.mm(a.qdata.to(b.dtype), b * a.scale.t().to(b.dtype))
        return a.scale.to(b.dtype) * torch.mm(a.qdata.to(b.dtype), b)
    return torch.mm(a.to_plain(), b.to_plain())


@ScaledTensor.implements(aten.t.default)
def _t(func, types, args, kwargs):
    # The transpose of a row-scaled matrix is column-scaled: the same int8 data and scale,
    # transposed views. ``F.linear`` is ``addmm(bias, x, w.t())`` by the time it reaches the
    # wrapper, so this keeps a quantized weight quantized into the matmul (see ``_mm``). A
    # weight that requires grad gets the dense transpose (the class's rule for op results).
    (w,) = args
    if w.requires_grad or w.granularity not in ("row", "col"):
        return w.to_plain().t()
    out = ScaledTensor(w.qdata.t(), w.scale.t(), granularity="col" if w.granularity == "row" else "row",  # type: ignore[call-arg]
                       dtype=w.dtype)
    return ScaledTensor.correct_aliasing(func, args, kwargs, out)  # a view: it shares w's storage


@ScaledTensor.implements(aten.as_strided.default)
def _as_strided(func, types, args, kwargs):
    # AOTAutograd regenerates a compiled output that views an input with as_strided of the
    # input: the input's own geometry is the input, the transposed one is its ``t``.
    w, size, stride = args[0], tuple(args[1]), tuple(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if w.dim() == 2 and offset in (None, w.storage_offset()):
        if size == tuple(w.shape) and stride == w.stride():
            return ScaledTensor.correct_aliasing(func, args, kwargs, ScaledTensor(  # type: ignore[call-arg]
                w.qdata.view(w.qdata.shape), w.scale.view(w.scale.shape), granularity=w.granularity, dtype=w.dtype))
        if size == tuple(w.shape)[::-1] and stride == w.stride()[::-1]:
            return _t(aten.t.default, types, (w,), {})
    return func(w.to_plain(), *args[1:], **kwargs)


@ScaledTensor.implements(aten.addmm.default)
def _addmm(func, types, args, kwargs):
    bias, a, b = args
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if isinstance(b, ScaledTensor) and not isinstance(a, ScaledTensor) and not isinstance(bias, ScaledTensor) \
            and beta == 1 and alpha == 1:
        return bias + _mm(aten.mm.default, types, (a, b), {})
    bias, a, b = (x.to_plain() if isinstance(x, ScaledTensor) else x for x in (bias, a, b))
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha)
