"""Sources the guards need beyond ``symbolic.sources``: arguments, properties, the flatten
context and its fields, lengths and keys, dimension marks.

Like every source, each one fetches (``src(root)``) and renders (``src.name``, or ``src.name_for("x")``) the way
dynamo names the same place, so an explanation line can be matched against a dynamo
recompile reason. ``codegen(parent_expr)`` gives the Python expression the generated check
uses to reach it from its parent's local variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from symbolic import (
    ROOT,
    InnerSource,
    ItemSource,
    Root,
    SizeSource,
    Source,
    StorageOffsetSource,
    StrideSource,
)

__all__ = [
    "ArgSource",
    "AttrSource",
    "CallSource",
    "TypeSource",
    "LenSource",
    "KeysSource",
    "FlattenSource",
    "CtxFieldSource",
    "base_of",
    "descends_from",
    "codegen_step",
    "rebase",
    "strip_locals",
]


@dataclass(frozen=True, slots=True)
class ArgSource(Source):
    """Positional argument ``index`` of a call, rendered by parameter name: ``L['y']``."""

    index: int
    arg: str

    def __call__(self, root):
        return root[self.index]

    def render(self, root_expr):
        return f"L[{self.arg!r}]"


@dataclass(frozen=True, slots=True)
class AttrSource(Source):
    """A plain attribute that is not an inner tensor: ``L['x'].dtype``, ``L['x']._base``."""

    base: Source
    attr: str

    def __call__(self, root):
        return getattr(self.base(root), self.attr)

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.{self.attr}"


@dataclass(frozen=True, slots=True)
class CallSource(Source):
    """A no-argument method call: ``L['x'].dim()``."""

    base: Source
    method: str

    def __call__(self, root):
        return getattr(self.base(root), self.method)()

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.{self.method}()"


@dataclass(frozen=True, slots=True)
class TypeSource(Source):
    """``type(L['x'])``."""

    base: Source

    def __call__(self, root):
        return type(self.base(root))

    def render(self, root_expr):
        return f"type({self.base.render(root_expr)})"


@dataclass(frozen=True, slots=True)
class LenSource(Source):
    """``len(L['x'])``."""

    base: Source

    def __call__(self, root):
        return len(self.base(root))

    def render(self, root_expr):
        return f"len({self.base.render(root_expr)})"


@dataclass(frozen=True, slots=True)
class KeysSource(Source):
    """``list(L['x'].keys())``."""

    base: Source

    def __call__(self, root):
        return list(self.base(root).keys())

    def render(self, root_expr):
        return f"list({self.base.render(root_expr)}.keys())"


@dataclass(frozen=True, slots=True)
class FlattenSource(Source):
    """``L['x'].__tensor_flatten__()[0]`` (inner names) or ``[1]`` (the ctx)."""

    base: Source
    index: int

    def __call__(self, root):
        return self.base(root).__tensor_flatten__()[self.index]

    def render(self, root_expr):
        return f"{self.base.render(root_expr)}.__tensor_flatten__()[{self.index}]"


@dataclass(frozen=True, slots=True)
class CtxFieldSource(Source):
    """One field of a ctx: ``L['x'].__tensor_flatten__()[1].block`` (or ``[2]`` for a tuple)."""

    base: Source
    field: Any
    key: bool = False  # a dict ctx: ``[field]`` rather than ``.field``

    def __call__(self, root):
        ctx = self.base(root)
        if isinstance(self.field, int) or self.key:
            return ctx[self.field]
        return getattr(ctx, self.field)

    def render(self, root_expr):
        b = self.base.render(root_expr)
        if isinstance(self.field, int):
            return f"{b}[{self.field}]"
        if self.key:
            return f"{b}[{self.field!r}]"
        return f"{b}.{self.field}"


def base_of(src: Source) -> Source | None:
    """The source one step up, or None at a root."""
    if isinstance(src, (Root, ArgSource)):
        return None
    return getattr(src, "base", None)


def descends_from(src: Source, ancestor: Source) -> bool:
    """True when ``src`` is ``ancestor`` or lies below it."""
    s: Source | None = src
    while s is not None:
        if s == ancestor:
            return True
        s = base_of(s)
    return False


def rebase(src: Source, root: Source) -> Source:
    """``src`` (relative to a wrapper) re-rooted at ``root`` (where that wrapper sits)."""
    if isinstance(src, Root):
        return root
    if isinstance(src, InnerSource):
        return InnerSource(src.attr, rebase(src.base, root))
    if isinstance(src, (SizeSource, StrideSource)):
        return type(src)(rebase(src.base, root), src.dim)
    if isinstance(src, StorageOffsetSource):
        return StorageOffsetSource(rebase(src.base, root))
    if isinstance(src, ItemSource):
        return ItemSource(src.key, rebase(src.base, root))
    raise TypeError(f"cannot re-root source {type(src).__name__} ({src})")


def codegen_step(src: Source, parent: str) -> str:
    """Python expression reaching ``src`` from its parent's variable ``parent``."""
    if isinstance(src, (InnerSource, AttrSource)):
        return f"{parent}.{src.attr}"
    if isinstance(src, ItemSource):
        return f"{parent}[{src.key!r}]"
    if isinstance(src, CallSource):
        return f"{parent}.{src.method}()"
    if isinstance(src, SizeSource):
        return f"{parent}.size({src.dim})"
    if isinstance(src, StrideSource):
        return f"{parent}.stride({src.dim})"
    if isinstance(src, StorageOffsetSource):
        return f"{parent}.storage_offset()"
    if isinstance(src, TypeSource):
        return f"type({parent})"
    if isinstance(src, LenSource):
        return f"len({parent})"
    if isinstance(src, KeysSource):
        return f"list({parent}.keys())"
    if isinstance(src, FlattenSource):
        return f"{parent}.__tensor_flatten__()[{src.index}]"
    raise TypeError(f"no code generation for source {type(src).__name__} ({src})")


def strip_locals(text: str) -> str:
    """Drop dynamo's ``L['x']`` scoping to ``x``, as its recompile reasons print names."""
    import re

    return re.sub(r"L\['([A-Za-z_][A-Za-z0-9_]*)'\]", r"\1", text)


# Re-exported for the rest of the package, so modules import sources from one place.
__all__ += ["ROOT", "InnerSource", "ItemSource", "SizeSource", "StrideSource", "StorageOffsetSource", "Source"]
