"""The private torch names subclass_kit.collectives relies on, in one place.

When torch moves one of these, only this module changes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = [
    "raw_op",
    "is_pure_view",
    "writes_an_argument",
    "funcol_ops",
    "wait_op",
    "find_group_by_ranks",
    "resolve_group_name",
    "work_registry_size",
    "tracing_into_graph",
    "in_fake_or_proxy_mode",
    "FunctionalTensor",
    "WeakTensorKeyDictionary",
]

funcol_ops = torch.ops._c10d_functional
# Importing torch's module registers the Meta kernels of the native ops and marks
# wait_tensor side-effectful for FX's dead-code elimination (has_side_effect); the
# in-graph wait of an AsyncCollectiveTensor input relies on the latter.
import torch.distributed._functional_collectives  # noqa: E402,F401

wait_op = funcol_ops.wait_tensor.default

from torch._subclasses.functional_tensor import FunctionalTensor  # noqa: E402

_PROXY = torch._C._TorchDispatchModeKey.PROXY
_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode


def tracing_into_graph() -> bool:
    """True while make_fx/AOTAutograd records ops into a graph (a proxy mode is active)."""
    return _get_mode(_PROXY) is not None


def in_fake_or_proxy_mode() -> bool:
    """True under a fake, functional or proxy dispatch mode (any tracing below dynamo)."""
    return _get_mode(_PROXY) is not None or _get_mode(_FAKE) is not None or _get_mode(_FUNCTIONAL) is not None


def find_group_by_ranks(ranks: list) -> "dist.ProcessGroup | None":
    """The existing group whose ranks are exactly ``ranks`` (any order), or None."""
    return c10d._find_pg_by_ranks_and_tag("", list(ranks))


def resolve_group_name(name: str) -> "dist.ProcessGroup":
    """The ProcessGroup registered under ``name`` (raises if there is none)."""
    return c10d._resolve_process_group(name)


def work_registry_size() -> int:
    """How many collectives issued by this process have not been waited on."""
    return torch._C._distributed_c10d._get_work_registry_size()


def raw_op(func):
    """The C++ callable behind an OpOverload (calling it skips OpOverload.__call__)."""
    return getattr(func, "_op", func)


def is_pure_view(func) -> bool:
    """True for an aten view op that always returns a view of its first argument.

    CompositeImplicitAutograd "views" (reshape, flatten, ...) may copy instead; a copy of a
    pending collective buffer would read it before the wait (pytorch#133421), so those do
    not count. They reach a __torch_dispatch__ only under unusual dispatch anyway.
    """
    if not isinstance(func, torch._ops.OpOverload) or not func.is_view:
        return False
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
        return False
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and not args[0].alias_info.is_write


def writes_an_argument(func) -> bool:
    """True for in-place and out= ops (an argument is written)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)

from torch.utils.weak import WeakTensorKeyDictionary  # noqa: E402  (identity-keyed, weak)
