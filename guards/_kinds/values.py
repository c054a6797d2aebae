"""Guards on containers and non-tensor leaves: type, length, keys, value, NaN."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .._canonical import canonical, type_name
from .._sources import (
    KeysSource,
    LenSource,
    Source,
    TypeSource,
)
from .base import Guard, fmt, line

__all__ = ["TypeMatch", "LenMatch", "KeysMatch", "ValueMatch", "NotNan"]


@dataclasses.dataclass(frozen=True)
class TypeMatch(Guard):
    """``type(v) is cls`` (exact type identity, as dynamo's TYPE_MATCH)."""

    source: Source
    cls: type
    structural: bool = True
    kind = "type"

    def emit(self, cg):
        cg.check(f"type({cg.var(self.source)}) is {cg.const(self.cls, 'T')}")

    def failures(self, root, r):
        got = type(self.source(root))
        return [] if got is self.cls else [line(r, TypeSource(self.source), fmt(self.cls), fmt(got))]

    def describe(self, r):
        return f"type({r(self.source)}) is {type_name(self.cls)}"

    def canonical(self, r):
        return ["type", r(self.source), type_name(self.cls)]


@dataclasses.dataclass(frozen=True)
class LenMatch(Guard):
    """``len(v) == n`` for a list or tuple."""

    source: Source
    n: int
    structural = True
    kind = "len"

    def emit(self, cg):
        cg.check(f"len({cg.var(self.source)}) == {self.n}")

    def failures(self, root, r):
        got = len(self.source(root))
        return [] if got == self.n else [line(r, LenSource(self.source), str(self.n), str(got))]

    def describe(self, r):
        return f"len({r(self.source)}) == {self.n}"

    def canonical(self, r):
        return ["len", r(self.source), self.n]


@dataclasses.dataclass(frozen=True)
class KeysMatch(Guard):
    """``list(d) == keys`` for a dict (order included, as dynamo's DICT_KEYS_MATCH)."""

    source: Source
    keys: tuple
    structural = True
    kind = "keys"

    def emit(self, cg):
        cg.check(f"list({cg.var(self.source)}) == {cg.const(list(self.keys), 'K')}")

    def failures(self, root, r):
        got = list(self.source(root))
        return [] if got == list(self.keys) else [line(r, KeysSource(self.source), fmt(list(self.keys)), fmt(got))]

    def describe(self, r):
        return f"list({r(self.source)}.keys()) == {list(self.keys)!r}"

    def canonical(self, r):
        return ["keys", r(self.source), [canonical(k) for k in self.keys]]


@dataclasses.dataclass(frozen=True)
class ValueMatch(Guard):
    """A non-tensor leaf guarded by value: ``type(v) is T and v == value`` (NaN: ``v != v``)."""

    source: Source
    value: Any
    kind = "value"

    def _is_nan(self):
        return isinstance(self.value, float) and math.isnan(self.value)

    def emit(self, cg):
        v = cg.var(self.source)
        if self.value is None:
            cg.check(f"{v} is None")
        elif self._is_nan():
            cg.check(f"type({v}) is float and {v} != {v}")
        else:
            cg.check(f"type({v}) is {cg.const(type(self.value), 'T')} and {v} == {cg.const(self.value, 'c')}")

    def _ok(self, got):
        if self.value is None:
            return got is None
        if type(got) is not type(self.value):
            return False
        if self._is_nan():
            return got != got
        return bool(got == self.value)

    def failures(self, root, r):
        got = self.source(root)
        if self._ok(got):
            return []
        exp = fmt(self.value) if self.value is None else f"{fmt(self.value)} ({type(self.value).__name__})"
        act = fmt(got) if got is None else f"{fmt(got)} ({type(got).__name__})"
        return [line(r, self.source, exp, act)]

    def describe(self, r):
        return f"{r(self.source)} == {self.value!r}"

    def canonical(self, r):
        return ["value", r(self.source), canonical(self.value)]


@dataclasses.dataclass(frozen=True)
class NotNan(Guard):
    """``not isnan(v)`` for a float dynamo traces as a symbol (its NaN specialization)."""

    source: Source
    kind = "nan"

    def emit(self, cg):
        v = cg.var(self.source)
        cg.check(f"{v} == {v}")

    def failures(self, root, r):
        got = self.source(root)
        return [] if got == got else [line(r, self.source, "not NaN", "nan")]

    def describe(self, r):
        return f"not math.isnan({r(self.source)})"

    def canonical(self, r):
        return ["notnan", r(self.source)]
