"""Handlers every WrapperTensor subclass gets without registering anything.

detach, alias, clone and device/dtype-preserving copies are right for any wrapper: they act
on every inner tensor and keep the outer size, stride and ctx. The math-bit views (``_conj``,
``_neg_view``) are resolved through the class's own ``conj_physical`` / ``neg``: an inner
tensor must never carry a bit its wrapper does not show. View ops are right without
registration only when every inner tensor has the outer shape (decided per class from
``__inner_shapes__``, structurally, so no dynamic dimension is specialized by the check).
"""

from __future__ import annotations

import sympy
import torch

from . import _aliasing, _compat, _instance_state, _pre_dispatch
from ._runtime import kit_handler
from .ctx import CTX_ATTR
from .fallbacks import _first_wrapper, map_inner

__all__ = ["builtin_handler", "is_outer_shaped"]

aten = torch.ops.aten


def is_outer_shaped(t) -> bool:
    """True when ``__inner_shapes__`` gives every present inner tensor the outer shape.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor, ScaledTensor
        >>> is_outer_shaped(TwoTensor(torch.ones(2), torch.ones(2)))
        True
        >>> is_outer_shaped(ScaledTensor.from_float(torch.ones(2, 2)))
        False
    """
    cls = type(t)
    kit = cls.__kit__
    ctx = t.__dict__[CTX_ATTR]
    key = (t.dim(), ctx)
    cache = kit.outer_shaped
    hit = cache.get(key)
    if hit is None:
        if kit.inner_shapes_are_outer():
            hit = True
        else:
            syms = tuple(sympy.Symbol(f"s{i}", positive=True, integer=True) for i in range(t.dim()))
            try:
                shapes = cls.__inner_shapes__(syms, ctx)
                hit = all(
                    tuple(sympy.sympify(e) for e in shapes.get(n, syms)) == syms
                    for n in ctx.present
                )
            except Exception:
                hit = False
        cache[key] = hit
    return hit


def _same_outer(func, args, kwargs, per_inner, device=None):
    """Apply ``per_inner`` to every inner tensor of args[0]; keep outer size/stride/ctx."""
    x = args[0]
    kit = type(x).__kit__
    d = x.__dict__
    inners = tuple(None if d[n] is None else per_inner(d[n]) for n in kit.inner_names)
    out = kit.make(inners, d[CTX_ATTR], x.shape, x.stride(), x.storage_offset(), device=device)
    return _aliasing.correct_aliasing(func, args, kwargs, out)


def _detach(func, types, args, kwargs):
    # detach and alias: the hottest built-ins (autograd detaches on every saved tensor).
    x = args[0]
    kit = type(x).__kit__
    d = x.__dict__
    op = _DETACH if func is aten.detach.default else func._op  # no OpOverload.__call__ frame
    inners = tuple([None if d[n] is None else op(d[n]) for n in kit.inner_names])
    out = kit.make(inners, d[CTX_ATTR], x.shape, x.stride(), x.storage_offset())
    _unsafe_set(out, x)
    if kit.state_order:  # an alias shares its base's declared state
        _instance_state.share(out, x)
    return out


_unsafe_set = _compat.functionalize_unsafe_set
_DETACH = _compat.fast_op(aten.detach.default)


def _clone(func, types, args, kwargs):
    x = args[0]
    if is_outer_shaped(x):
        return map_inner(func, types, args, kwargs)
    return _same_outer(func, args, kwargs, lambda t: func(t, **kwargs))


def _to_copy(func, types, args, kwargs):
    x = args[0]
    dtype = kwargs.get("dtype")
    layout = kwargs.get("layout")
    if (dtype is None or dtype == x.dtype) and (layout is None or layout == torch.strided):
        kw = {k: v for k, v in kwargs.items() if k in ("device", "non_blocking", "memory_format")}
        device = kw.get("device")
        out = _same_outer(func, args, kwargs, lambda t: func(t, **kw), device=torch.device(device) if device is not None else None)
        return out
    return type(x).__fallback__(func, types, args, kwargs)


