"""subclass_kit.collectives: functional collectives and ``AsyncCollectiveTensor`` on the kit.

Layer: an exemplar on top of the base class (``subclass_kit.WrapperTensor``); imports torch
and the kit's base modules, never ``subclass_kit.testing``/``bench``/``cli``. This module
only re-exports.

Built on torch's native ``torch.ops._c10d_functional`` ops. In eager every collective
returns an :class:`AsyncCollectiveTensor` that waits at first use of its data; while
compiling it returns the waited plain tensor, and an ``AsyncCollectiveTensor`` passed into
a compiled region becomes a ``wait_tensor`` at the start of the graph.

Example (rank 0 of a 2-rank process group):
    >>> import torch
    >>> from subclass_kit.collectives import all_reduce
    >>> y = all_reduce(torch.ones(4), "sum")       # returns at once
    >>> z = y.view(2, 2)                           # a view: still pending
    >>> z + 1                                      # first data use: waits, once
    tensor([[3., 3.],
            [3., 3.]])
"""

from .act import AsyncCollectiveTensor as AsyncCollectiveTensor
from .autograd import (
    all_gather_tensor_autograd as all_gather_tensor_autograd,
    all_reduce_autograd as all_reduce_autograd,
    all_to_all_single_autograd as all_to_all_single_autograd,
    reduce_scatter_tensor_autograd as reduce_scatter_tensor_autograd,
)
from .coalesced import (
    all_gather_into_tensor_coalesced as all_gather_into_tensor_coalesced,
    all_reduce_coalesced as all_reduce_coalesced,
    reduce_scatter_tensor_coalesced as reduce_scatter_tensor_coalesced,
)
from .errors import (
    CollectiveArgumentError as CollectiveArgumentError,
    CollectiveError as CollectiveError,
    GroupResolutionError as GroupResolutionError,
    NoProcessGroupError as NoProcessGroupError,
)
from .faults import collective_errors as collective_errors
from .groups import GroupRef as GroupRef, resolve_group as resolve_group
from .ops import (
    REDUCE_OPS as REDUCE_OPS,
    all_gather_tensor as all_gather_tensor,
    all_reduce as all_reduce,
    all_to_all_single as all_to_all_single,
    broadcast as broadcast,
    reduce_scatter_tensor as reduce_scatter_tensor,
    wait_tensor as wait_tensor,
)

__all__ = [
    "AsyncCollectiveTensor",
    "all_reduce",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "wait_tensor",
    "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_reduce_autograd",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor_autograd",
    "all_to_all_single_autograd",
    "resolve_group",
    "GroupRef",
    "REDUCE_OPS",
    "NoProcessGroupError",
    "GroupResolutionError",
    "CollectiveArgumentError",
    "CollectiveError",
    "collective_errors",
]
