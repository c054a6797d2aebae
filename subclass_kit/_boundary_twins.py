"""The module a compiled body calls: the user's module with its wrapper parameters rebuilt
from plain tensors, without one write to the user's module.

``functional_call`` swaps parameters into the module and back, so dynamo replays the restore
on every call (each owner's ``_parameters`` cleared and refilled) and guards the original
wrappers it restores (a metadata check that flattens each one): per call, work and guards for
every wrapper parameter. A *twin* instead shares its module's ``__dict__`` (its parameters,
buffers, hooks, ``training``: everything stays live) and only differs in its class: a
subclass with a property per wrapper parameter (rebuilding it from the boundary's holder of
plain tensors inside the trace) and per child on the way to one (its twin). Nothing is
mutated, so dynamo's dict-tag check skips the unchanged dicts, and no original wrapper is
ever read in the trace.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["twin_of"]


def _child_getter(twin: torch.nn.Module) -> property:
    return property(lambda self: twin)


def _modules_getter(orig: dict, twins: dict) -> property:
    # Live over the original dict (children added later are seen); a twinned child only
    # while it is still the child it twins (the boundary re-plans when it is replaced).
    def _modules(self):
        return {k: twins[k][1] if k in twins and v is twins[k][0] else v for k, v in orig.items()}

    return property(_modules)


def twin_of(module: torch.nn.Module, getters: dict) -> tuple[torch.nn.Module, list]:
    """``(twin of module, edges)``: ``getters`` maps ``(owner module, attr)`` to a function
    ``get(self)`` returning the wrapper parameter rebuilt; ``edges`` lists ``(parent's
    _modules, name, child)`` on the way to each owner, for the boundary's identity check."""
    owners: dict = {}
    for (owner, attr), get in getters.items():
        owners.setdefault(owner, {})[attr] = get
    edges: list = []

    def visit(m: torch.nn.Module) -> torch.nn.Module | None:
        kids = {}
        for name, child in m._modules.items():
            if child is None:
                continue
            tw = visit(child)
            if tw is not None:
                kids[name] = (child, tw)
                edges.append((m._modules, name, child))
        own = owners.get(m)
        if not kids and not own:
            return None
        attrs: dict[str, Any] = {name: property(get) for name, get in (own or {}).items()}
        for name, (_, tw) in kids.items():
            attrs[name] = _child_getter(tw)
        if kids:
            attrs["_modules"] = _modules_getter(m._modules, kids)
        cls = type(m)
        twin_cls: Callable = type(cls.__name__, (cls,), attrs)
        twin = object.__new__(twin_cls)  # type: ignore[arg-type]
        object.__setattr__(twin, "__dict__", m.__dict__)
        return twin

    root = visit(module)
    return (module if root is None else root), edges
