"""``as_strided`` on a ShardedTensor: the global size, stride and storage offset, as on a
dense tensor, replayed as the views it amounts to.

AOTAutograd calls ``as_strided`` to regenerate a compiled output that is a view of an input.
The geometry is read back as the slices, selects, permute and unsqueezes of the input that
give it (``_as_view_ops``), as a diagonal (``_as_diagonal``), or as a flatten or unflatten of
a compact block (``_compact_block``); each is then run through the view rules, so the result
keeps the placements the traced view had. Any other geometry is strided out of the whole
tensor (``_as_strided_whole``): a copy, Replicate, marked as a gathered view.
"""

from __future__ import annotations

import math

import torch

from .._layout import contiguous_strides
from ..placements import Replicate
from ..tensor import ShardedTensor, spec
from ._common import TensorMeta, aten, move, wrap_out

__all__ = ["as_strided"]


def _as_view_ops(shape, xstride, xoff, size, stride, off):
    """Express ``as_strided(x, size, stride, off)`` as slices, selects, a permute and
    unsqueezes of ``x`` (ints only), or None when it is not such a view."""
    nd = len(shape)
    if not all(type(v) is int for v in (*shape, *xstride, xoff, *size, *stride, off)):
        return None
    delta = off - xoff
    start = [0] * nd
    for d in sorted((d for d in range(nd) if shape[d] > 1), key=lambda d: -xstride[d]):
        if xstride[d] <= 0:
            return None
        q = min(delta // xstride[d], shape[d] - 1)
        start[d] = q
        delta -= q * xstride[d]
    if delta != 0:
        return None
    src: list = []
    used: set = set()
    for s_, t in zip(size, stride):
        hit = None
        if s_ != 1:
            for d in range(nd):
                if d in used or shape[d] == 1 or t <= 0 or t % xstride[d]:
                    continue
                step = t // xstride[d]
                if start[d] + (s_ - 1) * step < shape[d]:
                    hit = (d, step)
                    break
            if hit is None:
                return None
            used.add(hit[0])
        src.append(hit)
    for j, s_ in enumerate(size):
        if src[j] is None:
            d = next((d for d in range(nd) if d not in used and shape[d] == 1), None)
            if d is not None:
                used.add(d)
                src[j] = (d, 1)
    ops = []
    for j, hit in enumerate(src):
        if hit is not None:
            d, step = hit
            end = start[d] + (size[j] - 1) * step + 1
            if (start[d], end, step) != (0, shape[d], 1):
                ops.append(("slice", d, start[d], end, step))
    dropped = sorted((d for d in range(nd) if d not in used), reverse=True)
    for d in dropped:
        ops.append(("select", d, start[d]))
    kept = sorted(used)
    order = [kept.index(hit[0]) for hit in src if hit is not None]
    if order != sorted(order):
        ops.append(("permute", order))
    for j, hit in enumerate(src):
        if hit is None:
            ops.append(("unsqueeze", j))
    return ops


def _as_diagonal(shape, xstride, xoff, size, stride, off):
    """``(offset, dim1, dim2)`` when ``as_strided(x, size, stride, off)`` is a diagonal of
    ``x`` (ints only), else None."""
    if not all(type(v) is int for v in (*shape, *xstride, xoff, *size, *stride, off)):
        return None

    base = torch.empty_strided(shape, xstride, device="meta")
    nd = len(shape)
    for d1 in range(nd):
        for d2 in range(nd):
            if d1 == d2:
                continue
            delta = off - xoff  # a diagonal at offset o >= 0 starts at [0, o], o < 0 at [-o, 0]
            cands = {delta // xstride[d2] if xstride[d2] and delta % xstride[d2] == 0 else 0,
                     -(delta // xstride[d1]) if xstride[d1] and delta % xstride[d1] == 0 else 0}
            for o in cands:
                if not -shape[d1] < o < shape[d2]:
                    continue
                v = base.diagonal(o, d1, d2)
                if tuple(v.shape) == size and tuple(v.stride()) == stride and xoff + v.storage_offset() == off:
                    return o, d1, d2
    return None


@ShardedTensor.implements(aten.as_strided.default)
def as_strided(func, types, args, kwargs):
    """``as_strided`` on the global tensor, as on a dense one: the global size, stride and
    storage offset. AOTAutograd calls it to regenerate a compiled output that is a view of
    an input, with the output's outer geometry (the flattened ctx carries the outer offset,
    see ShardedTensor.__tensor_flatten__). Replayed as the slices, selects, permute and
    unsqueezes it amounts to, so the result has the placements the traced view had (a
    diagonal as a diagonal, a compact block of a compact tensor as its slice and a view);
    any other geometry is strided out of the whole tensor (a marked copy, Replicate)."""
    x, size, stride = args[0], tuple(args[1]), tuple(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    offset = x.storage_offset() if offset is None else offset
    if size == tuple(x.shape) and stride == tuple(x.stride()) and offset == x.storage_offset():
        return aten.alias.default(x)
    ops = _as_view_ops(tuple(x.shape), tuple(x.stride()), x.storage_offset(), size, stride, offset)
    if ops is None:
        diag = _as_diagonal(tuple(x.shape), tuple(x.stride()), x.storage_offset(), size, stride, offset)
        if diag is not None:
            return aten.diagonal.default(x, *diag)
    out = _apply_view_ops(x, ops or ())
    if ops is None or (tuple(out.shape), tuple(out.stride()), out.storage_offset()) != (size, stride, offset):
        block = _compact_block(x, size, stride, offset)
        if block is not None:
            # A flatten or an unflatten of a compact block of a compact tensor (how
            # AOTAutograd regenerates a view(-1) output, or x[1:3].view(2, -1)): the block's
            # selects and slice, then the view rule, which keeps the shards it can.
            return aten.view.default(_apply_view_ops(x, block), list(size))
        return _as_strided_whole(func, args, kwargs, x, size, stride, offset)
    return out


def _apply_view_ops(x, ops):
    out = x
    for op in ops:
        if op[0] == "slice":
            out = aten.slice.Tensor(out, *op[1:])
        elif op[0] == "select":
            out = aten.select.int(out, *op[1:])
        elif op[0] == "permute":
            out = aten.permute.default(out, op[1])
        else:
            out = aten.unsqueeze.default(out, op[1])
    return out


def _compact_block(x, size, stride, offset):
    """The selects and slice that cut the elements ``as_strided(x, size, stride, offset)``
    covers out of ``x`` when both are compact (contiguous) and those elements are one block
    ``x[i, j, ..., a:b]`` (so the as_strided is that block viewed as ``size``); else None.

    Example:
        >>> import torch
        >>> x = torch.empty(4, 6, 8, device="meta")
        >>> _compact_block(x, (2, 48), (48, 1), 48), _compact_block(x, (16,), (1,), 56)
        ([('slice', 0, 1, 3, 1)], [('select', 0, 1), ('slice', 0, 1, 3, 1)])
        >>> _compact_block(x, (4, 6, 8), (48, 8, 1), 0), _compact_block(x, (12,), (1,), 60)
        ([], None)
    """
    shape, n = tuple(x.shape), math.prod(size)
    if not all(type(v) is int for v in (*shape, *size, *stride, offset, x.storage_offset())):
        return None
    pos = offset - x.storage_offset()
    if tuple(x.stride()) != contiguous_strides(shape) or tuple(stride) != contiguous_strides(size) or not n or pos < 0:
        return None
    for d in range(len(shape)):
        inner = math.prod(shape[d + 1:])
        if pos % inner or n % inner:
            continue
        lead, first = divmod(pos // inner, shape[d])
        count = n // inner
        if first + count > shape[d]:
            continue
        idx = []
        for e in reversed(range(d)):  # the block's index in the dims before d
            lead, i = divmod(lead, shape[e])
            idx.insert(0, i)
        if lead:
            return None
        # Each select drops the dim in front, so all of them, and the slice, are on dim 0.
        ops: list = [("select", 0, i) for i in idx]
        if (first, count) != (0, shape[d]):
            ops.append(("slice", 0, first, first + count, 1))
        return ops
    return None


def _as_strided_whole(func, args, kwargs, x, size, stride, offset):
    """Any other as_strided: the whole tensor laid out in a buffer with its global strides
    and offset (the dense storage it views, as far as it covers it), strided from there. A
    copy, marked as a gathered view (a write into it would not reach ``x``)."""
    from .generic import _WHOLE_CALLS, _note

    mesh, pl, coord = spec(x)
    rep = (Replicate(),) * mesh.ndim
    loc = x.local
    if pl == rep and x._gathered_view is None and loc.stride() == x.stride() and loc.storage_offset() == x.storage_offset():
        # The local is laid out as the global tensor: the same as_strided is a true view of it.
        out = wrap_out(loc.as_strided(size, stride, offset), TensorMeta(size, stride, x.dtype, offset), mesh, rep, coord)
        return ShardedTensor.correct_aliasing(func, args, kwargs, out)
    _note(func, _WHOLE_CALLS)
    whole = move(x, rep)
    need = max(
        x.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) if x.numel() else 0,
        offset + 1 + sum((n - 1) * st for n, st in zip(size, stride)) if all(n for n in size) else 0,
    )
    buf = whole.new_zeros(need)
    buf.as_strided(tuple(x.shape), tuple(x.stride()), x.storage_offset()).copy_(whole)
    local = buf.as_strided(size, stride, offset)
    res = wrap_out(local, TensorMeta(size, stride, x.dtype, offset), mesh, rep, coord)
    res._gathered_view = x._gathered_view or func
    return ShardedTensor.correct_aliasing(func, args, kwargs, res)
