"""``distribute_module``: torch's module-level entry point (parameters laid out by a
``partition_fn``, the rest replicated; inputs and outputs converted by hooks)."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

from torch import nn

from .convert import distribute
from .placements import Replicate
from .errors import MeshError
from .mesh import current_mesh
from .tensor import ShardedTensor

__all__ = ["distribute_module"]


def _replicate_rest(m: nn.Module, mesh) -> None:
    full = [Replicate()] * mesh.ndim
    for key, p in m._parameters.items():
        if p is not None and not isinstance(p, ShardedTensor):
            m.register_parameter(key, nn.Parameter(distribute(p.data, mesh, full), requires_grad=p.requires_grad))
    for key, b in m._buffers.items():
        if b is not None and not isinstance(b, ShardedTensor):
            m._buffers[key] = distribute(b, mesh, full)


def _hook_arity(fn: Callable, what: str) -> int:
    n = len(inspect.signature(fn).parameters)
    if n == 2:
        warnings.warn(
            f"distribute_module: a {what} that takes two arguments ({'inputs' if what == 'input_fn' else 'outputs'}, "
            f"device_mesh) is deprecated (as in torch); take (module, {'inputs' if what == 'input_fn' else 'outputs'}, "
            "device_mesh).", FutureWarning, stacklevel=3)
    elif n != 3:
        raise ValueError(
            f"distribute_module: {what} takes {n} arguments; it must take (module, "
            f"{'inputs' if what == 'input_fn' else 'outputs'}, device_mesh) (or, deprecated, the last two)."
        )
    return n


def distribute_module(
    module: nn.Module,
    device_mesh: Any = None,
    partition_fn: Callable[[str, nn.Module, Any], None] | None = None,
    input_fn: Callable[..., Any] | None = None,
    output_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """Lay a module's parameters out over a mesh, as ``torch.distributed.tensor.distribute_module``.

    ``partition_fn(name, submodule, mesh)`` is called on every submodule (to make chosen
    parameters ShardedTensors); the parameters and buffers it leaves plain are then replicated
    (``distribute(t, mesh, [Replicate()] * ndim)``). ``input_fn(module, inputs, mesh)`` and
    ``output_fn(module, outputs, mesh)`` become a forward pre-hook and a forward hook on
    ``module``; what they return replaces the inputs/outputs.

    Args:
        module: the module (changed in place and returned).
        device_mesh: the mesh; None: the innermost ``with mesh:`` block's.
        partition_fn, input_fn, output_fn: as above; each optional.

    Returns:
        ``module``.

    Raises:
        RuntimeError: ``distribute_module`` was already applied to ``module`` (as torch).
        ValueError: an ``input_fn``/``output_fn`` that does not take 3 (or 2) arguments.
        MeshError: no mesh given outside a ``with mesh:`` block.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import distribute, distribute_module, Shard, MeshRef
        >>> def shard_rows(name, m, mesh):
        ...     if isinstance(m, torch.nn.Linear):
        ...         m.weight = torch.nn.Parameter(distribute(m.weight.data, mesh, [Shard(0)]))
        >>> lin = distribute_module(torch.nn.Linear(3, 4), MeshRef.local(), shard_rows)
        >>> lin.weight.placements, lin.bias.placements
        ((Shard(0),), (Replicate(),))
    """
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError(
            f"distribute_module({type(module).__name__}): already applied to this module; call it once "
            "per module (as torch's distribute_module)."
        )
    if device_mesh is None:
        device_mesh = current_mesh()
        if device_mesh is None:
            raise MeshError(
                f"distribute_module({type(module).__name__}): no mesh given and no `with mesh:` block is "
                "active; pass the DeviceMesh or call inside `with mesh:`."
            )
    for name, sub in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, sub, device_mesh)
        _replicate_rest(sub, device_mesh)
    mesh = device_mesh
    if input_fn is not None:
        fn_in = input_fn
        if _hook_arity(fn_in, "input_fn") == 2:
            module.register_forward_pre_hook(lambda _, inputs: fn_in(inputs, mesh))  # type: ignore[misc]
        else:
            module.register_forward_pre_hook(lambda mod, inputs: fn_in(mod, inputs, mesh))  # type: ignore[misc]
    if output_fn is not None:
        fn_out = output_fn
        if _hook_arity(fn_out, "output_fn") == 2:
            module.register_forward_hook(lambda _, inputs, outputs: fn_out(outputs, mesh))  # type: ignore[misc]
        else:
            module.register_forward_hook(lambda mod, inputs, outputs: fn_out(mod, outputs, mesh))  # type: ignore[misc]
    module._distribute_module_applied = True  # type: ignore[assignment]
    return module
