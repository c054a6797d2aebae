"""Sources: small frozen values that name a place inside a (wrapped) tensor and fetch it.

A source is relative to a root value. ``SizeSource(InnerSource("scale"), 0)(t)`` returns
``t.scale.size(0)``; ``.name("x")`` renders it the way dynamo's guards name it,
``L['x'].scale.size()[0]``. Guards, explanations and error messages print rendered
sources, never ad-hoc strings, so that what the kit says can be matched against what
dynamo says.
"""

from __future__ import annotations

import sys
import types
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
    "ViewBaseSource",
    "sources",
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
class ViewBaseSource(Source):
    """The base of a view: ``ViewBaseSource(InnerSource("qdata"))`` is ``L['x'].qdata._base``.

    Dynamo fakeifies a view together with its base and guards on the base's sizes under
    this name.
    """

    base: Source = ROOT

    def __call__(self, root):
        return self.base(root)._base

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}._base"


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


def sources(t: Any, name: str = "x") -> dict[str, Source]:
    """Every size, stride and storage offset reachable in ``t``, keyed as dynamo names them.

    The outer tensor first, then each inner tensor in ``__tensor_flatten__`` order,
    recursively; per tensor its sizes, strides and storage offset, and those of its
    ``_base`` when it is a view (dynamo guards on view bases too). Keys are the rendered
    names (``L['x'].scale.size()[0]``), values the sources that fetch them. Also reachable as
    ``symbolic.sources(t, name)``: this module is callable.

    Example:
        >>> import torch
        >>> list(sources(torch.ones(2, 3)))
        ["L['x'].size()[0]", "L['x'].size()[1]", "L['x'].stride()[0]", "L['x'].stride()[1]", "L['x'].storage_offset()"]
    """
    from .protocol import walk  # protocol imports this module; import late to avoid the cycle

    out: dict[str, Source] = {}

    def add(src: Source, tensor) -> None:
        n = tensor.dim()
        for s in [SizeSource(src, i) for i in range(n)] + [StrideSource(src, i) for i in range(n)]:
            out[s.name(name)] = s
        off = StorageOffsetSource(src)
        out[off.name(name)] = off

    for src, tensor in walk(t):
        add(src, tensor)
        if tensor._is_view():
            add(ViewBaseSource(src), tensor._base)
    return out


class _CallableModule(types.ModuleType):
    # The contract names both this module (`symbolic.sources.SizeSource`) and a function
    # (`symbolic.sources(t, name="x")`). A callable module keeps both spellings working,
    # including `import symbolic.sources as m`, which a function shadowing it would break.
    def __call__(self, t: Any, name: str = "x") -> dict[str, Source]:
        return sources(t, name)


sys.modules[__name__].__class__ = _CallableModule
