"""Per-class op tables: ``Cls.implements(*ops)``, ``Cls.implements_torch_function(*fns)``,
and the ``__torch_dispatch__`` that consults them.

Lookup order for an aten overload, resolved once per (class, overload) and cached:
the class's own table, then each parent's (overload before its packet at every level),
then ``Cls.__op_handler__(func)``, then the kit's built-in handlers (detach, alias, clone, copies,
conj/neg-bit views, outer-shaped views), then
``Cls.__fallback__``. A registration anywhere clears every cache, so tables may be
extended after classes (and their subclasses) exist.
"""

from __future__ import annotations

import logging
import weakref
from typing import Callable

import torch

from . import _compat, _specialize, _wrap
from ._defaults import builtin_handler
from .errors import HandlerResultError
from ._opname import op_name
from ._runtime import is_kit_handler
from .fallbacks import raise_unsupported

__all__ = ["registered_ops", "find_registered", "register_ops", "register_torch_functions", "resolve", "checked_handler", "torch_function"]

# The logger keeps its documented name (docs/architecture.md) though the module is internal.
_log = logging.getLogger("subclass_kit.dispatch")
_ALL_CLASSES: "weakref.WeakSet[type]" = weakref.WeakSet()


def registered_ops(cls) -> dict:
    """Every aten op with a handler on ``cls`` (its own and inherited), child entries first.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import ScaledTensor
        >>> torch.ops.aten.mm.default in registered_ops(ScaledTensor)
        True
    """
    out: dict = {}
    for klass in cls.__mro__:
        kit = klass.__dict__.get("__kit__")
        if kit is not None:
            for op, h in kit.own_ops.items():
                out.setdefault(op, h)
    return out


def init_class(cls) -> None:
    _ALL_CLASSES.add(cls)


def _clear_caches() -> None:
    for c in list(_ALL_CLASSES):
        c.__dict__["__kit__"].cache.clear()


def register_ops(cls, ops) -> Callable:
    if not ops:
        raise TypeError(f"{cls.__qualname__}.implements() needs at least one op, e.g. implements(aten.mm.default)")
    for op in ops:
        if not isinstance(op, (_compat.OpOverload, _compat.OpOverloadPacket)):
            raise TypeError(
                f"{cls.__qualname__}.implements() takes aten OpOverloads or OpOverloadPackets "
                f"(e.g. torch.ops.aten.mm.default); got {op!r}. For torch-level functions such "
                f"as torch.nn.functional.linear use {cls.__qualname__}.implements_torch_function."
            )

    def decorator(fn):
        own = cls.__dict__["__kit__"].own_ops
        for op in ops:
            own[op] = fn
        _clear_caches()
        return fn

    return decorator


def register_torch_functions(cls, fns) -> Callable:
    if not fns:
        raise TypeError(f"{cls.__qualname__}.implements_torch_function() needs at least one function")
    for f in fns:
        if isinstance(f, (_compat.OpOverload, _compat.OpOverloadPacket)):
            raise TypeError(
                f"{cls.__qualname__}.implements_torch_function() takes torch-level functions "
                f"(e.g. torch.nn.functional.linear); {f} is an aten op: use "
                f"{cls.__qualname__}.implements({f})."
            )

    def decorator(fn):
        own = cls.__dict__["__kit__"].own_tf
        for f in fns:
            own[f] = fn
        # Only classes with torch-function handlers pay for a Python __torch_function__.
        if cls.__dict__.get("__torch_function__") is None or cls.__torch_function__ is _compat.disabled_torch_function_impl:
            cls.__torch_function__ = classmethod(torch_function)
        _clear_caches()
        return fn

    return decorator


def find_registered(cls, func):
    """The handler registered for ``func`` on ``cls`` or a parent (overload before its
    packet at every level), or None. Classes that replace the resolution order (e.g. a
    pending collective result) start from this.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import ScaledTensor
        >>> find_registered(ScaledTensor, torch.ops.aten.mm.default).__name__
        '_mm'
    """
    packet = getattr(func, "overloadpacket", None)
    for klass in cls.__mro__:
        kit = klass.__dict__.get("__kit__")
        if kit is None:
            continue
        own = kit.own_ops
        h = own.get(func)
        if h is None and packet is not None:
            h = own.get(packet)
        if h is not None:
            return h
    return None


