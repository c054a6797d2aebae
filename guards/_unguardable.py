"""Values that no guard can describe: a structure that contains itself, and a ctx holding
a NaN.

Both would go wrong quietly otherwise: walking a cycle never ends (a bare ``RecursionError``
from deep inside), and a NaN in a ctx fails its own guard on the next call (NaN != NaN, and
dynamo's TENSOR_SUBCLASS_METADATA_MATCH compares with ``==`` too), so every call would
compile a new artifact. ``guards.build`` and ``guards.cache_key`` name them at build time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

__all__ = ["find_cycle", "find_nan", "children"]


def children(v: Any) -> Iterator[tuple[str, Any]]:
    """``(path step, child)`` for the containers a ctx or an input is made of."""
    pairs = getattr(v, "fields", None) if not isinstance(v, type) else None
    if isinstance(pairs, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        # The kit's ctx (and any ctx that lists its fields the same way): by field name.
        for k, x in pairs:
            yield f".{k}", x
    elif isinstance(v, dict):
        for k, x in v.items():
            yield f"[{k!r}]", x
    elif isinstance(v, tuple) and hasattr(v, "_fields"):
        for k, x in zip(v._fields, v):
            yield f".{k}", x
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield f"[{i}]", x
    elif isinstance(v, (set, frozenset)):
        for x in v:
            yield "{...}", x
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        for f in dataclasses.fields(v):
            yield f".{f.name}", getattr(v, f.name)


def find_cycle(v: Any, path: str = "") -> tuple[str, str] | None:
    """``(path of the repeated object, path where it first appears)`` if ``v`` contains
    itself, else None.

    Example:
        >>> a = [1]; a.append(a)
        >>> find_cycle(a)
        ('[1]', '')
    """
    active: dict[int, str] = {}

    def go(x: Any, p: str) -> tuple[str, str] | None:
        first = active.get(id(x))
        if first is not None:
            return p, first
        kids = list(children(x))
        if not kids:
            return None
        active[id(x)] = p
        for step, c in kids:
            hit = go(c, p + step)
            if hit is not None:
                return hit
        del active[id(x)]
        return None

    return go(v, path)


def find_nan(v: Any, path: str = "") -> str | None:
    """The path of the first NaN (float or complex) inside ``v`` (no cycles), else None.

    Example:
        >>> find_nan({"eps": [1.0, float("nan")]})
        "['eps'][1]"
    """
    if isinstance(v, float) and math.isnan(v):
        return path
    if isinstance(v, complex) and (math.isnan(v.real) or math.isnan(v.imag)):
        return path
    for step, c in children(v):
        hit = find_nan(c, path + step)
        if hit is not None:
            return hit
    return None
