"""``sources(t, name=)``: every size, stride and storage offset reachable in a tensor.

The source classes themselves live in ``source_types`` and are re-exported by the
``symbolic`` facade. A source is relative to a root value and converts to torch's own
``Source`` with ``to_torch()``. ``SizeSource(InnerSource("scale"), 0)(t)`` returns
``t.scale.size(0)``; ``.name`` (a string, as torch's) renders it the way dynamo's guards name it,
``L['x'].scale.size()[0]``. Guards, explanations and error messages print rendered
sources, never ad-hoc strings, so that what the kit says can be matched against what
dynamo says.
"""

from __future__ import annotations

from typing import Any

from .source_types import ROOT, Root, SizeSource, Source, StorageOffsetSource, StrideSource, ViewBaseSource
from .protocol import walk

__all__ = ["sources"]


def sources(t: Any, name: str = "x") -> dict[str, Source]:
    """Every size, stride and storage offset reachable in ``t``, keyed as dynamo names them.

    The outer tensor first, then each inner tensor in ``__tensor_flatten__`` order,
    recursively; per tensor its sizes, strides and storage offset, and those of its
    ``_base`` when it is a view (dynamo guards on view bases too). Keys are the rendered
    names (``L['x'].scale.size()[0]``), values the sources that fetch them; each value's
    ``name()`` is its key.

    Example:
        >>> import torch
        >>> list(sources(torch.ones(2, 3)))
        ["L['x'].size()[0]", "L['x'].size()[1]", "L['x'].stride()[0]", "L['x'].stride()[1]", "L['x'].storage_offset()"]
    """
    out: dict[str, Source] = {}

    # The values carry the root's name, so their name() and to_torch() render it.
    base = ROOT if name == "x" else Root(name)
    root_expr = f"L[{name!r}]"

    def add(src: Source, tensor: Any) -> None:
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

