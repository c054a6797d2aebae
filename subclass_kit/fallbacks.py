"""Ready-made fallbacks for ops a class has no handler for.

Install one in a class body: ``__fallback__ = fallbacks.map_inner``. A fallback is a plain
function ``(func, types, args, kwargs)`` like any handler.
"""

from __future__ import annotations

import torch

from . import _compat, _aliasing as aliasing, _instance_state as instance_state
from ._construct import from_parts
from .errors import UnsupportedOpError
from ._opname import op_name

__all__ = ["map_inner", "to_plain", "raise_unsupported"]


def _is_wrapper(x) -> bool:
    # The class attribute every WrapperTensor has, instead of isinstance: this module sits
    # below base.py (which imports it), so it cannot import WrapperTensor.
    return getattr(type(x), "_kit_is_wrapper", False)


def _first_wrapper(args, kwargs):
    for a in args:
        if _is_wrapper(a):
            return a
        if type(a) in (list, tuple):
            for b in a:
                if _is_wrapper(b):
                    return b
    for a in kwargs.values():
        if _is_wrapper(a):
            return a
    return None


_SEQ = (list, tuple)


def _swap(seq, cls, name):
    return [
        a.__dict__[name] if type(a) is cls else (type(a)(_swap(a, cls, name)) if type(a) in _SEQ else a)
        for a in seq
    ]


def _swap_kw(kwargs, cls, name):
    if not kwargs:
        return kwargs
    return {k: (v.__dict__[name] if type(v) is cls else v) for k, v in kwargs.items()}


def wrap_like(tmpl, results, state=None):
    """Wrap per-inner results (declaration order) into ``type(tmpl)`` instances.

    ``state``: declared state values the new instances share (a view's, from its base)."""
    r0 = results[0]
    if isinstance(r0, torch.Tensor):
        cls = type(tmpl)
        ctx = tmpl._kit_ctx
        d = tmpl.__dict__
        dtype = ctx.dtype
        # An outer dtype that tracks the primary's (TwoTensor) follows it through the op
        # (eq gives bool); one that differs (int8 data, float outer) is the class's own.
        if dtype is d[cls._kit_inner_names[0]].dtype and r0.dtype is not dtype:
            dtype = r0.dtype
            ctx = ctx.replace(dtype=dtype)
        out = from_parts(
            cls, tuple(results), ctx, r0.shape, r0.stride(), r0.storage_offset(), dtype, r0.device
        )
        if state:
            out.__dict__.update(state)  # from instance_state.of: declared names only
        return out
    if isinstance(r0, (list, tuple)):
        return type(r0)(wrap_like(tmpl, list(parts), state) for parts in zip(*results))
    return r0


def _wrap_aliased(tmpl, func, args, kwargs, results, plan):
    # A view shares its base's declared state (e.g. a pending wait) and its storage.
    state = instance_state.of(tmpl) if plan.view_pairs else None
    out = wrap_like(tmpl, results, state)
    if plan.view_pairs == ((0, 0),) and plan.write_args is None and not plan.inplace_view \
            and args and args[0] is tmpl and type(out) is type(tmpl):
        # The common view (view, t, detach, slice ...): the result aliases its input directly.
        _compat.functionalize_unsafe_set(out, tmpl)
        return out
    return aliasing.correct_aliasing(func, args, kwargs, out, plan)


def rewrap(tmpl, func, args, kwargs, *results):
    """``x.rewrap(func, args, kwargs, *results)``: wrap per-inner results like ``x``, aliased per the schema.

    ``results`` holds one result per inner tensor of ``x`` (declaration order; a tensor, or a
    list/tuple of them for ops like ``split``). Each becomes an instance of ``type(x)`` with
    ``x``'s meta values (the outer dtype follows the result when it tracks the primary's) and
    the primary result's size and stride. When ``func`` is a view the results share ``x``'s
    wrapper-level storage and its declared state; an in-place op returns the argument it
    wrote. The view hook for handlers of view ops (``WrapperTensor.rewrap``).

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> x = TwoTensor(torch.ones(2, 3), torch.zeros(2, 3))
        >>> t = torch.ops.aten.t.default
        >>> y = x.rewrap(t, (x,), {}, x.a.t(), x.b.t())
        >>> tuple(y.shape), y.untyped_storage()._cdata == x.untyped_storage()._cdata
        ((3, 2), True)
    """
    r0 = results[0]
    if id(func) in _SIMPLE_VIEWS and type(r0) is _Tensor and len(results) == 1 and args[0] is tmpl:
        # The common view of a one-inner wrapper, inline (it runs on every view op): the
        # result keeps the ctx (a view keeps the dtype), shares the state and the storage.
        cls = type(tmpl)
        dtype = r0.dtype
        if dtype is tmpl.dtype:  # the outer dtype, the ctx's
            out = from_parts(cls, results, tmpl._kit_ctx, r0.shape, r0.stride(), r0.storage_offset(), dtype, r0.device)
            order = cls._kit_state_order
            if order:  # instance_state.share, inline
                d, od = tmpl.__dict__, out.__dict__
                for n in order:
                    if n in d:
                        od[n] = d[n]
            _unsafe_set(out, tmpl)
            return out
    plan = aliasing.plan(func)
    if plan is aliasing.FUNCTIONAL:
        return wrap_like(tmpl, results)
    return _wrap_aliased(tmpl, func, args, kwargs, results, plan)


