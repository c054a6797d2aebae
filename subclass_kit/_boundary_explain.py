"""Why the compile boundary refuses or cannot serve a call, in words (``Boundary.explain``).

Each reason names the argument by where it sits (``args[0]``, ``kwargs['scale']``,
``self.layers.0.weight``, ``args[0].a`` for an inner tensor) and the field that differs,
expected versus got, as ``guards.GuardedDispatcher.explain`` does for guard sets.
"""

from __future__ import annotations

from typing import Any

from . import _compat
from ._boundary_trace import Unservable, walk
from .ctx import SubclassCtx

__all__ = ["autograd_reason", "dynamic_reason", "wrapped_requiring_grad", "differs", "explain_call", "qual"]

_LAYOUT = ("size()", "stride()", "dtype", "device", "requires_grad")


def qual(fn: Any) -> str:
    """The name messages use for a function or class (its qualname, else its type's)."""
    return getattr(fn, "__qualname__", type(fn).__name__)


_TENSOR_KINDS = ("tensor", "inner", "wrapper")  # what `walk` adds to the layout check
_SIG_KINDS = ("tensor", "class", "ctx", "value")  # what it adds to the signature


def wrapped_requiring_grad(checked: list, names: list) -> str | None:
    """The first wrapper (or inner tensor of one) that requires grad, by name, or None."""
    tensors = [(kind, n) for kind, n in names if kind in _TENSOR_KINDS]
    for t, (kind, where) in zip(checked, tensors):
        if kind != "tensor" and t.requires_grad:
            return where
    return None


def autograd_reason(checked: list, names: list) -> str | None:
    where = wrapped_requiring_grad(checked, names)
    if where is None:
        return None
    return (f"autograd: {where} requires grad in grad mode (the boundary rebuilds wrappers from "
            "their inner tensors, which would take the wrapper's gradient)")


def dynamic_reason(checked: list, names: list, start: int = 0) -> str | None:
    """A module's wrapper parameter (``checked[start:]``) with dims marked dynamic, by name, or
    None: the arguments' marks are served (``_boundary_dynamic``), the parameters' are not."""
    tensors = [n for kind, n in names if kind in _TENSOR_KINDS]
    for t, where in zip(checked[start:], tensors[start:]):
        if _compat.has_dynamic_marks(t):
            return (f"dynamic shapes: {where} has dims marked dynamic (the boundary rebuilds a "
                    "module's parameters with static shapes)")
    return None


def differs(e: Any, sig: list, names: list, checked: list) -> str | None:
    sig_names = [(kind, n) for kind, n in names if kind in _SIG_KINDS]
    for (kind, where), want, got in zip(sig_names, e.full_sig, sig):
        if want == got and type(want) is type(got):
            continue
        if kind == "ctx":
            return f"{where}: {_ctx_diff(want, got)}"
        if kind == "class":
            return f"{where}: type: expected {qual(want)}, got {qual(got)}"
        return f"{where}: expected {_show(want)}, got {_show(got)}"
    if len(sig) != len(e.full_sig):
        return f"the arguments differ in structure: {len(e.full_sig)} parts expected, got {len(sig)}"
    tensor_names = [n for kind, n in names if kind in _TENSOR_KINDS]
    for k, (where, lay, t) in enumerate(zip(tensor_names, e.layout, checked)):
        now = (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)
        for field, a, b in zip(_LAYOUT, lay, now):
            if k < e.free and field in ("size()", "stride()"):
                a, b = len(a), len(b)  # dynamic sizes: dynamo's guards check them, the rank stays
                field = "dim()"
            if a != b:
                a, b = (tuple(a), tuple(b)) if field == "size()" else (a, b)
                return f"{where}.{field}: expected {a}, got {b}"
    return None


def _ctx_diff(want: SubclassCtx, got: SubclassCtx) -> str:
    if want.dtype != got.dtype:
        return f"dtype: expected {want.dtype}, got {got.dtype}"
    if want.present != got.present:
        return f"inner tensors present: expected {list(want.present)}, got {list(got.present)}"
    for (n, a), (_, b) in zip(want.fields, got.fields):
        if a != b or type(a) is not type(b):
            return f"ctx.{n}: expected {a!r}, got {b!r}"
    return f"ctx: expected {want!r}, got {got!r}"


def _show(v: Any) -> str:
    if type(v) is tuple and len(v) == 2 and isinstance(v[0], type):
        return f"{v[1]!r}" if v[0] not in (list, tuple, dict) else f"a {v[0].__name__} of {v[1]!r}"
    return repr(v)


def explain_call(boundary: Any, args: tuple, kwargs: dict) -> list[str]:
    """``Boundary.explain`` (see there): the call walked with names, against every artifact."""
    names: list = []
    sig: list = []
    checked: list = []
    try:
        for i, a in enumerate(args):
            walk(a, sig, checked, [], names, f"args[{i}]")
        for k, v in kwargs.items():
            sig.append(k)
            names.append(("value", f"kwargs[{k!r}]"))
            walk(v, sig, checked, [], names, f"kwargs[{k!r}]")
        n_args = len(checked)
        boundary._walk_params(sig, checked, [], names)
        hash(tuple(sig))
    except Unservable as u:
        return [f"falls back to torch.compile: {u.reason}"]
    except TypeError as err:
        return [f"falls back to torch.compile: an argument is not hashable ({err})"]
    grad = _compat.is_grad_mode_on()
    reason = (autograd_reason(checked, names) if grad else None) or dynamic_reason(checked, names, n_args)
    entries = sorted((x for b in boundary._table.values() for x in b), key=lambda x: x.used)
    if not entries:
        return ["no artifact yet: the next call compiles" + (f" (no: falls back to torch.compile: {reason})" if reason else "")]
    out = []
    for i, e in enumerate(entries):
        why = differs(e, sig, names, checked) or (
            None if e.grad is None or e.grad is grad else f"grad mode: expected {e.grad}, got {grad}")
        if why is None:
            why = "accepts" + (f", falls back to torch.compile: {e.reason}" if e.reason else "")
        out.append(f"artifact {i}: {why}")
    return out
