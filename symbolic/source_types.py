"""The source classes: small frozen values that name a place inside a (wrapped) tensor.

A source fetches (``src(root)``) and renders relative to any root name
(``src.name_for("w")`` -> ``L['w'].scale.size()[0]``; ``src.name`` for its own root), the
way dynamo's guards name the same place. ``src.to_torch()`` gives the equivalent torch ``Source`` (``LocalSource``,
``AttrSource``, ``GetItemSource``, ``TensorPropertySource``, reached through
``symbolic._compat``) for anything of torch's that takes one, such as ``ShapeEnv``.

``src.name`` is a string, as torch's ``Source.name`` is (a property in torch 2.13), so
``src.name == "L['x'].size()[0]"`` means the same for both. They are not torch's types:
ours also render for any root (``name_for``) and fetch; ``to_torch()`` converts.

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
    """Base of all sources. Call it on the root value to fetch; ``.name`` is its name (a
    string, as torch's), ``name_for(root)`` renders it for another local.

    Example:
        >>> import torch
        >>> src = SizeSource(ROOT, 1)
        >>> src(torch.ones(2, 3)), src.name, src.name_for("w")
        (3, "L['x'].size()[1]", "L['w'].size()[1]")
    """

    __slots__ = ()

    def __call__(self, root: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def render(self, root_expr: str) -> str:  # pragma: no cover - abstract
        """This source's expression below the root expression ``root_expr``."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The name dynamo's guards give this place, for the root's own local name (``x``
        for ``ROOT``): a string, as torch's ``Source.name`` (a property since torch 2.13).

        Example:
            >>> InnerSource("scale").name
            "L['x'].scale"
        """
        return self.render(f"L[{_root_name(self)!r}]")

    def name_for(self, root: str) -> str:
        """The name of this place under a local named ``root``.

        Example:
            >>> InnerSource("scale").name_for("w")
            "L['w'].scale"
        """
        return self.render(f"L[{root!r}]")

    def to_torch(self) -> Any:
        """The same place as one of torch's own ``Source`` objects (for ``ShapeEnv`` and
        anything else of torch's that takes a source).

        Example:
            >>> SizeSource(InnerSource("a"), 0).to_torch().name
            "L['x'].a.size()[0]"
        """
        raise TypeError(f"{type(self).__name__} has no torch Source equivalent ({self})")

    def __str__(self) -> str:
        return self.name


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
    caller renders with. ``name`` uses it.
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
