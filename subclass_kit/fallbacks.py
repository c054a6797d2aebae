"""Ready-made fallbacks for ops a class has no handler for.

Install one in a class body: ``__fallback__ = fallbacks.map_inner``. A fallback is a plain
function ``(func, types, args, kwargs)`` like any handler. ``per_op(resolve)`` makes a
fallback that picks a handler once per (class, op) and lets the dispatcher cache it.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from . import _aliasing, _callsite, _compat
from ._runtime import kit_handler
from .errors import PlainMaskWarning, ToPlainError, UnsupportedOpError
from ._opname import op_name

__all__ = ["map_inner", "to_plain", "raise_unsupported", "per_op"]

Handler = Callable[..., object]


def _is_wrapper(x) -> bool:
    # The runtime object every WrapperTensor class has, instead of isinstance: this module
    # sits below base.py (which imports it), so it cannot import WrapperTensor.
    return hasattr(type(x), "__kit__")


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


@kit_handler
def map_inner(func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on every inner tensor (TwoTensor style) and wrap the results.

    The outer size of each result is the primary inner result's; meta values carry over.
    Right for classes whose inner tensors all have the outer shape and meaning. An op that
    writes a plain tensor (``dense.add_(w)``) writes it once, from the primary inner.

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
    tmpl = args[0] if args and hasattr(type(args[0]), "__kit__") else _first_wrapper(args, kwargs)
    cls = type(tmpl)
    d = tmpl.__dict__
    names = cls.__kit__.inner_names
    n_args = len(args)
    plan = _PLANS.get(func) or _aliasing.plan(func)
    if plan.write_args is not None and not _writes_wrappers(plan, args, kwargs):
        # The op writes a plain tensor (``dense.mul_(w)``, ``addmm_``, ``mm(out=dense)``): run
        # per inner it would write that one tensor once per inner (an accumulation compounds).
        # A plain tensor holds one value, and every inner has the outer meaning: the primary's.
        n = next(n for n in names if d[n] is not None)
        func(*_swap(args, cls, n), **_swap_kw(kwargs, cls, n))
        return _aliasing.correct_aliasing(func, args, kwargs, None, plan)
    if kwargs or not n_args or args[0] is not tmpl:
        results = [
            None if d[n] is None else func(*_swap(args, cls, n), **_swap_kw(kwargs, cls, n)) for n in names
        ]
    else:
        # The wrapper first and no keywords (neg, view, add, mul, ...): the op's C++ callable
        # (no OpOverload.__call__ frame) on each inner, the other arguments swapped inline.
        op = _FAST_OPS.get(func) or _fast(func)
        if n_args == 1:
            results = [None if d[n] is None else op(d[n]) for n in names]
        elif n_args == 2 and (type(args[1]) not in _SEQ or (args[1] and type(args[1][0]) is int)):
            # (a size list holds no tensor: view(x, [-1]), permute, expand, sum's dims ...)
            a1 = args[1]
            d1 = a1.__dict__ if type(a1) is cls else None
            results = [None if d[n] is None else op(d[n], a1 if d1 is None else d1[n]) for n in names]
        else:
            results = [None if d[n] is None else op(*_swap(args, cls, n)) for n in names]
    if plan is _FUNCTIONAL:
        return _aliasing.wrap_like(tmpl, results)
    if plan.write_args is not None:
        return _aliasing.correct_aliasing(func, args, kwargs, None, plan)
    return _aliasing.wrap_aliased(tmpl, func, args, kwargs, results, plan)


_PLANS = _aliasing.PLANS


def _map_inner_for(func) -> Handler:
    """map_inner's handler for ``func`` (read by the dispatcher once per (class, op)):
    map_inner itself, or a refusal for a conversion to a layout a wrapper cannot hold."""
    layout = _compat.non_strided_result(func)
    if layout is None:
        return map_inner

    @kit_handler
    def refuse(func, types, args, kwargs):
        owner = next((t for t in types if isinstance(t, type) and hasattr(t, "__kit__")), None)
        name = owner.__qualname__ if owner is not None else "this WrapperTensor subclass"
        op = op_name(func)
        method = func.overloadpacket.__name__.lstrip("_")
        raise UnsupportedOpError(
            f"{name} cannot run {op} through fallbacks.map_inner: the result would wrap {layout} "
            f"inner tensors in a strided {name} (a wrapper keeps sizes and strides; a {layout} "
            f"tensor has no strides). Convert a plain tensor instead (x.to_plain().{method}() where "
            f"{name} defines to_plain), or register a handler with @{name}.implements({op})."
        )

    return refuse


map_inner.resolve_op = _map_inner_for  # type: ignore[attr-defined]  # read by the dispatcher (_dispatch.resolve)


def _writes_wrappers(plan, args, kwargs) -> bool:
    """True when every argument the op writes is a kit wrapper (each inner writes its own)."""
    n_args = len(args)
    for pos, name in plan.write_args:
        t = args[pos] if pos < n_args else kwargs.get(name)
        if t is not None and not hasattr(type(t), "__kit__"):
            return False
    return True
_FUNCTIONAL = _aliasing.FUNCTIONAL
_FAST_OPS: dict = {}


def _fast(func):
    # _compat.fast_op, cached: a Tensor method for a few views (their first argument is the
    # tensor), else the op's C++ callable. Both equal ``func`` on plain tensors.
    op = _FAST_OPS.get(func)
    if op is None:
        op = _FAST_OPS[func] = _compat.fast_op(func)
    return op


_raw = _compat.raw_op


def _plain(x, func):
    if _is_wrapper(x):
        if not hasattr(x, "to_plain"):
            raise UnsupportedOpError(
                f"{type(x).__qualname__} uses fallbacks.to_plain for {func} but defines no "
                "to_plain() method; add `def to_plain(self): ...` returning the dense tensor."
            )
        if getattr(type(x), "__plain_mask__", None) is not None:
            _warn_mixes_padding(type(x), func)
        d = x.to_plain()
        if d.dtype != x.dtype or d.dim() != x.dim() or d.device != x.device or (
            not any(_compat.is_symbolic(s) for s in d.shape) and tuple(d.shape) != tuple(x.shape)
        ):
            raise ToPlainError(
                f"{type(x).__qualname__}.to_plain() returned a {tuple(d.shape)} {d.dtype} tensor on {d.device} "
                f"for a {tuple(x.shape)} {x.dtype} {type(x).__qualname__} on {x.device}, so fallbacks.to_plain "
                f"would compute {op_name(func)} on the wrong values. Return the dense tensor in the wrapper's "
                "shape, dtype and device (e.g. values.reshape(self.shape).to(self.dtype))."
            )
        return d
    if type(x) in (list, tuple):
        return type(x)(_plain(y, func) for y in x)
    return x


# A class that declares ``__plain_mask__`` says some positions of to_plain() mean nothing
# (padding). A pointwise op keeps every position to itself, so its meaningful positions are
# right; any other op (a mean, a softmax, a matmul over the padded dim) may mix the padding
# into them, silently. Warned once per (class, op).
_MASK_WARNED: set = set()
_POINTWISE = torch.Tag.pointwise


def _warn_mixes_padding(cls, func) -> None:
    if (cls, func) in _MASK_WARNED or _POINTWISE in getattr(func, "tags", ()):
        return
    _MASK_WARNED.add((cls, func))
    op = op_name(func)
    warnings.warn(
        f"{cls.__qualname__} computes {op} through fallbacks.to_plain, on to_plain() including "
        f"the positions its __plain_mask__ marks as don't-care (padding): {op} is not pointwise, "
        "so the padding can enter the meaningful results (a mean divides by the padded length). "
        f"Register a handler for it (@{cls.__qualname__}.implements({op}), or "
        f"implements_torch_function for the torch function you call) that computes on the "
        "meaningful positions only.",
        PlainMaskWarning,
        stacklevel=3,
    )


@kit_handler
def to_plain(func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
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
    for idx, name in _aliasing.written_args(func):
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


@kit_handler
def raise_unsupported(func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
    """The default ``__fallback__``: raise UnsupportedOpError naming the class and the op."""
    # Any class built on WrapperTensor carries __kit__ (no import of base: it sits above).
    owner = next((t for t in types if isinstance(t, type) and hasattr(t, "__kit__")), None)
    name = owner.__qualname__ if owner is not None else "this WrapperTensor subclass"
    op = op_name(func)
    sig = ", ".join(_describe(a) for a in args)
    if kwargs:
        sig += (", " if sig else "") + ", ".join(f"{k}={_describe(v)}" for k, v in kwargs.items())
    caller = _callsite.torch_caller(getattr(getattr(func, "overloadpacket", func), "__name__", ""))
    if caller is not None:
        fn, where = caller
        raise UnsupportedOpError(
            f"{name} has no handler for {op} (args: {sig}), which torch reached by decomposing "
            f"{fn} (called at {where}): a tensor subclass without a handler for the function "
            f"gets the aten ops it is made of. Register the function itself with "
            f"@{name}.implements_torch_function({fn}) (compute on the inner tensors and return "
            f"{name}.wrap(...) to keep autograd), or a handler for {op} with "
            f"@{name}.implements({op})"
            + _to_plain_hint(owner, ", or set __fallback__ = fallbacks.to_plain (compute on the dense tensor)")
        )
    raise UnsupportedOpError(
        f"{name} has no handler for {op} (args: {sig}). Register one with "
        f"@{name}.implements({op}), or set __fallback__ = fallbacks.to_plain "
        f"(compute on the dense tensor) or fallbacks.map_inner (run the op on every inner "
        f"tensor) in the class body" + _to_plain_hint(owner, "")
    )


def _to_plain_hint(owner, text: str) -> str:
    if owner is not None and getattr(owner, "__plain_mask__", None) is not None:
        return (
            f". Note: {owner.__qualname__} declares __plain_mask__, so to_plain() has don't-care "
            "positions, and fallbacks.to_plain computes on them as on any others (a mean over "
            "padding is wrong): prefer a handler."
        )
    return text + "."


def per_op(resolve: Callable[[object], Optional[Handler]]) -> Handler:
    """A fallback that picks a handler per op: ``__fallback__ = fallbacks.per_op(rule_for)``.

    ``resolve(func)`` returns the handler for ``func`` or None (then the op raises
    ``UnsupportedOpError``). The dispatcher calls it once per (class, op) and caches its
    answer with the class's other handlers, so the next call of the op goes straight to the
    handler; called directly, the fallback resolves and runs it. Unlike ``__op_handler__``
    (consulted before the built-in handlers), it is consulted last, where a fallback is.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, fallbacks
        >>> def rule_for(func):  # pointwise ops run on the payload; everything else raises
        ...     if torch.Tag.pointwise in func.tags:
        ...         return lambda func, types, args, kwargs: func(*[a.payload if isinstance(a, Box) else a for a in args])
        ...     return None
        >>> class Box(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        ...     __fallback__ = fallbacks.per_op(rule_for)
        >>> torch.sin(Box(torch.zeros(2)))
        tensor([0., 0.])
    """

    def fallback(func, types, args, kwargs):
        h = resolve(func)
        return (raise_unsupported if h is None else h)(func, types, args, kwargs)

    fallback.resolve_op = resolve  # type: ignore[attr-defined]  # read by the dispatcher (_dispatch.resolve)
    fallback.__name__ = f"per_op({getattr(resolve, '__name__', 'resolve')})"
    fallback.__qualname__ = fallback.__name__
    return fallback
