"""Turn dynamo's recompile reasons into lines that name a field, its old and its new value.

dynamo 2.13 reports a wrapper's ctx change only as ``___check_metadata_<id>_c0/1`` and a
DTensor spec change as ``__dtensor_spec_<id>``: the name of a closure, not of what changed.
The cache entry that failed still holds its guard tree, so we find the guard manager whose
leaf carries that name, read its source (``L['x'].a``), and compare the ctx (or spec)
recorded when that entry was compiled with the one in the new input.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable

import torch

from . import _compat
from ._kinds import ctx_diff, spec_diff
from ._sources import ArgSource, AttrSource, InnerSource, ItemSource, Source

__all__ = ["snapshot", "translate", "split_reason"]

_OPAQUE = re.compile(r"(___check_metadata_\d+_c[\w/]+|__dtensor_spec_\d+)")


def _wrapped(v: Any, src: Source, out: dict, render: Callable[[Source], str]) -> None:
    if isinstance(v, torch.Tensor):
        if _compat.is_dtensor(v):
            out[render(AttrSource(src, "_spec"))] = ("spec", src, copy.deepcopy(_compat.dtensor_spec(v)))
            _wrapped(_compat.dtensor_local(v), InnerSource("_local_tensor", src), out, render)
        elif _compat.is_traceable_wrapper_subclass(v):
            names, ctx = v.__tensor_flatten__()
            out[render(src)] = ("ctx", src, copy.deepcopy(ctx))
            for n in names:
                _wrapped(getattr(v, n), InnerSource(n, src), out, render)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _wrapped(x, ItemSource(i, src), out, render)
    elif isinstance(v, dict):
        for k, x in v.items():
            _wrapped(x, ItemSource(k, src), out, render)


def snapshot(args, names, render) -> dict:
    """``{rendered source: (kind, source, ctx-or-spec copy)}`` for every wrapper in ``args``."""
    out: dict = {}
    for i, (a, n) in enumerate(zip(args, names)):
        _wrapped(a, ArgSource(i, n), out, render)
    return out


def split_reason(raw: str) -> tuple[str, str]:
    """``("0/1", "<guard code>")`` from a raw reason, dropping comments and stack traces."""
    first = raw.split("\n", 1)[0]
    cid, _, rest = first.partition(": ")
    code = re.split(r"\s{2,}#\s", rest, maxsplit=1)[0].rstrip()
    return cid.strip(), code


def translate(raw: str, entries: list, snapshots: dict, new_args, names, render) -> str:
    """A readable form of one dynamo reason; opaque ctx/spec names become field diffs."""
    cid, code = split_reason(raw)
    m = _OPAQUE.search(code)
    if not m:
        return f"{cid}: {code}"
    token = m.group(1)
    entry = next((e for e in entries if _compat.compile_id_str(e) == cid), None)
    old = snapshots.get(cid)
    if entry is None or old is None:
        return f"{cid}: {code}"
    where = None
    for src_name, parts in _compat.walk_guard_tree(entry):
        if any(token in p for p in parts):
            where = src_name
            break
    if where is None or where not in old:
        return f"{cid}: {code}"
    kind, src, before = old[where]
    now = snapshot(new_args, names, render).get(where)
    if now is None:
        return f"{cid}: {where} is no longer a wrapped tensor ({code})"
    after = now[2]
    lines = ctx_diff(render, src, before, after) if kind == "ctx" else spec_diff(render, AttrSource(src, "_spec"), before, after)
    return f"{cid}: " + "; ".join(lines) + f" [dynamo: {token}]"
