"""dynamo's automatic dynamic shapes, modelled for prediction (``torch.compile(dynamic=None)``).

dynamo keeps, per compiled function and per source name, the sizes and strides it has
compiled for (torch/_dynamo/pgo.py, ``FrameStateSizeEntry``). Each compile merges the
current input in; a dim whose size differs from an earlier compile becomes dynamic from
then on, as does a dim ever marked with ``mark_dynamic``. Strides become dynamic only while
every size is static. Ints and floats follow the same rule by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUTO", "TensorEntry", "FrameState"]


class _Auto:
    def __repr__(self):
        return "AUTO"


AUTO = _Auto()  # "seen different values": dynamic from now on


def _merge(x, y):
    if x is None:
        return y
    if y is None:
        return x
    if x is AUTO or y is AUTO or x != y:
        return AUTO
    return x


def _merge_tup(xs, ys):
    if xs is None:
        return ys
    if ys is None:
        return xs
    if xs is AUTO or ys is AUTO or len(xs) != len(ys):
        return AUTO
    return tuple(_merge(a, b) for a, b in zip(xs, ys))


@dataclass
class TensorEntry:
    """Merged sizes/strides of one source across compiles (``AUTO`` where they differed)."""

    size: Any = None  # a tuple of ints and AUTO, AUTO, or None before the first compile
    stride: Any = None

    def size_dynamic(self, i: int) -> bool:
        if self.size is AUTO:
            return True
        if self.size is None:
            return False
        return self.size[i] is AUTO

    def stride_dynamic(self, i: int) -> bool:
        # dynamo only makes strides dynamic while every size is still static.
        if not (isinstance(self.size, tuple) and all(type(s) is int for s in self.size)):
            return False
        if self.stride is AUTO:
            return True
        if self.stride is None:
            return False
        return self.stride[i] is AUTO


@dataclass
class FrameState:
    """The automatic-dynamic state of one compiled function."""

    tensors: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)

    def record_tensor(self, name: str, size: tuple, stride: tuple, marked_dynamic=()) -> TensorEntry:
        """Merge a tensor being compiled; returns the entry the compile will use."""
        e = self.tensors.setdefault(name, TensorEntry())
        e.size = _merge_tup(e.size, tuple(size))
        e.stride = _merge_tup(e.stride, tuple(stride))
        for i in marked_dynamic:
            if isinstance(e.size, tuple):
                e.size = tuple(AUTO if j == i else s for j, s in enumerate(e.size))
        return e

    def record_scalar(self, name: str, value) -> bool:
        """Merge an int/float being compiled; True when it is dynamic from now on."""
        self.scalars[name] = _merge(self.scalars.get(name), value)
        return self.scalars[name] is AUTO