def _resolve(cls, func):
    h = find_registered(cls, func)
    if h is not None:
        return checked_handler(cls, func, h)
    h = cls.__op_handler__(func)  # the class's own classification (extension surface)
    if h is not None:
        return checked_handler(cls, func, h)
    h = builtin_handler(cls, func)
    if h is not None:
        return h
    fb = cls.__fallback__
    # Once per (class, op): the result is cached by resolve().
    _log.debug("%s has no handler for %s; it goes to __fallback__ (%s)", cls.__qualname__, func,
               getattr(fb, "__qualname__", fb))
    per_op = getattr(fb, "resolve_op", None)
    if per_op is not None:
        # fallbacks.per_op (and map_inner, which refuses some conversions): the fallback
        # names the handler for this op; cached like any other.
        h = per_op(func)
        return checked_handler(cls, func, raise_unsupported if h is None else h)
    return checked_handler(cls, func, fb)


# ---- what a handler returns -----------------------------------------------------------------
# torch converts a handler's result to the op's schema *after* __torch_dispatch__ returns, so
# a list or a float where one Tensor is due surfaces as "Unable to cast [...] to Tensor",
# naming neither the op, the class nor the handler. Authors' handlers are therefore wrapped,
# once per (class, op) when resolved, in a check for the schema's return kinds. Trust is by
# registration: the kit's own handlers and fallbacks (registered with _runtime.kit_handler
# where they are defined) return what the op returns by construction, and a class that sets
# ``__check_handlers__ = False`` vouches for every handler it registers; those stay
# unwrapped, so their per-op path pays nothing.

_Tensor = torch.Tensor
_shape_env = _compat.active_shape_env


def _tensor_like(kind: str):
    if kind == "Tensor":
        return lambda v: isinstance(v, _Tensor)
    if kind in ("Optional[Tensor]", "Tensor?"):
        return lambda v: v is None or isinstance(v, _Tensor)
    if kind in ("List[Tensor]", "Tensor[]"):
        return lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, _Tensor) for x in v)
    return None  # ints, bools, SymInts, ...: not checked


def _result_test(kinds: tuple):
    if len(kinds) == 1:
        return _tensor_like(kinds[0])
    if len(kinds) > 1:
        parts = [_tensor_like(k) for k in kinds]
        if all(p is None for p in parts):
            return None
        n = len(kinds)
        return lambda v: (
            isinstance(v, (list, tuple)) and len(v) == n and all(p is None or p(x) for p, x in zip(parts, v))
        )
    return None


