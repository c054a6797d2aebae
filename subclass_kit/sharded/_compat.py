"""The private torch names subclass_kit.sharded relies on, in one place.

When torch moves one of these, only this module changes.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["meta_mode", "resolve_group_name", "is_symbolic", "allow_in_graph", "POINTWISE_TAG"]

POINTWISE_TAG = torch.Tag.pointwise
allow_in_graph = torch._dynamo.allow_in_graph


def resolve_group_name(name: str):
    """The ProcessGroup registered under ``name`` (raises if there is none)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


_FAKE_MODE = None


@contextlib.contextmanager
def meta_mode():
    """A fake mode to compute an op's global output metadata in, never recorded in a graph.

    Reuses the fake mode of the trace in progress (so symbolic sizes stay in its shape env),
    else one module-level mode; proxy tracing is off so nothing lands in the graph.
    """
    global _FAKE_MODE
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    mode = detect_fake_mode()
    if mode is None:
        if _FAKE_MODE is None:
            _FAKE_MODE = FakeTensorMode()
        mode = _FAKE_MODE
    with mode, disable_proxy_modes_tracing():
        yield mode


def is_symbolic(x) -> bool:
    """True for a SymInt/SymFloat/SymBool (a size that is not a plain int)."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))

sym_check = torch._check
