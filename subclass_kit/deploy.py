"""Deploying models that hold kit subclasses: ``torch.export`` and AOTInductor packages.

Export works with wrapped parameters as they are and after torch's
``unwrap_tensor_subclass_parameters`` (the kit records wrappers built during export's
tracing, see ``pre_dispatch.py``). AOTInductor compiles a package whose inputs and outputs
are plain tensors: subclass parameters and intermediates are lowered to their inner
tensors, but an *output* that is a subclass cannot be returned. :func:`aoti_package`
checks that before the (slow) compile and names the way out; :func:`plain_outputs` is that
way out for a whole module.
"""

from __future__ import annotations

from typing import Any, Callable

import inspect

import torch

from . import _compat
from .base import WrapperTensor
from .errors import SubclassOutputError

__all__ = ["plain_outputs", "check_plain_outputs", "aoti_package", "load_package"]


def _plain(x):
    # isinstance first: under strict export dynamo answers it right, while hasattr() and
    # is_traceable_wrapper_subclass() on a traced subclass value say False.
    if isinstance(x, WrapperTensor) and "to_plain" in dir(type(x)):
        return x.to_plain()
    if not isinstance(x, torch.Tensor) or not _compat.is_traceable_wrapper_subclass(x):
        return x
    if hasattr(x, "to_plain"):
        return x.to_plain()
    raise SubclassOutputError(
        f"plain_outputs: the output is a {type(x).__qualname__}, which has no to_plain(); "
        f"define `def to_plain(self)` on {type(x).__qualname__} returning the dense tensor."
    )


class _PlainOutputs(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

        def forward(*args, **kwargs):
            from .pytree import tree_map

            return tree_map(_plain, module(*args, **kwargs))

        # The wrapped forward's signature, so export binds inputs and dynamic_shapes
        # exactly as for the module itself.
        forward.__signature__ = inspect.signature(module.forward)  # type: ignore[attr-defined]  # read by export
        self.forward = forward


def plain_outputs(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every subclass output replaced by its ``to_plain()``.

    For a model whose forward returns a wrapper (TwoTensor's ops return TwoTensors), so that
    it can be AOT-compiled. A ``ShardedTensor``'s ``to_plain()`` is its full tensor (a
    collective); return ``out.to_local()`` from forward instead to keep each rank's shard.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> lin = torch.nn.Linear(2, 2, bias=False)
        >>> lin.weight = torch.nn.Parameter(TwoTensor(torch.eye(2), torch.zeros(2, 2)))
        >>> type(plain_outputs(lin)(torch.ones(1, 2))).__name__
        'Tensor'
    """
    return _PlainOutputs(module)


def _fix_for(cls) -> str:
    name = cls.__qualname__
    if hasattr(cls, "to_local"):
        how = "return out.to_local() (this rank's shard) or out.full_tensor() from forward"
    elif hasattr(cls, "to_plain"):
        how = "return out.to_plain() from forward"
    else:
        how = f"define to_plain() on {name} and return out.to_plain() from forward"
    return f"{how}, or export subclass_kit.deploy.plain_outputs(module) instead of the module"


def check_plain_outputs(ep: torch.export.ExportedProgram) -> None:
    """Raise :class:`~subclass_kit.SubclassOutputError` if an output of the exported
    program is a tensor subclass (which an AOTInductor package cannot return).

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> lin = torch.nn.Linear(2, 2, bias=False)
        >>> lin.weight = torch.nn.Parameter(TwoTensor(torch.eye(2), torch.zeros(2, 2)))
        >>> ep = torch.export.export(lin, (torch.ones(1, 2),))
        >>> check_plain_outputs(ep)
        Traceback (most recent call last):
        ...
        subclass_kit.errors.SubclassOutputError: output 0 of the exported program is a TwoTensor ...
    """
    (out_node,) = [n for n in ep.graph.nodes if n.op == "output"]
    outs = out_node.args[0]
    for i, node in enumerate(outs if isinstance(outs, (list, tuple)) else [outs]):
        val = getattr(node, "meta", {}).get("val")
        if isinstance(val, torch.Tensor) and _compat.is_traceable_wrapper_subclass(val):
            cls = type(val)
            raise SubclassOutputError(
                f"output {i} of the exported program is a {cls.__qualname__} (a tensor "
                "subclass); an AOTInductor package returns plain tensors only. Fix: "
                f"{_fix_for(cls)}."
            )


def aoti_package(ep: torch.export.ExportedProgram, package_path: str, *, inductor_configs: dict | None = None) -> str:
    """Compile an ``ExportedProgram`` into an AOTInductor package; returns its path.

    Checks the outputs first (:func:`check_plain_outputs`), so a subclass output fails in
    milliseconds with the fix instead of deep inside the compile. Load the package with
    :func:`load_package` (in any process; the kit need not be imported there unless the
    model's inputs are kit subclasses).
    """
    check_plain_outputs(ep)
    return _compat.aoti_compile_and_package(ep, package_path, inductor_configs)


def load_package(path: str) -> Callable[..., Any]:
    """Load an AOTInductor package (``torch._inductor.aoti_load_package``); callable."""
    return _compat.aoti_load_package(path)
