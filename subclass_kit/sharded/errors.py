"""Errors raised by subclass_kit.sharded. Each also subclasses the matching builtin, so
callers can catch either ``PlacementError`` or ``ValueError``."""

from __future__ import annotations

from ..errors import SubclassKitError, UnsupportedOpError

__all__ = ["PlacementError", "ShardShapeError", "MeshError", "ParallelizeError", "UnsupportedOpError"]


class PlacementError(SubclassKitError, ValueError):
    """Placements that do not fit the tensor or the mesh (wrong count, dim out of range)."""


class ShardShapeError(SubclassKitError, ValueError):
    """A local shard's shape contradicts the global shape and placements it is said to have."""


class MeshError(SubclassKitError, ValueError):
    """A mesh that cannot be used: this rank is not in it, or tensors on different meshes meet."""


class ParallelizeError(SubclassKitError, ValueError):
    """A ``parallelize`` plan names a submodule that does not exist or cannot take the style."""