def _brief(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_handler(cls, func, h):
    """``h`` wrapped in a check of its result against ``func``'s schema (authors' handlers
    only; the kit's own, and those of a class with ``__check_handlers__ = False``, are
    returned as they are).

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, HandlerResultError
        >>> class Box(WrapperTensor):
        ...     payload: torch.Tensor = inner()
        >>> @Box.implements(torch.ops.aten.neg.default)
        ... def _neg(func, types, args, kwargs):
        ...     return [args[0].payload.neg()]
        >>> try:
        ...     torch.neg(Box(torch.ones(2)))
        ... except HandlerResultError as e:
        ...     print(str(e).split(" (")[0], "...", "returned a list" in str(e))
        Box's handler for aten.neg.default ... True
    """
    if not cls.__check_handlers__ or is_kit_handler(h):
        return h
    kinds = _compat.op_return_types(func)
    test = None if kinds is None else _result_test(kinds)
    if test is None:
        return h

    label = op_name(func)

    def checked(func, types, args, kwargs):
        env = _shape_env()  # None in eager: one dispatch-mode lookup
        if env is None:
            out = h(func, types, args, kwargs)
        else:
            out = _specialize.run_traced(cls, label, h, env, func, types, args, kwargs)
        if out is NotImplemented or test(out):
            return out
        raise HandlerResultError(_result_message(cls, func, h, kinds, out))

    checked.__wrapped__ = h
    checked.__name__ = getattr(h, "__name__", "handler")
    checked.__qualname__ = getattr(h, "__qualname__", checked.__name__)
    return checked


def _result_message(cls, func, h, kinds, out) -> str:
    op = func if isinstance(func, str) else op_name(func)
    name = cls.__qualname__
    where = f"{getattr(h, '__module__', '?')}.{getattr(h, '__qualname__', h)}"
    want = kinds[0] if len(kinds) == 1 else "a tuple (" + ", ".join(kinds) + ")"
    got = f"a {type(out).__name__} ({_brief(out)})"
    if kinds == ("Tensor",):
        want = "one Tensor"
        fix = f"Return one tensor: a plain torch.Tensor or a {name} (build one with {name}(...))"
        fix += "; if the list holds the result, return its element." if isinstance(out, (list, tuple)) else "."
    else:
        fix = f"Return {want}, matching the op's schema."
    return (
        f"{name}'s handler for {op} ({where}) returned {got}, but {op} returns {want}. {fix}"
    )


def _public_name(func) -> str:
    module = getattr(func, "__module__", None) or "torch"
    # F.linear and friends live in torch._C._nn; users know them by their public home.
    if module == "torch._C._nn":
        module = "torch.nn.functional"
    owner = getattr(func, "__objclass__", None)
    if isinstance(owner, type) and owner is not object and issubclass(torch.Tensor, owner):
        return f"torch.Tensor.{getattr(func, '__name__', func)}"
    return f"{module}.{getattr(func, '__name__', func)}"


def _checked_torch_function(cls, func, h):
    """A torch-level handler checked like an aten handler, against the schema of the aten op
    of the same name (``F.linear`` -> ``aten.linear``): a list where one tensor is due is a
    ``HandlerResultError`` in eager, in ``nn.Linear`` and under compile, not a silent list.
    A wrapper it returns must keep its inputs' autograd graph (``GradientDroppedError``)."""
    if not cls.__check_handlers__ or is_kit_handler(h):
        return h
    name = _public_name(func)
    h = _wrap.keeps_graph(cls, func, h, name)
    packet = getattr(torch.ops.aten, getattr(func, "__name__", ""), None)
    op = getattr(packet, "default", None) if packet is not None else None
    if op is None:
        return h
    kinds = _compat.op_return_types(op)
    test = None if kinds is None else _result_test(kinds)
    if test is None:
        return h
    inner = h

    def checked(func, types, args, kwargs):
        out = inner(func, types, args, kwargs)
        if out is NotImplemented or test(out):
            return out
        raise HandlerResultError(_result_message(cls, name, getattr(inner, "__wrapped__", inner), kinds, out))

    checked.__wrapped__ = getattr(inner, "__wrapped__", inner)
    return checked


def resolve(cls, func):
    """Find and cache the handler for ``func`` on ``cls`` (see the module docstring).

    ``__torch_dispatch__`` looks handlers up by ``id(func)``: an int hashes in C, an
    OpOverload in a Python ``__hash__``. The entry under ``func`` itself holds the op, so
    its id is not reused while the cache knows it. A registration clears every cache.
    """
    h = _resolve(cls, func)
    cache = cls.__kit__.cache
    cache[func] = h
    cache[id(func)] = h
    return h


def torch_function(cls, func, types, args=(), kwargs=None):
    """``__torch_function__`` installed on classes that register torch-level handlers."""
    key = ("tf", func)
    cache = cls.__kit__.cache
    try:
        h = cache[key]
    except KeyError:
        h = None
        for klass in cls.__mro__:
            kit = klass.__dict__.get("__kit__")
            if kit is not None and func in kit.own_tf:
                h = kit.own_tf[func]
                break
        if h is not None:
            h = _checked_torch_function(cls, func, h)
        cache[key] = h
    if h is not None:
        return h(func, types, args, {} if kwargs is None else kwargs)
    with _compat.DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))
