"""``JaggedTensor``'s ops: torch-function handlers where the meaning is per sequence, aten
handlers for what is the same on the packed rows as on the padded tensor.

Which backward runs decides where an op is handled. An aten handler runs below autograd:
torch's own formula for the op differentiates it, on the padded outer shape. That is right
for pointwise ops (padding never mixes with data) and wrong for a reduction over the
ragged dim (``mean.dim``'s formula divides by ``max_len``). So ``F.linear``, the reductions
over dim 1 and ``softmax`` are torch-function handlers: they ``unwrap()`` the packed rows,
compute on them (autograd records the plain ops, whose backward is the per-sequence one)
and ``wrap()`` the result.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from .. import fallbacks
from ..errors import UnsupportedOpError
from .jagged import JaggedTensor, same_layout

aten = torch.ops.aten
Tensor = torch.Tensor


# ---- operands ------------------------------------------------------------------------------
def _packed_operand(a, x: JaggedTensor):
    """``a`` as an operand of ``x``'s packed rows: a jagged one's rows, a scalar as it is, a
    plain tensor broadcast over the padded shape and read at the meaningful positions."""
    if isinstance(a, JaggedTensor):
        same_layout(x, a, "pointwise op")
        return a.packed
    if isinstance(a, Tensor) and a.dim() > 1:
        seq, pos = x.token_index()
        shape = torch.broadcast_shapes(a.shape, x.shape)
        if tuple(shape) != tuple(x.shape):
            # Not a layout mistake: the result is no jagged tensor of these sequences.
            raise UnsupportedOpError(
                f"JaggedTensor: a plain operand of shape {tuple(a.shape)} would broadcast the jagged "
                f"tensor of shape {tuple(x.shape)} to {tuple(shape)}; only operands that broadcast to "
                "the jagged shape (e.g. (D,) or (B, 1, D)) are supported; pad first (to_padded()) "
                "to broadcast it further."
            )
        return a.expand(x.shape)[seq, pos]
    return a


def _first_jagged(args) -> JaggedTensor:
    return next(a for a in args if isinstance(a, JaggedTensor))


# ---- aten: pointwise ops on the packed rows ---------------------------------------------------
def _pointwise(func, types, args, kwargs):
    x = _first_jagged(args)
    packed_args = [_packed_operand(a, x) for a in args]
    out = func(*packed_args, **kwargs)
    if isinstance(out, tuple):  # frexp and friends: one jagged tensor per result
        return tuple(_like(x, o) for o in out)
    if out is packed_args[0] and isinstance(args[0], JaggedTensor):
        return args[0]  # in place: the wrapper's own rows were written
    return _like(x, out)


def _like(x: JaggedTensor, packed: Tensor) -> JaggedTensor:
    b, n, _ = x.shape
    out = JaggedTensor.from_parts((packed, x.seq_offsets, x.seq_index), size=(b, n, packed.shape[-1]))
    return cast(JaggedTensor, out)  # from_parts is typed on the base class


def _result(x: JaggedTensor, packed: Tensor) -> JaggedTensor:
    """A torch-function handler's jagged result: ``JaggedTensor.wrap`` when there is a graph
    to keep; without one, the trusted ``from_parts`` (the same wrapper, minus the
    constructor's checks, which are most of an eager op's cost at small sizes)."""
    if packed.requires_grad and torch.is_grad_enabled():
        b, n, _ = x.shape
        return JaggedTensor.wrap(packed, x.seq_offsets, x.seq_index, size=(b, n, packed.shape[-1]))
    return _like(x, packed)


def _like_factory(func, types, args, kwargs):
    x = args[0]
    return _like(x, func(x.packed, *args[1:], **kwargs))


def _rule(func):
    if torch.Tag.pointwise in func.tags:
        return _pointwise
    return None


JaggedTensor.__fallback__ = staticmethod(fallbacks.per_op(_rule))
JaggedTensor.implements(aten.zeros_like, aten.ones_like, aten.empty_like, aten.full_like, aten.rand_like,
                        aten.randn_like)(_like_factory)


# ---- torch functions: per-sequence meaning, autograd on the packed rows ------------------------
@JaggedTensor.implements_torch_function(F.linear)
def _linear(func, types, args, kwargs):
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not isinstance(x, JaggedTensor) or isinstance(weight, JaggedTensor) or isinstance(bias, JaggedTensor):
        raise TypeError("JaggedTensor: F.linear takes a JaggedTensor input and plain weight and bias.")
    return _result(x, F.linear(x.rows(), weight, bias))


def _dims(dim, ndim: int = 3) -> tuple:
    if dim is None:
        return ()
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted(d % ndim for d in dims))


def _reduction(func, types, args, kwargs):
    kind = "mean" if func.__name__ == "mean" else "sum"
    x, rest = args[0], args[1:]
    dim = rest[0] if rest else kwargs.get("dim")
    keepdim = rest[1] if len(rest) > 1 else kwargs.get("keepdim", False)
    dtype = kwargs.get("dtype")
    if not isinstance(x, JaggedTensor):
        raise TypeError(f"JaggedTensor: {kind} of a plain tensor reached the jagged handler")
    dims = _dims(dim)
    if dims == (1,):
        out = _segment_sum(x, dtype)
        if kind == "mean":
            out = out / x.lengths().to(out.dtype)[:, None]
        return out.unsqueeze(1) if keepdim else out
    if dims == () and kind == "sum":
        p = x.rows()
        return p.sum(dtype=dtype)
    if dims == (2,):
        # Per token: the result keeps the ragged layout only with keepdim.
        p = x.rows()
        red = p.mean(-1, keepdim=True, dtype=dtype) if kind == "mean" else p.sum(-1, keepdim=True, dtype=dtype)
        out = _result(x, red)
        return out if keepdim else out.to_plain().squeeze(-1)
    # Over the padded shape (e.g. dims (0, 1) or a mean of everything): the dense tensor's.
    return func(x.to_plain(), *rest, **kwargs)


def _segment_sum(x: JaggedTensor, dtype=None) -> Tensor:
    seq = x.sequence_index()
    p = x.rows()
    if dtype is not None:
        p = p.to(dtype)
    # index_add: its backward is a gather of the gradient rows, and inductor compiles it
    # with a dynamic total (no data-dependent size, unlike a loop over the sequences).
    return p.new_zeros(x.shape[0], p.shape[1]).index_add(0, seq, p)


JaggedTensor.implements_torch_function(torch.sum, Tensor.sum, torch.mean, Tensor.mean)(_reduction)


def _softmax(func, types, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    # F.softmax(input, dim, _stacklevel, dtype); torch.softmax and Tensor.softmax(input, dim, dtype).
    at = 3 if func is F.softmax else 2
    dtype = args[at] if len(args) > at else kwargs.get("dtype")
    if not isinstance(x, JaggedTensor) or dim is None:
        raise TypeError("JaggedTensor: softmax needs a JaggedTensor input and dim= (1 for over each sequence).")
    p = x.rows()
    if dtype is not None:
        p = p.to(dtype)
    d = dim % 3
    if d == 2:
        out = torch.softmax(p, -1)
    elif d == 1:
        seq = x.sequence_index()
        index = seq[:, None].expand_as(p)
        # The max only keeps exp() in range: softmax does not depend on it, so no gradient.
        top = p.new_full((x.shape[0], p.shape[1]), float("-inf")).scatter_reduce(
            0, index, p.detach(), "amax", include_self=True)
        e = (p - top[seq]).exp()
        out = e / e.new_zeros(top.shape).index_add(0, seq, e)[seq]
    else:
        return func(x.to_plain(), dim, dtype=dtype)
    return _result(x, out)


JaggedTensor.implements_torch_function(F.softmax, torch.softmax, Tensor.softmax)(_softmax)
