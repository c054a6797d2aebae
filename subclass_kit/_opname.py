"""How the kit names an op in messages, reports and tables: one rule everywhere."""

from __future__ import annotations

from ._compat import OpOverload, OpOverloadPacket

__all__ = ["op_name"]


def op_name(op) -> str:
    """``aten.mul.Tensor`` for an OpOverload, ``aten.mul`` for a packet, else the qualname.

    Example:
        >>> import torch
        >>> op_name(torch.ops.aten.mul.Tensor), op_name(torch.ops.aten.mul), op_name(torch.neg)
        ('aten.mul.Tensor', 'aten.mul', 'neg')
    """
    if isinstance(op, OpOverload):
        ns, rest = op.name().split("::")
        name, _, overload = rest.partition(".")
        return f"{ns}.{name}.{overload or 'default'}"
    if isinstance(op, OpOverloadPacket):
        return f"aten.{op.__name__}" if "::" not in str(op) else str(op).replace("::", ".")
    name = getattr(op, "__qualname__", None) or ""
    if not name or name.startswith("_"):  # torch's builtins: _VariableFunctionsClass.neg
        name = getattr(op, "__name__", None) or repr(op)
    return name
