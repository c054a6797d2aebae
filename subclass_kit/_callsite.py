"""The torch-level call an unsupported aten op came from, for ``UnsupportedOpError``'s message.

A forgotten ``F.linear`` handler surfaces as "no handler for aten.view.default": torch
decomposed ``linear`` (a CompositeImplicit op) into aten ops before they reached the class,
so the op named is not the function the user called, and the fix is a handler for the
function. On that (cold) error path the Python stack is read outward from the dispatcher:
the first frame outside the kit is the one that called the torch function (the user's code,
or ``nn.Linear.forward``), and its current call expression (``F.linear(x, self.weight)``)
is parsed and its callee resolved by name in that frame. Anything unexpected (no source,
a call that is not a torch function, a frame inside torch's tracing machinery) gives None:
the message then says what it said before.
"""

from __future__ import annotations

import ast
import linecache
import sys
from typing import Any

import torch

from . import _compat

__all__ = ["torch_caller"]

_KIT = __name__.rsplit(".", 1)[0]


def _public(fn: Any) -> str | None:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or isinstance(fn, (_compat.OpOverload, _compat.OpOverloadPacket)):
        return None
    owner = getattr(fn, "__objclass__", None)
    self_ = getattr(fn, "__self__", None)
    if (isinstance(owner, type) and issubclass(torch.Tensor, owner)) or isinstance(self_, torch.Tensor):
        return f"torch.Tensor.{name}"
    if getattr(torch.nn.functional, name, None) is fn:
        return f"torch.nn.functional.{name}"
    if getattr(torch, name, None) is fn:
        return f"torch.{name}"
    return None


def _resolve(node: ast.expr, frame) -> Any:
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if node.id in scope:
                return scope[node.id]
        raise LookupError(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_resolve(node.value, frame), node.attr)
    raise LookupError(type(node).__name__)


def _call_at(frame) -> tuple[Any, str] | None:
    code = frame.f_code
    positions = list(code.co_positions())
    i = frame.f_lasti // 2
    if i >= len(positions):
        return None
    line, end_line, col, end_col = positions[i]
    if line is None or col is None or end_col is None or end_line != line:
        return None
    text = linecache.getline(code.co_filename, line)[col:end_col]
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.Call):
        return None
    try:
        fn = _resolve(tree.func, frame)
    except Exception:
        return None
    return fn, f"{code.co_filename}:{line}"


def torch_caller(op_base: str) -> tuple[str, str] | None:
    """``(public name, "file:line")`` of the torch-level function whose decomposition reached
    the dispatcher with aten op ``op_base`` (``"view"``), or None when it is that op itself
    or cannot be told."""
    try:
        frame: Any = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(_KIT):
            frame = frame.f_back
        if frame is None or frame.f_globals.get("__name__", "").startswith("torch._"):
            return None  # inside torch's tracing machinery: its calls are not the user's
        found = _call_at(frame)
        if found is None:
            return None
        name = _public(found[0])
        if name is None or name.rsplit(".", 1)[1] in (op_base, op_base + "_"):
            return None
        return name, found[1]
    except Exception:  # an error message helper must never raise
        return None
