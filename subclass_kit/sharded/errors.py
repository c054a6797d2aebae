"""Errors raised by subclass_kit.sharded. Each also subclasses the matching builtin, so
callers can catch either ``PlacementError`` or ``ValueError``."""

from __future__ import annotations

from ..errors import SubclassKitError, UnsupportedOpError

__all__ = ["PlacementError", "ShardShapeError", "ShapeStrideError", "ShardMetadataError", "MeshError",
           "ParallelizeError", "UnsupportedOpError"]


class PlacementError(SubclassKitError, ValueError):
    """Placements that do not fit the tensor or the mesh (wrong count, dim out of range)."""


class ShardShapeError(SubclassKitError, ValueError):
    """A local shard's shape contradicts the global shape and placements it is said to have."""


class ShapeStrideError(ShardShapeError, RuntimeError):
    """``from_local`` got a global ``shape=`` without its ``stride=`` or the reverse (torch
    raises a RuntimeError there; this is both)."""


class ShardMetadataError(ShardShapeError):
    """``from_local(run_check=True)``: the ranks' shards differ in dtype or requires_grad."""


class MeshError(SubclassKitError, ValueError):
    """A mesh that cannot be used: this rank is not in it, or tensors on different meshes meet."""


class ParallelizeError(SubclassKitError, ValueError):
    """A ``parallelize`` plan names a submodule that does not exist or cannot take the style."""
