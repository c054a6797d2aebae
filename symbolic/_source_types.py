"""The source classes: small frozen values that name a place inside a (wrapped) tensor.

Each class *is* one of torch's own ``Source`` types (``LocalSource``, ``AttrSource``,
``GetItemSource``, ``TensorPropertySource``, reached through ``symbolic._compat``), so a
source from ``symbolic.sources`` can be handed to anything of torch's that takes one; on top
of that it fetches (``src(root)``) and renders relative to any root name
(``src.name("w")``). ``src.name`` is at the same time torch's string
(``L['x'].scale.size()[0]``) and callable, so both spellings work.

Kept apart from ``sources.py`` (which walks tensors through ``protocol``) so that
``protocol`` can name sources without an import cycle.
"""

from __future__ import annotations

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

_SIZE = _compat.TorchTensorProperty.SIZE
_STRIDE = _compat.TorchTensorProperty.STRIDE
_OFFSET = _compat.TorchTensorProperty.STORAGE_OFFSET


class _Name(str):
    """torch's ``source.name`` (a string) that can also be called: ``src.name("w")``."""

    def __new__(cls, src: "Source"):
        self = super().__new__(cls, src.render(f"L[{_root_name(src)!r}]"))
        self._src = src
        return self

    def __call__(self, root: str = "x") -> str:
        """Render for a local named ``root``: ``L['w'].scale.size()[0]``."""
        return self._src.render(f"L[{root!r}]")


def _root_name(src: "Source") -> str:
    s: Any = src
    while not isinstance(s, Root):
        s = getattr(s, "base", None)
        if s is None:
            return "x"
    return s.local_name


class Source(_compat.TorchSource):
    """Base of all sources. Call it on the root value to fetch; ``name(root)`` to render.

    A subclass of torch's ``Source``; ``name`` is torch's rendered string and is also
    callable with another root name.
    """

    __slots__ = ()

    def __call__(self, root: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def render(self, root_expr: str) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def name(self) -> _Name:  # type: ignore[override]
        """``L['x']...`` as a string (torch's ``Source.name``); call it for another root."""
        return _Name(self)

    def __str__(self) -> str:
        return self.render("L['x']")


class Root(Source, _compat.TorchLocalSource):
    """The root value itself (``L['x']``); torch's ``LocalSource``.

    Relative rendering (``render``) ignores ``local_name``: the root is whatever name the
    caller renders with. torch's ``name`` uses it.
    """

    def __init__(self, local_name: str = "x"):
        _compat.TorchLocalSource.__init__(self, local_name)

    def __call__(self, root):
        return root

    def render(self, root_expr):
        return root_expr

    def __reduce__(self):
        return (Root, (self.local_name,))

    def __repr__(self):
        return "Root()" if self.local_name == "x" else f"Root({self.local_name!r})"


ROOT = Root()


class InnerSource(Source, _compat.TorchAttrSource):
    """An inner tensor attribute: ``InnerSource("scale")`` is ``L['x'].scale`` (torch's ``AttrSource``)."""

    def __init__(self, attr: str, base: Source = ROOT):
        _compat.TorchAttrSource.__init__(self, base, attr)

    @property
    def attr(self) -> str:
        return self.member

    def __call__(self, root):
        return getattr(self.base(root), self.member)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.{self.member}"

    def __reduce__(self):
        return (InnerSource, (self.member, self.base))

    def __repr__(self):
        return f"InnerSource(attr={self.member!r}, base={self.base!r})"


class ItemSource(Source, _compat.TorchGetItemSource):
    """A pytree element: ``ItemSource(0)`` is ``L['x'][0]`` (torch's ``GetItemSource``)."""

    def __init__(self, key: Any, base: Source = ROOT):
        _compat.TorchGetItemSource.__init__(self, base, key)

    @property
    def key(self) -> Any:
        return self.index

    def __call__(self, root):
        return self.base(root)[self.index]

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}[{self.index!r}]"

    def __reduce__(self):
        return (ItemSource, (self.index, self.base))

    def __repr__(self):
        return f"ItemSource(key={self.index!r}, base={self.base!r})"


class ViewBaseSource(Source, _compat.TorchAttrSource):
    """The base of a view: ``ViewBaseSource(InnerSource("qdata"))`` is ``L['x'].qdata._base``.

    Dynamo fakeifies a view together with its base and guards on the base's sizes under
    this name (torch's ``AttrSource(base, "_base")``).
    """

    def __init__(self, base: Source = ROOT):
        _compat.TorchAttrSource.__init__(self, base, "_base")

    def __call__(self, root):
        return self.base(root)._base

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}._base"

    def __reduce__(self):
        return (ViewBaseSource, (self.base,))

    def __repr__(self):
        return f"ViewBaseSource(base={self.base!r})"


class SizeSource(Source, _compat.TorchTensorPropertySource):
    """``SizeSource(InnerSource("scale"), 0)`` is ``L['x'].scale.size()[0]``."""

    def __init__(self, base: Source, dim: int):
        _compat.TorchTensorPropertySource.__init__(self, base, _SIZE, dim)

    @property
    def dim(self) -> int:
        return self.idx

    def __call__(self, root):
        return self.base(root).size(self.idx)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.size()[{self.idx}]"

    def __reduce__(self):
        return (SizeSource, (self.base, self.idx))

    def __repr__(self):
        return f"SizeSource(base={self.base!r}, dim={self.idx!r})"


class StrideSource(Source, _compat.TorchTensorPropertySource):
    """``StrideSource(ROOT, 1)`` is ``L['x'].stride()[1]``."""

    def __init__(self, base: Source, dim: int):
        _compat.TorchTensorPropertySource.__init__(self, base, _STRIDE, dim)

    @property
    def dim(self) -> int:
        return self.idx

    def __call__(self, root):
        return self.base(root).stride(self.idx)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.stride()[{self.idx}]"

    def __reduce__(self):
        return (StrideSource, (self.base, self.idx))

    def __repr__(self):
        return f"StrideSource(base={self.base!r}, dim={self.idx!r})"


class StorageOffsetSource(Source, _compat.TorchTensorPropertySource):
    """``StorageOffsetSource(ROOT)`` is ``L['x'].storage_offset()``."""

    def __init__(self, base: Source = ROOT):
        _compat.TorchTensorPropertySource.__init__(self, base, _OFFSET, None)

    def __call__(self, root):
        return self.base(root).storage_offset()

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.storage_offset()"

    def __reduce__(self):
        return (StorageOffsetSource, (self.base,))

    def __repr__(self):
        return f"StorageOffsetSource(base={self.base!r})"