def _empty_like(func, types, args, kwargs):
    # An empty meta copy keeps the class: torch's precompile pickles every guarded input as
    # torch.empty_like(x, device="meta") and rebuilds it by type(that).__tensor_unflatten__.
    # Meta holds no values, so keeping the structure cannot disagree with the class's own
    # fallback; on a real device the fallback decides (to_plain gives a dense tensor).
    x = args[0]
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "meta" and kwargs.get("dtype") in (None, x.dtype):
        kw = {k: v for k, v in kwargs.items() if k != "dtype"}
        return _same_outer(func, args, kwargs, lambda t: func(t, **kw), device=torch.device("meta"))
    return type(x).__fallback__(func, types, args, kwargs)


def _copy_(func, types, args, kwargs):
    dst, src = args[0], args[1]
    dd, sd = dst.__dict__, src.__dict__
    if type(dst) is type(src) and dd[CTX_ATTR] == sd[CTX_ATTR]:
        for n in type(dst).__kit__.inner_names:
            if dd[n] is not None:
                func(dd[n], sd[n], *args[2:], **kwargs)
        return dst
    owner = type(dst) if isinstance(dst, type(src)) or not hasattr(type(src), "__fallback__") else type(src)
    return owner.__fallback__(func, types, args, kwargs)


def _as_strided(func, types, args, kwargs):
    # AOTAutograd regenerates an output that aliases an input as
    # as_strided(input, its own size, stride, offset); that identity is an alias for any
    # wrapper, whatever its inner shapes.
    x = args[0]
    size = args[1] if len(args) > 1 else kwargs.get("size")
    stride = args[2] if len(args) > 2 else kwargs.get("stride")
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if (
        tuple(size) == tuple(x.shape)
        and tuple(stride) == tuple(x.stride())
        and (offset is None or offset == x.storage_offset())
    ):
        return _alias_of(x)
    return _view(func, types, args, kwargs)


def _alias_of(x):
    return _detach(aten.alias.default, (), (x,), {})


def _math_bit_view(func, types, args, kwargs):
    # conj() and _neg_view() are views that set a math bit (conjugate, negative) on the result;
    # dense kernels resolve the bit when they see it on their argument. A wrapper's outer
    # tensor cannot carry it for its inner tensors: set on an inner tensor, torch's own
    # resolution (resolve_conj, is_conj() checks in autograd formulas and decompositions)
    # asks the wrapper, never sees the bit, and the inner kernel reads the unconjugated
    # values (hfftn gave the unconjugated transform). So the bit is resolved here, by the
    # class's own conj_physical / neg (its handler or fallback), and the result aliases the
    # input as the view's schema says.
    x = args[0]
    op = aten.conj_physical.default if func is aten._conj.default else aten.neg.default
    return _aliasing.correct_aliasing(func, args, kwargs, op(x))


def _view(func, types, args, kwargs):
    x = args[0]
    if hasattr(type(x), "__kit__") and is_outer_shaped(x):
        return map_inner(func, types, args, kwargs)

    return type(_first_wrapper(args, kwargs)).__fallback__(func, types, args, kwargs)


_BUILTINS = {
    aten.detach.default: _detach,
    aten.alias.default: _detach,
    aten.clone.default: _clone,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.empty_like.default: _empty_like,
    aten.as_strided.default: _as_strided,
    aten._conj.default: _math_bit_view,
    aten._neg_view.default: _math_bit_view,
    _pre_dispatch.to_plain_op: _pre_dispatch.to_plain_handler,
}


for _h in (*_BUILTINS.values(), _view):
    kit_handler(_h)


def builtin_handler(cls, func):
    h = _BUILTINS.get(func)
    if h is not None:
        return h
    if isinstance(func, _compat.OpOverload) and func.is_view:
        if cls.__kit__.inner_shapes_are_outer():
            # Every inner tensor has the outer shape by declaration: no per-call check.
            return map_inner
        return _view
    return None
