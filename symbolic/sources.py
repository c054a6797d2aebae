"""Sources: small frozen values that name a place inside a (wrapped) tensor and fetch it.

Every source is one of torch's own ``Source`` types (``TensorPropertySource``,
``AttrSource``, ... from ``torch._dynamo.source``), usable wherever torch takes one; ``name``
is torch's string and is also callable with another root name. A source is relative to a
root value. ``SizeSource(InnerSource("scale"), 0)(t)`` returns
``t.scale.size(0)``; ``.name("x")`` renders it the way dynamo's guards name it,
``L['x'].scale.size()[0]``. Guards, explanations and error messages print rendered
sources, never ad-hoc strings, so that what the kit says can be matched against what
dynamo says.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ._source_types import (
    ROOT as ROOT,
    InnerSource as InnerSource,
    ItemSource as ItemSource,
    Root as Root,
    SizeSource as SizeSource,
    Source as Source,
    StorageOffsetSource as StorageOffsetSource,
    StrideSource as StrideSource,
    ViewBaseSource as ViewBaseSource,
)
from .protocol import walk

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
    out: dict[str, Source] = {}

    # The values are torch Sources too, so they carry the root's name (torch's LocalSource).
    base = ROOT if name == "x" else Root(name)
    root_expr = f"L[{name!r}]"

    def add(src: Source, tensor) -> None:
        n = tensor.dim()
        for s in [SizeSource(src, i) for i in range(n)] + [StrideSource(src, i) for i in range(n)]:
            out[s.render(root_expr)] = s
        off = StorageOffsetSource(src)
        out[off.render(root_expr)] = off

    for src, tensor in walk(t, base):
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
