"""A handler that turns a dynamic size into a constant is named where it does it.

``int(x.shape[0])`` (or ``float()``, or a Python ``==`` that must be decided) inside a handler
specializes the size: torch then fails a compile whose dim was marked dynamic with its raw
``ConstraintViolationError``, raised at the end of tracing and pointing at the user's call,
not at the handler, and an unmarked dim recompiles for every new size. While AOTAutograd
runs an author's aten handler on fake inner tensors, the symbols the shape environment pins
to a number during the handler are compared before and after it: new ones give a
``SizeSpecializedWarning`` naming the class, the op, the sizes and the fix. A guard on a
data-dependent value (``int(offsets[-1])``), which torch raises inside the handler, becomes a
``SymbolicSizeError`` naming the same. Eager calls pay one dispatch-mode lookup.
"""

from __future__ import annotations

import warnings

import torch

from . import _compat
from .errors import SizeSpecializedWarning, SymbolicSizeError

__all__ = ["run_traced"]

_FIX = (
    "Keep sizes symbolic in handlers: compute with them directly (x.shape[0] + 1, "
    "symbolic.ceil_div(n, block)), pass them on as they are (torch.zeros(x.shape[0], ...)), and "
    "state facts with torch._check(n > 0) instead of int(n) or an if on them."
)


def run_traced(cls, name: str, h, env, func, types, args, kwargs):
    """Run handler ``h`` under a tracing shape environment ``env``, naming specializations."""
    before = _compat.fixed_symbols(env)
    try:
        out = h(func, types, args, kwargs)
    except _compat.DataDependentError as e:
        where = f"{getattr(h, '__module__', '?')}.{getattr(h, '__qualname__', h)}"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SymbolicSizeError(
            f"{cls.__qualname__}'s handler for {name} ({where}) needs the value of a "
            f"data-dependent size to decide something ({first}): a value read from a tensor "
            f"(.item(), .tolist(), int(t[i])) is unknown while compiling. {_FIX} Read such "
            "values from the shapes of inner tensors where you can (a packed tensor's "
            "shape[0] is the total length)."
        ) from e
    after = _compat.fixed_symbols(env)
    if len(after) > len(before):
        # A size pinned to a value that a static size of the operands also has is the op's
        # own shape check (mm's inner dims must match a static weight): torch requires it, the
        # author did nothing wrong. Only a pin to some other value is named.
        static = _static_sizes((args, kwargs))
        new = {k: v for k, v in after.items() if k not in before and v not in static}
    else:
        new = {}
    if new:
        sizes = ", ".join(
            f"{' / '.join(_compat.symbol_sources(env, k)) or k} = {v}" for k, v in new.items()
        )
        where = f"{getattr(h, '__module__', '?')}.{getattr(h, '__qualname__', h)}"
        warnings.warn(
            f"{cls.__qualname__}'s handler for {name} ({where}) turned dynamic sizes into "
            f"constants ({sizes}): an int(), float() or exact comparison on a SymInt size. A dim "
            "marked dynamic then fails torch.compile with torch's ConstraintViolationError; an "
            f"unmarked one recompiles for every new size. {_FIX}",
            SizeSpecializedWarning,
            stacklevel=2,
        )
    return out


def _static_sizes(tree) -> set:
    """Every plain-int size of the tensors in ``tree``, inner tensors of wrappers included."""
    out: set = set()
    stack = [tree]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, torch.Tensor):
            out.update(d for d in v.shape if type(d) is int)
            flatten = getattr(type(v), "__tensor_flatten__", None)
            if flatten is not None:
                names, _ = flatten(v)
                stack.extend(getattr(v, n) for n in names)
    return out
