"""The aten ops a backward needs from a class, and which of them it lacks.

When a backward row fails on an op the class does not handle, the author needs the list of
every op that backward runs on the class, not only the first that failed. The forward and
backward are replayed under a dispatch mode that records each aten op called with an
instance of the class; an op the class refuses (``NotImplementedError``) is recorded as
missing and computed on ``to_plain()`` instead, so the replay goes on and finds the next.
"""

from __future__ import annotations

import torch

from .. import _compat, pytree
from .._opname import op_name

__all__ = ["backward_ops"]


class _Record(_compat.TorchDispatchMode):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls
        self.ops: list = []
        self.missing: list = []
        self.recording = False  # only the backward's ops are listed; a refusal anywhere is

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(isinstance(a, self.cls) for a in pytree.tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        name = op_name(func)
        if self.recording and name not in self.ops:
            self.ops.append(name)
        try:
            return func(*args, **kwargs)
        except NotImplementedError:
            if name not in self.missing:
                self.missing.append(name)
            if not callable(getattr(self.cls, "to_plain", None)):
                raise
            plain = pytree.tree_map_only(self.cls, lambda t: t.to_plain(), (args, kwargs))
            return func(*plain[0], **plain[1])


def backward_ops(fn, x) -> tuple:
    """``(ops, missing)``: the aten ops that the backward of ``fn(leaf)`` (seeded with
    ``ones_like``) on a leaf copy of ``x`` calls with an instance of ``type(x)``, and those
    the class refuses, forward or backward. Best effort: the replay stops at an error other
    than a refusal.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> ops, missing = backward_ops(lambda t: t * 2.0, TwoTensor(torch.ones(2), torch.ones(2)))
        >>> "aten.mul.Tensor" in ops, missing
        (True, [])
    """
    rec = _Record(type(x))
    try:
        with rec:
            leaf = x.detach().requires_grad_(True)
            out = fn(leaf)
            rec.recording = True
            g = torch.ones_like(out)
            out.backward(g)
    except Exception:
        pass
    return rec.ops, rec.missing
