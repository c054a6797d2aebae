"""Sources: small frozen values that name a place inside a (wrapped) tensor and fetch it.

A source is relative to a root value. ``SizeSource(InnerSource("scale"), 0)(t)`` returns
``t.scale.size(0)``; ``.name("x")`` renders it the way dynamo's guards name it,
``L['x'].scale.size()[0]``. Guards, explanations and error messages print rendered
sources, never ad-hoc strings, so that what the kit says can be matched against what
dynamo says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Source",
    "Root",
    "ROOT",
    "InnerSource",
    "ItemSource",
    "SizeSource",
    "StrideSource",
    "StorageOffsetSource",
]


class Source:
    """Base of all sources. Call it on the root value to fetch; ``name(root)`` to render."""

    __slots__ = ()

    def __call__(self, root: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def render(self, root_expr: str) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def name(self, root: str = "x") -> str:
        """Render as dynamo does for a local named ``root``: ``L['x']...``."""
        return self.render(f"L[{root!r}]")

    def __str__(self) -> str:
        return self.name("x")


@dataclass(frozen=True, slots=True)
class Root(Source):
    """The root value itself (``L['x']``)."""

    def __call__(self, root):
        return root

    def render(self, root_expr):
        return root_expr


ROOT = Root()


@dataclass(frozen=True, slots=True)
class InnerSource(Source):
    """An inner tensor attribute: ``InnerSource("scale")`` is ``L['x'].scale``."""

    attr: str
    base: Source = ROOT

    def __call__(self, root):
        return getattr(self.base(root), self.attr)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.{self.attr}"


@dataclass(frozen=True, slots=True)
class ItemSource(Source):
    """A pytree element: ``ItemSource(0)`` is ``L['x'][0]``, ``ItemSource("k")`` is ``L['x']['k']``."""

    key: Any
    base: Source = ROOT

    def __call__(self, root):
        return self.base(root)[self.key]

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}[{self.key!r}]"


@dataclass(frozen=True, slots=True)
class SizeSource(Source):
    """``SizeSource(InnerSource("scale"), 0)`` is ``L['x'].scale.size()[0]``."""

    base: Source
    dim: int

    def __call__(self, root):
        return self.base(root).size(self.dim)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.size()[{self.dim}]"


@dataclass(frozen=True, slots=True)
class StrideSource(Source):
    """``StrideSource(ROOT, 1)`` is ``L['x'].stride()[1]``."""

    base: Source
    dim: int

    def __call__(self, root):
        return self.base(root).stride(self.dim)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.stride()[{self.dim}]"


@dataclass(frozen=True, slots=True)
class StorageOffsetSource(Source):
    """``StorageOffsetSource(ROOT)`` is ``L['x'].storage_offset()``."""

    base: Source = ROOT

    def __call__(self, root):
        return self.base(root).storage_offset()

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.storage_offset()"
