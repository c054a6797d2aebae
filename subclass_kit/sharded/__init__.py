"""subclass_kit.sharded: a DTensor-like ``ShardedTensor`` on the kit's base class.

Layer: an exemplar on top of the base class (``subclass_kit.WrapperTensor``) and
``subclass_kit.collectives``; never imports ``subclass_kit.testing``/``bench``/``cli``. This
module only re-exports.

Example (one rank, no process group needed):
    >>> import torch
    >>> from subclass_kit.sharded import distribute, Shard, Replicate, MeshRef
    >>> x = distribute(torch.arange(8.).reshape(4, 2), MeshRef.local(), [Shard(0)])
    >>> (x @ torch.ones(2, 3)).full_tensor()[:, 0]
    tensor([ 1.,  5.,  9., 13.])
"""

from . import _ops  # noqa: F401  (registers the op table)
from .convert import distribute as distribute
from .factories import (
    empty as empty,
    full as full,
    ones as ones,
    rand as rand,
    randn as randn,
    zeros as zeros,
)
from .module import distribute_module as distribute_module
from .data_parallelism import MixedPrecisionPolicy as MixedPrecisionPolicy, data_parallel as data_parallel
from .errors import (
    MeshError as MeshError,
    ParallelizeError as ParallelizeError,
    PlacementError as PlacementError,
    ShapeStrideError as ShapeStrideError,
    ShardMetadataError as ShardMetadataError,
    ShardShapeError as ShardShapeError,
    UnsupportedOpError as UnsupportedOpError,
)
from .mesh import MeshRef as MeshRef, current_mesh as current_mesh, mesh_ref as mesh_ref
from .loss import (
    loss_parallel as loss_parallel,
    vocab_parallel_cross_entropy as vocab_parallel_cross_entropy,
)
from .parallel import (
    ColwiseParallel as ColwiseParallel,
    ParallelStyle as ParallelStyle,
    RowwiseParallel as RowwiseParallel,
    SequenceParallel as SequenceParallel,
    parallelize as parallelize,
)
from .prepare import (
    PrepareModuleInput as PrepareModuleInput,
    PrepareModuleInputOutput as PrepareModuleInputOutput,
    PrepareModuleOutput as PrepareModuleOutput,
)
from .placements import (
    Partial as Partial,
    Placement as Placement,
    Replicate as Replicate,
    Shard as Shard,
    _StridedShard as _StridedShard,
)
from .tensor import ShardedTensor as ShardedTensor

__all__ = [
    "ShardedTensor",
    "Shard",
    "_StridedShard",
    "Replicate",
    "Partial",
    "Placement",
    "distribute",
    "distribute_module",
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "parallelize",
    "data_parallel",
    "MixedPrecisionPolicy",
    "ColwiseParallel",
    "RowwiseParallel",
    "SequenceParallel",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "PrepareModuleInputOutput",
    "loss_parallel",
    "vocab_parallel_cross_entropy",
    "ParallelStyle",
    "MeshRef",
    "mesh_ref",
    "current_mesh",
    "PlacementError",
    "ShardShapeError",
    "ShapeStrideError",
    "ShardMetadataError",
    "MeshError",
    "ParallelizeError",
    "UnsupportedOpError",
]
