"""Process-independent, JSON-able forms of guarded values (for stable cache keys).

No ``hash()``, ``id()`` or address-bearing ``repr()``: a value either has a canonical form
that is the same in every process, or ``UnstableKeyError`` names it and says how to give
it one.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

import torch

from . import _compat
from .errors import UnstableKeyError

__all__ = ["canonical", "type_name"]


def type_name(cls: type, *, short: bool = False) -> str:
    """``module.QualName`` of a class (``QualName`` when ``short``)."""
    if short:
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def canonical(v: Any, *, where: str = "a guarded value") -> Any:
    """A JSON-able structure equal in every process exactly when the values are equal.

    Example:
        >>> canonical((1, 2.5, "a", None))
        ['tuple', [1, ['float', '0x1.4000000000000p+1'], 'a', None]]
        >>> canonical(torch.float16)
        ['dtype', 'torch.float16']
        >>> canonical({"b": [1, 64], "a": None}) == canonical({"a": None, "b": [1, 64]})
        True
    """
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int) and type(v) is int:
        return v
    if isinstance(v, float) and type(v) is float:
        return ["float", v.hex()]
    if hasattr(v, "canonical") and callable(v.canonical) and not isinstance(v, type):
        # The kit's ctx (and symbolic's policies) describe themselves.
        return ["canonical", type_name(type(v)), v.canonical()]
    if hasattr(v, "__canonical__") and not isinstance(v, type):
        return ["obj", type_name(type(v)), canonical(v.__canonical__(), where=where)]
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return [type(v).__name__, str(v)]
    if isinstance(v, torch.Size):
        return ["size", [canonical(x, where=where) for x in v]]
    if isinstance(v, enum.Enum):
        return ["enum", type_name(type(v)), v.name]
    if isinstance(v, type):
        return ["class", type_name(v)]
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return ["namedtuple", type_name(type(v)), [[f, canonical(x, where=where)] for f, x in zip(v._fields, v)]]
    if isinstance(v, (tuple, list)):
        return [type(v).__name__, [canonical(x, where=where) for x in v]]
    if isinstance(v, (set, frozenset)):
        items = [canonical(x, where=where) for x in v]
        return [type(v).__name__, sorted(items, key=lambda x: json.dumps(x, sort_keys=True))]
    if isinstance(v, dict):
        # ``==`` ignores insertion order, so the key does too.
        items = [[canonical(k, where=where), canonical(x, where=where)] for k, x in v.items()]
        name = "dict" if type(v) is dict else type_name(type(v))
        return [name, sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))]
    if isinstance(v, int):  # int subclasses other than bool (e.g. IntEnum handled above)
        return ["int", type_name(type(v)), int(v)]
    if isinstance(v, float):
        return ["float", type_name(type(v)), float(v).hex()]
    if dataclasses.is_dataclass(v):
        return [
            "dataclass",
            type_name(type(v)),
            [[f.name, canonical(getattr(v, f.name), where=where)] for f in dataclasses.fields(v)],
        ]
    if isinstance(v, torch.SymInt):
        if _compat.is_nested_int(v):
            # A jagged dim: its identity (j1, j2, ...) depends on creation order, and dynamo
            # treats it as dynamic, so only the coefficient (``3*j1`` -> 3) is part of the key.
            return ["nested_int", _compat.nested_int_coeff(v)]
        return ["symint", str(v.node.expr)]
    r = repr(v)
    if " at 0x" in r or "object at" in r:
        raise UnstableKeyError(
            f"{where} holds {r} ({type_name(type(v))}), which has no process-independent form, "
            "so no stable cache key exists. Make it a frozen dataclass, a tuple of plain values, "
            "or give it a canonical() method returning JSON-able data."
        )
    return ["repr", type_name(type(v)), r]

