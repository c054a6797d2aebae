"""``collective_errors(fn)``: a collective that fails inside a compiled function raises
``CollectiveError``, as it does in eager.

In eager the kit waits every collective itself and turns a failure into ``CollectiveError``.
Inside a compiled (or precompiled and loaded) function the waits are torch's
``wait_tensor`` nodes: the kit's code does not run there, and a dead peer surfaces as the
process group's own ``RuntimeError`` (gloo's "Connection closed by peer", a timeout). The
call itself is the one place the kit can see it, so this wraps the call.
"""

from __future__ import annotations

import functools
from typing import Callable, ParamSpec, TypeVar

import torch

from ..errors import SubclassKitError
from .act import AsyncCollectiveTensor
from .errors import CollectiveError

__all__ = ["collective_errors"]

# How torch's process groups report a collective that cannot complete: c10d's DistError
# family (NCCL and others), and gloo's plain RuntimeErrors, which carry its source path.
_GLOO = "/gloo/"


def _is_collective_failure(e: RuntimeError) -> bool:
    if isinstance(e, SubclassKitError):
        return False
    dist_error = getattr(torch.distributed, "DistError", None)
    return (dist_error is not None and isinstance(e, dist_error)) or _GLOO in str(e)


def _pending_inputs(args, kwargs) -> list:
    from ..pytree import tree_leaves

    return [
        a._pending
        for a in tree_leaves((args, kwargs))
        if type(a) is AsyncCollectiveTensor and a._pending is not None and not a._pending.done
    ]


P = ParamSpec("P")
R = TypeVar("R")


def collective_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` (a compiled or loaded function) with collective failures raised as
    :class:`CollectiveError`, naming ``fn`` and the process group's own message.

    Any other exception passes through unchanged. A pending ``AsyncCollectiveTensor``
    passed to a call that failed is marked failed: the compiled graph consumed its wait, so
    without this a later use would read its buffer as if the collective had completed.

    Args:
        fn: any callable, typically ``torch.compile(f)`` or what
            ``torch.compiler.load_compiled_function`` returned.

    Returns:
        A callable with ``fn``'s signature.

    Example:
        >>> import torch
        >>> step = collective_errors(torch.compile(lambda x: x + 1, backend="eager"))
        >>> step(torch.zeros(2))
        tensor([1., 1.])
    """
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            if not _is_collective_failure(e):
                raise
            err = CollectiveError(
                f"a collective inside {name} did not complete: {e}. Another rank may have exited "
                "or may not have issued the same collective; the wait is bounded by the process "
                "group's timeout (init_process_group(timeout=...))."
            )
            for pending in _pending_inputs(args, kwargs):
                # The same state a failed eager wait leaves: every later use re-raises.
                pending.done, pending.error, pending.tensor = True, err, None
            raise err from e

    return call
