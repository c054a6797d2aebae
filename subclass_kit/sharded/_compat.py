"""The private torch names subclass_kit.sharded relies on, in one place.

When torch moves one of these, only this module changes.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["meta_mode", "resolve_group_name", "is_symbolic", "allow_in_graph", "POINTWISE_TAG", "register_compile_constants", "real_tensors", "register_mesh_member"]

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


def tracing_symbolically() -> bool:
    """True while a proxy trace (make_fx / AOTAutograd) records the graph."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode() is not None


def is_symbolic(x) -> bool:
    """True for a SymInt/SymFloat/SymBool (a size that is not a plain int)."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))

sym_check = torch._check


def register_compile_constants(members: dict) -> None:
    """Let dynamo treat instances of each class as compile-time constants guarded by value
    (``==``), as torch registers DTensor's placements: reading them from an intermediate
    inside ``torch.compile(fullgraph=True)`` traces without a graph break.

    ``members``: ``{cls: names}``, the attributes and methods dynamo may evaluate on the
    real object at trace time (the result is baked into the graph as a constant). Each
    class needs ``__eq__``, ``__hash__`` and ``__fx_repr__``.
    """
    from torch._library.opaque_object import MemberType, is_opaque_type, register_opaque_type

    for cls, names in members.items():
        if not is_opaque_type(cls):
            register_opaque_type(cls, typ="value", members={n: MemberType.USE_REAL for n in names})


def real_tensors():
    """A context in which real tensors compute (the fake mode of a trace in progress is
    suspended): for metadata held in real tensors, like a DeviceMesh's rank map."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def register_mesh_member(name: str, fn) -> None:
    """Give torch's ``DeviceMesh`` a method ``name`` (``fn(mesh)``) that dynamo evaluates on
    the real mesh at trace time and bakes in as a constant.

    torch registers DeviceMesh with dynamo as an opaque reference type guarded by value
    (its rank map, layout, device type and dim names), listing the members dynamo may read;
    a function of the mesh that dynamo calls as a constant function instead would guard on
    the mesh's identity, so every new but equal mesh would recompile. Adding our member to
    that list keeps torch's value guard.
    """
    from torch._library.opaque_object import _OPAQUE_TYPES, MemberType
    from torch.distributed.device_mesh import DeviceMesh, _register_distributed_opaque_types

    _register_distributed_opaque_types()
    setattr(DeviceMesh, name, fn)
    _OPAQUE_TYPES[DeviceMesh].members[name] = MemberType.USE_REAL
