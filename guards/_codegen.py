"""Turns a list of guards into the source of one Python function, compiled once.

The generated function binds every value it needs to a local the first time it is
reached (``_v3 = _v1.scale``, ``_s3 = _v3.size()``), so each attribute is read once per
call, and returns False at the first failing check. A value of the wrong structure makes an
access raise; the whole body runs under ``try`` so that is a plain ``False`` too.
"""

from __future__ import annotations

import functools
from typing import Any

from ._sources import (
    ArgSource,
    FlattenSource,
    Root,
    SizeSource,
    Source,
    StorageOffsetSource,
    StrideSource,
    base_of,
    codegen_step,
)

__all__ = ["CodeGen"]


class CodeGen:
    """Accumulates bindings, constants and checks for one generated function."""

    def __init__(self, fn_name: str = "check"):
        self.fn_name = fn_name
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self._const_ids: dict[int, str] = {}
        self._vars: dict[Any, str] = {}
        self._n = 0

    # -- names -------------------------------------------------------------------------
    def const(self, obj: Any, hint: str = "k") -> str:
        """A global name bound to ``obj`` in the generated function's namespace."""
        key = id(obj)
        if key in self._const_ids and self.consts[self._const_ids[key]] is obj:
            return self._const_ids[key]
        name = f"_{hint}{len(self.consts)}"
        self.consts[name] = obj
        self._const_ids[key] = name
        return name

    def _bind(self, key, expr: str, prefix: str) -> str:
        if key in self._vars:
            return self._vars[key]
        name = f"_{prefix}{self._n}"
        self._n += 1
        self.lines.append(f"{name} = {expr}")
        self._vars[key] = name
        return name

    def var(self, src: Source) -> str:
        """A local holding the value at ``src`` (bound on first use)."""
        if isinstance(src, Root):
            return "R"
        if isinstance(src, ArgSource):
            return self._bind(src, f"R[{src.index}]", "v")
        if isinstance(src, SizeSource):
            return f"{self.sizes(src.base)}[{src.dim}]"
        if isinstance(src, StrideSource):
            return f"{self.strides(src.base)}[{src.dim}]"
        if isinstance(src, StorageOffsetSource):
            return self._bind(src, f"{self.var(src.base)}.storage_offset()", "o")
        if isinstance(src, FlattenSource):
            return f"{self.flat(src.base)}[{src.index}]"
        parent = base_of(src)
        assert parent is not None, src  # every root kind is handled above
        return self._bind(src, codegen_step(src, self.var(parent)), "v")

    def sizes(self, tensor_src: Source) -> str:
        return self._bind(("size", tensor_src), f"{self.var(tensor_src)}.size()", "s")

    def strides(self, tensor_src: Source) -> str:
        return self._bind(("stride", tensor_src), f"{self.var(tensor_src)}.stride()", "t")

    def flat(self, wrapper_src: Source) -> str:
        return self._bind(("flat", wrapper_src), f"{self.var(wrapper_src)}.__tensor_flatten__()", "f")

    def bind(self, key, expr: str, prefix: str = "b") -> str:
        """Bind an arbitrary expression once under ``key``."""
        return self._bind(key, expr, prefix)

    # -- checks ------------------------------------------------------------------------
    def check(self, expr: str, comment: str = "") -> None:
        """Emit ``if not (expr): return False``."""
        c = f"  # {comment}" if comment else ""
        self.lines.append(f"if not ({expr}):{c}")
        self.lines.append("    return False")

    def source(self) -> str:
        body = ["try:"]
        body += ["    " + ln for ln in self.lines]
        body += ["    return True", "except Exception:", "    return False"]
        return f"def {self.fn_name}(R):\n" + "\n".join("    " + ln for ln in body) + "\n"

    def compile(self):
        """``(function, source)``: the source compiled once, with its constants as globals."""
        src = self.source()
        ns: dict[str, Any] = dict(self.consts)
        ns["__builtins__"] = __builtins__
        exec(_compiled(src, self.fn_name), ns)
        return ns[self.fn_name], src


@functools.lru_cache(maxsize=512)
def _compiled(src: str, fn_name: str):
    """The code object of ``src``. Inputs of one structure generate the same text (values
    live in the constants), so rebuilding their guards skips Python's compiler."""
    return compile(src, f"<guards:{fn_name}>", "exec")
