"""The guard protocol: what a guard names, emits, explains, lists and keys.

Every guard names the sources it reads (``nodes``), emits its check into a ``CodeGen``,
explains a failure as ``<rendered source>: expected <e>, got <a>`` lines, describes itself
for listings, and gives a canonical (process-independent, JSON-able) form for cache keys.
A *structural* guard (type, length, keys, inner names) protects what lies below it: when it
fails, explanations of guards below it are skipped rather than reported as noise.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._canonical import type_name
from .._sources import Source

__all__ = ["Guard", "fmt", "line"]


def fmt(v: Any) -> str:
    """Short, readable rendering of an expected/actual value."""
    if isinstance(v, type):
        return type_name(v, short=True)
    if isinstance(v, torch.Size):
        return str(tuple(v))
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(repr(x) for x in sorted(v)) + "}" if v else "set()"
    return repr(v)


class Guard:
    """Base class. Subclasses are frozen dataclasses."""

    structural = False
    kind = "guard"

    @property
    def nodes(self) -> tuple:
        return (self.source,)  # type: ignore[attr-defined]

    def emit(self, cg) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def failures(self, root, r) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self, r) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def canonical(self, r):
        """JSON-able form for cache keys; None leaves the guard out of the key."""
        return None


def line(r: Callable[[Source], str], src: Source, expected: str, got: str) -> str:
    """``<rendered source>: expected <e>, got <a>``."""
    return f"{r(src)}: expected {expected}, got {got}"
