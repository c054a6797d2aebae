"""Errors raised by subclass_kit.collectives. Each also subclasses the matching builtin."""

from __future__ import annotations

from ..errors import SubclassKitError

__all__ = ["NoProcessGroupError", "GroupResolutionError", "CollectiveError", "CollectiveArgumentError"]


class NoProcessGroupError(SubclassKitError, RuntimeError):
    """A collective was called before ``torch.distributed.init_process_group``."""


class GroupResolutionError(SubclassKitError, ValueError):
    """``group=`` names no process group this rank can use."""


class CollectiveArgumentError(SubclassKitError, ValueError):
    """A collective's arguments do not fit the group (reduce op, sizes, splits, src)."""


class CollectiveError(SubclassKitError, RuntimeError):
    """A collective did not complete (a peer died or the process group timed out)."""
