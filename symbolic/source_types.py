"""The source classes: small frozen values that name a place inside a (wrapped) tensor.

A source fetches (``src(root)``) and renders relative to any root name
(``src.name("w")`` -> ``L['w'].scale.size()[0]``), the way dynamo's guards name the same
place. ``src.to_torch()`` gives the equivalent torch ``Source`` (``LocalSource``,
``AttrSource``, ``GetItemSource``, ``TensorPropertySource``, reached through
``symbolic._compat``) for anything of torch's that takes one, such as ``ShapeEnv``.

Why not subclass torch's types: torch reads ``source.name`` as a string attribute, while
ours renders for a root given as an argument; one attribute cannot be both without a
callable string. The conversion is explicit instead.

Kept apart from ``tensor_sources.py`` (which walks tensors through ``protocol``) so that
``protocol`` can name sources without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _compat

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
]


class Source:
    """Base of all sources. Call it on the root value to fetch; ``name(root)`` to render.

    Example:
        >>> import torch
        >>> src = SizeSource(ROOT, 1)
        >>> src(torch.ones(2, 3)), src.name(), src.name("w")
        (3, "L['x'].size()[1]", "L['w'].size()[1]")
    """

    __slots__ = ()

    def __call__(self, root: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def render(self, root_expr: str) -> str:  # pragma: no cover - abstract
        """This source's expression below the root expression ``root_expr``."""
        raise NotImplementedError

    def name(self, root: str | None = None) -> str:
        """Render for a local named ``root`` (default: the root's own name, ``x`` for ``ROOT``).

        Example:
            >>> InnerSource("scale").name("w")
            "L['w'].scale"
        """
        return self.render(f"L[{(root if root is not None else _root_name(self))!r}]")

    def to_torch(self) -> Any:
        """The same place as one of torch's own ``Source`` objects (for ``ShapeEnv`` and
        anything else of torch's that takes a source).

        Example:
            >>> SizeSource(InnerSource("a"), 0).to_torch().name
            "L['x'].a.size()[0]"
        """
        raise TypeError(f"{type(self).__name__} has no torch Source equivalent ({self})")

    def __str__(self) -> str:
        return self.name()


def _root_name(src: Source) -> str:
    s: Any = src
    while not isinstance(s, Root):
        s = getattr(s, "base", None)
        if s is None:
            return "x"
    return s.local_name


@dataclass(frozen=True)
class Root(Source):
    """The root value itself (``L['x']``); torch's ``LocalSource``.

    Relative rendering (``render``) ignores ``local_name``: the root is whatever name the
    caller renders with. ``name()`` without an argument uses it.
    """

    local_name: str = "x"

    def __call__(self, root: Any) -> Any:
        return root

    def render(self, root_expr: str) -> str:
        return root_expr

    def to_torch(self) -> Any:
        return _compat.TorchLocalSource(self.local_name)

    def __repr__(self) -> str:
        return "Root()" if self.local_name == "x" else f"Root({self.local_name!r})"


ROOT = Root()


@dataclass(frozen=True)
class InnerSource(Source):
    """An inner tensor attribute: ``InnerSource("scale")`` is ``L['x'].scale`` (torch's ``AttrSource``)."""

    attr: str
    base: Source = ROOT

    def __call__(self, root: Any) -> Any:
        return getattr(self.base(root), self.attr)

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}.{self.attr}"

    def to_torch(self) -> Any:
        return _compat.TorchAttrSource(self.base.to_torch(), self.attr)


@dataclass(frozen=True)
class ItemSource(Source):
    """A pytree element: ``ItemSource(0)`` is ``L['x'][0]`` (torch's ``GetItemSource``)."""

    key: Any
    base: Source = ROOT

    def __call__(self, root: Any) -> Any:
        return self.base(root)[self.key]

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}[{self.key!r}]"

    def to_torch(self) -> Any:
        return _compat.TorchGetItemSource(self.base.to_torch(), self.key)


@dataclass(frozen=True)
class ViewBaseSource(Source):
    """The base of a view: ``ViewBaseSource(InnerSource("qdata"))`` is ``L['x'].qdata._base``.

    Dynamo fakeifies a view together with its base and guards on the base's sizes under
    this name (torch's ``AttrSource(base, "_base")``).
    """

    base: Source = ROOT

    def __call__(self, root: Any) -> Any:
        return self.base(root)._base

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}._base"

    def to_torch(self) -> Any:
        return _compat.TorchAttrSource(self.base.to_torch(), "_base")


@dataclass(frozen=True)
class SizeSource(Source):
    """``SizeSource(InnerSource("scale"), 0)`` is ``L['x'].scale.size()[0]``."""

    base: Source
    dim: int

    def __call__(self, root: Any) -> Any:
        return self.base(root).size(self.dim)

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}.size()[{self.dim}]"

    def to_torch(self) -> Any:
        return _compat.TorchTensorPropertySource(self.base.to_torch(), _compat.TorchTensorProperty.SIZE, self.dim)


@dataclass(frozen=True)
class StrideSource(Source):
    """``StrideSource(ROOT, 1)`` is ``L['x'].stride()[1]``."""

    base: Source
    dim: int

    def __call__(self, root: Any) -> Any:
        return self.base(root).stride(self.dim)

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}.stride()[{self.dim}]"

    def to_torch(self) -> Any:
        return _compat.TorchTensorPropertySource(self.base.to_torch(), _compat.TorchTensorProperty.STRIDE, self.dim)


@dataclass(frozen=True)
class StorageOffsetSource(Source):
    """``StorageOffsetSource(ROOT)`` is ``L['x'].storage_offset()``."""

    base: Source = ROOT

    def __call__(self, root: Any) -> Any:
        return self.base(root).storage_offset()

    def render(self, root_expr: str) -> str:
        return f"{self.base.render(root_expr)}.storage_offset()"

    def to_torch(self) -> Any:
        return _compat.TorchTensorPropertySource(
            self.base.to_torch(), _compat.TorchTensorProperty.STORAGE_OFFSET, None
        )