_SIMPLE_VIEWS = aliasing.SIMPLE_VIEW_IDS
_Tensor = torch.Tensor
_unsafe_set = _compat.functionalize_unsafe_set


def map_inner(func, types, args, kwargs):
    """Run ``func`` on every inner tensor (TwoTensor style) and wrap the results.

    The outer size of each result is the primary inner result's; meta values carry over.
    Right for classes whose inner tensors all have the outer shape and meaning.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, fallbacks
        >>> class Pair(WrapperTensor):
        ...     a: torch.Tensor = inner()
        ...     b: torch.Tensor = inner()
        ...     __fallback__ = fallbacks.map_inner
        >>> p = Pair(torch.ones(2), torch.zeros(2)) * 3
        >>> p.a.tolist(), p.b.tolist()
        ([3.0, 3.0], [0.0, 0.0])
    """
    tmpl = args[0] if args and _is_wrapper(args[0]) else _first_wrapper(args, kwargs)
    cls = type(tmpl)
    d = tmpl.__dict__
    results = [
        None if d[name] is None else func(*_swap(args, cls, name), **_swap_kw(kwargs, cls, name))
        for name in cls._kit_inner_names
    ]
    plan = aliasing.plan(func)
    if plan is aliasing.FUNCTIONAL:
        return wrap_like(tmpl, results)
    if plan.write_args is not None:
        return aliasing.correct_aliasing(func, args, kwargs, None, plan)
    return _wrap_aliased(tmpl, func, args, kwargs, results, plan)


def _plain(x, func):
    if _is_wrapper(x):
        if not hasattr(x, "to_plain"):
            raise UnsupportedOpError(
                f"{type(x).__qualname__} uses fallbacks.to_plain for {func} but defines no "
                "to_plain() method; add `def to_plain(self): ...` returning the dense tensor."
            )
        return x.to_plain()
    if type(x) in (list, tuple):
        return type(x)(_plain(y, func) for y in x)
    return x


def to_plain(func, types, args, kwargs):
    """Compute ``func`` on ``to_plain()`` of every wrapped argument; return plain tensors.

    In-place ops on a wrapped argument are refused (the update would be lost on the dense
    copy), and view ops return a copy, not a view.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import ScaledTensor
        >>> x = ScaledTensor.from_float(torch.tensor([[1.0, -2.0]]))
        >>> type(torch.neg(x)).__name__
        'Tensor'
    """
    for idx, name in aliasing.written_args(func):
        target = args[idx] if idx < len(args) else kwargs.get(name)
        if _is_wrapper(target):
            raise UnsupportedOpError(
                f"{type(target).__qualname__} cannot run the in-place op {func} through "
                "fallbacks.to_plain: the result would be written to a dense copy and lost. "
                f"Register a handler with @{type(target).__qualname__}.implements({func})."
            )
    return func(*_plain(args, func), **{k: _plain(v, func) for k, v in kwargs.items()})


def _describe(a) -> str:
    if isinstance(a, torch.Tensor):
        return type(a).__name__
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_describe(x) for x in a[:4]) + (", ..." if len(a) > 4 else "")
        return f"[{inner}]"
    return type(a).__name__


def raise_unsupported(func, types, args, kwargs):
    """The default ``__fallback__``: raise UnsupportedOpError naming the class and the op."""
    # Any class built on WrapperTensor carries __kit_spec__ (no import of base: it sits above).
    owner = next((t for t in types if isinstance(t, type) and hasattr(t, "__kit_spec__")), None)
    name = owner.__qualname__ if owner is not None else "this WrapperTensor subclass"
    op = op_name(func)
    sig = ", ".join(_describe(a) for a in args)
    if kwargs:
        sig += (", " if sig else "") + ", ".join(f"{k}={_describe(v)}" for k, v in kwargs.items())
    raise UnsupportedOpError(
        f"{name} has no handler for {op} (args: {sig}). Register one with "
        f"@{name}.implements({op}), or set __fallback__ = fallbacks.to_plain "
        f"(compute on the dense tensor) or fallbacks.map_inner (run the op on every inner "
        f"tensor) in the class body."
    )
