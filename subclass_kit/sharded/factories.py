"""The factories of ``torch.distributed.tensor``: ``zeros``, ``ones``, ``empty``, ``full``,
``rand`` and ``randn`` with ``device_mesh=`` and ``placements=``, making a ShardedTensor.

Each rank allocates only its shard (torch.chunk sizes, uneven ones included). A ``Partial``
placement holds operands that sum to the requested tensor: the value on the first rank of that
mesh dim, zeros elsewhere (``Partial('sum')``; an average, max or min holds the value on every
rank), so ``full_tensor()`` is always the dense factory's result. The random ones follow the
kit's random stream (see ``_ops/random.py``): each rank draws the whole tensor from its own
generator, as the dense ``torch.rand(size)`` does, and keeps its part, so under one seed the
global value equals the dense draw on any mesh and placements (torch's DTensor draws each shard
from an offset of one shared stream instead: the same distribution, other values).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ._layout import contiguous_strides, local_shape
from .mesh import MeshLike
from .placements import Placement, Replicate, normalize_placements
from ._redistribute import redistribute_local
from .tensor import ShardedTensor, ambient_mesh, wrap

__all__ = ["zeros", "ones", "empty", "full", "rand", "randn"]


def _size(size: tuple) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _make(name: str, init: Callable[..., torch.Tensor], size: tuple, *, random: bool, dtype, layout,
          requires_grad: bool, device_mesh, placements, fill: Any = None) -> ShardedTensor:
    where = f"subclass_kit.sharded.{name}"
    if layout != torch.strided:
        raise ValueError(f"{where}: layout={layout}; only torch.strided is supported (as torch's).")
    ref = ambient_mesh(device_mesh, where)
    shape = _size(size)
    pl = (Replicate(),) * ref.ndim if placements is None else normalize_placements(
        list(placements), ref.ndim, len(shape), what=where)
    coord = ref.coordinate()
    kw: dict[str, Any] = {"dtype": dtype, "device": ref.device_type}
    args = () if fill is None else (fill,)
    settled = tuple(p.settled() for p in pl)
    if not coord:
        # A rank outside the mesh holds an empty local (as torch's), and draws nothing.
        local = init((0,), *args, **kw)
    elif random:
        # The whole draw on every rank (the kit's random stream), then this rank's part.
        local = redistribute_local(init(shape, **kw), ref, coord, (Replicate(),) * ref.ndim, pl, shape)
        local = local.clone(memory_format=torch.contiguous_format)  # not a view of the whole draw
    else:
        local = init(local_shape(shape, settled, ref.shape, coord), *args, **kw)
        if settled != pl and name != "empty":
            local = redistribute_local(local, ref, coord, settled, pl, shape)
    out = wrap(local.contiguous(), ref, pl, coord, shape, contiguous_strides(shape), local.dtype)
    if requires_grad:
        out.requires_grad_(True)
    return out


def zeros(*size: int | Sequence[int], requires_grad: bool = False, dtype: torch.dtype | None = None,
          layout: torch.layout = torch.strided,
          device_mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """A ShardedTensor of zeros of global ``size``, as ``torch.distributed.tensor.zeros``.

    Args:
        size: the global shape (ints, or one sequence).
        requires_grad, dtype, layout: as ``torch.zeros`` (``layout`` must be strided).
        device_mesh: the mesh; None: the innermost ``with mesh:`` block's.
        placements: one per mesh dim; None: ``Replicate()`` on every mesh dim.

    Returns:
        A ShardedTensor (a leaf) whose local is this rank's shard.

    Raises:
        MeshError: no mesh given outside a ``with mesh:`` block.
        PlacementError: placements that do not fit the mesh or the shape.

    Example:
        >>> from subclass_kit.sharded import zeros, Shard, MeshRef
        >>> x = zeros(4, 2, device_mesh=MeshRef.local(), placements=[Shard(0)])
        >>> x.shape, x.placements, x.to_local().sum().item()
        (torch.Size([4, 2]), (Shard(0),), 0.0)
    """
    return _make("zeros", torch.zeros, size, random=False, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements)


def ones(*size: int | Sequence[int], requires_grad: bool = False, dtype: torch.dtype | None = None,
          layout: torch.layout = torch.strided,
         device_mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """A ShardedTensor of ones, as ``torch.distributed.tensor.ones`` (arguments as :func:`zeros`).

    Example:
        >>> from subclass_kit.sharded import ones, MeshRef
        >>> ones(3, device_mesh=MeshRef.local()).full_tensor()
        tensor([1., 1., 1.])
    """
    return _make("ones", torch.ones, size, random=False, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements)


def empty(*size: int | Sequence[int], requires_grad: bool = False, dtype: torch.dtype | None = None,
          layout: torch.layout = torch.strided,
          device_mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """An uninitialized ShardedTensor, as ``torch.distributed.tensor.empty`` (arguments as
    :func:`zeros`).

    Example:
        >>> from subclass_kit.sharded import empty, Shard, MeshRef
        >>> empty(4, 3, device_mesh=MeshRef.local(), placements=[Shard(1)]).to_local().shape
        torch.Size([4, 3])
    """
    return _make("empty", torch.empty, size, random=False, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements)


def full(size: Sequence[int], fill_value: float | int | bool, *, requires_grad: bool = False, dtype: torch.dtype | None = None,
         layout: torch.layout = torch.strided, device_mesh: MeshLike | None = None,
         placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """A ShardedTensor filled with ``fill_value``, as ``torch.distributed.tensor.full``
    (other arguments as :func:`zeros`).

    Example:
        >>> from subclass_kit.sharded import full, MeshRef
        >>> full((2,), 7.0, device_mesh=MeshRef.local()).full_tensor()
        tensor([7., 7.])
    """
    return _make("full", torch.full, (size,), random=False, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements, fill=fill_value)


def rand(*size: int | Sequence[int], requires_grad: bool = False, dtype: torch.dtype | None = None,
          layout: torch.layout = torch.strided,
         device_mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """Uniform random values, as ``torch.distributed.tensor.rand`` (arguments as :func:`zeros`).

    The kit's random stream: the global value is the dense ``torch.rand(size)`` under the same
    seed (each rank draws the whole tensor and keeps its part; see the module docstring).

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import rand, Shard, MeshRef
        >>> _ = torch.manual_seed(0); x = rand(4, device_mesh=MeshRef.local(), placements=[Shard(0)])
        >>> _ = torch.manual_seed(0); torch.equal(x.full_tensor(), torch.rand(4))
        True
    """
    return _make("rand", torch.rand, size, random=True, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements)


def randn(*size: int | Sequence[int], requires_grad: bool = False, dtype: torch.dtype | None = None,
          layout: torch.layout = torch.strided,
          device_mesh: MeshLike | None = None, placements: Sequence[Placement] | None = None) -> ShardedTensor:
    """Normal random values, as ``torch.distributed.tensor.randn`` (arguments as :func:`zeros`;
    the random stream as :func:`rand`'s).

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import randn, MeshRef
        >>> _ = torch.manual_seed(1); x = randn(2, 3, device_mesh=MeshRef.local())
        >>> _ = torch.manual_seed(1); torch.equal(x.full_tensor(), torch.randn(2, 3))
        True
    """
    return _make("randn", torch.randn, size, random=True, dtype=dtype, layout=layout,
                 requires_grad=requires_grad, device_mesh=device_mesh, placements=placements)
