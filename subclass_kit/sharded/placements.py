"""Placements: how one mesh dimension lays out a tensor (``Shard``, ``Replicate``, ``Partial``).

A ``ShardedTensor`` has one placement per mesh dimension. Applied in mesh-dimension order
(left to right, as torch does), each to what the previous ones left: ``Shard(d)`` keeps
chunk ``c`` of ``torch.chunk(G, k, d)`` on the rank at coordinate ``c`` of a mesh dimension
of size ``k`` (so shards may be uneven, the last ones smaller or empty; two mesh dims that
shard one tensor dim nest: the second splits the first's chunk); ``_StridedShard(d, sf)``
is FSDP-over-TP's right-to-left order (see its class); ``Replicate()`` keeps all of ``G``;
``Partial(op)`` keeps an addend, ``G = op-reduce(locals)`` over that mesh dimension.

Placements are frozen dataclasses: hashable, picklable, equal after deepcopy and
canonicalizable, as a ctx value must be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ._layout import chunk_size, chunk_start, strided_local_size
from .errors import PlacementError
from .mesh import LAYOUTS_SEEN

if TYPE_CHECKING:
    import torch

    from .mesh import MeshRef

__all__ = ["Placement", "Shard", "_StridedShard", "Replicate", "Partial", "PARTIAL_OPS", "normalize_placements",
           "render", "is_simple"]

PARTIAL_OPS = ("sum", "avg", "max", "min", "product")
# torch's Partial takes "prod" too (its reductions name it "product"): one placement, one name.
_ALIASES = {"prod": "product"}



class Placement:
    """Base of the placements. Each placement carries its own behaviour, as torch's
    ``Shard._split_tensor`` / ``Partial._reduce_value`` do, so redistribution, layout
    arithmetic and the op rules ask the placement instead of switching on its type; a new
    placement is one class:

    - ``local_shape(shape, k, c)`` / ``global_shape(local, k)``: a shard's shape from the
      global one on a mesh dim of ``k`` ranks at coordinate ``c``, and back (even shards);
    - ``offset(n, k, c)``: where this rank's part of a dim of ``n`` starts;
    - ``to_replicate(local, mesh, mesh_dim, shape)``: the whole value (gather, reduce, or
      nothing);
    - ``from_replicate(local, mesh, mesh_dim, coord)``: this rank's part of a whole value,
      without communication;
    - ``settled()``: the placement of a value computed afresh from this one (a gradient, a
      ``zeros_like``): a pending reduction never survives, the rest does;
    - ``cost_to(dst)``: the relative cost of turning this into ``dst`` on one mesh dim;
    - ``is_shard()``, ``is_replicate()``, ``is_partial()``: what torch's placements answer.
    """

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def shard_dim(self) -> int | None:
        """The tensor dim this placement splits, or None (what a type checker can follow)."""
        return None

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False

    def local_shape(self, shape: tuple, k: int, c: int) -> tuple:
        return shape

    def global_shape(self, local: tuple, k: int) -> tuple:
        return local

    def offset(self, n: int, k: int, c: int) -> int:
        return 0

    def to_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, shape: Sequence[int]) -> torch.Tensor:
        return local

    def from_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, coord: int) -> torch.Tensor:
        return local

    def settled(self) -> "Placement":
        return self

    def cost_to(self, dst: "Placement") -> float:
        # Replicate to a shard is a local chunk, to a Partial a local mask: (almost) free.
        if dst == self:
            return 0.0
        return 0.01 if dst.is_shard() else 0.02


class _DimSplit(Placement):
    """What ``Shard`` and ``_StridedShard`` share: they split tensor dim ``dim``."""

    __slots__ = ()
    dim: int

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or self.dim == dim

    def shard_dim(self) -> int | None:
        return self.dim

    def global_shape(self, local: tuple, k: int) -> tuple:
        d = self.dim
        return (*local[:d], local[d] * k, *local[d + 1:])

    def cost_to(self, dst: "Placement") -> float:
        # A gather moves the tensor once (then a Partial is a local mask on top).
        if dst == self:
            return 0.0
        return 1.02 if dst.is_partial() else 1.0


@dataclass(frozen=True)
class Shard(_DimSplit):
    """Split the tensor along ``dim`` across the ranks of one mesh dimension (torch.chunk).

    Example:
        >>> Shard(0), Shard(-1).dim, Shard(1).is_shard(1)
        (Shard(0), -1, True)
    """

    dim: int

    def __post_init__(self):
        if type(self.dim) is not int:
            raise PlacementError(f"Shard(dim) takes an int tensor dimension, got {self.dim!r} ({type(self.dim).__name__}).")

    def local_shape(self, shape: tuple, k: int, c: int) -> tuple:
        d = self.dim
        return (*shape[:d], chunk_size(shape[d], k, c), *shape[d + 1:])

    def offset(self, n: int, k: int, c: int) -> int:
        return chunk_start(n, k, c)

    def to_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, shape: Sequence[int]) -> torch.Tensor:
        from ._comm import gather_shards

        return gather_shards(local, mesh, mesh_dim, self.dim, shape[self.dim])

    def from_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, coord: int) -> torch.Tensor:
        from ._comm import take_chunk

        return take_chunk(local, mesh.shape[mesh_dim], coord, self.dim)

    def __repr__(self) -> str:
        return f"Shard({self.dim})"

    def __fx_repr__(self):
        return f"Shard({self.dim})", {"Shard": Shard}


@dataclass(frozen=True)
class _StridedShard(_DimSplit):
    """Split ``dim`` as if a later mesh dim had split it first (torch's ``_StridedShard``).

    FSDP over TP stores a parameter with its dim 0 sharded by TP (mesh dim 1) and each TP
    shard sharded again by FSDP (mesh dim 0): right-to-left. In the kit's left-to-right
    reading that layout is ``[_StridedShard(0, split_factor=tp), Shard(0)]``: on its mesh
    dim of ``k`` ranks, coordinate ``c`` holds chunk ``c`` (of ``k``) of each of the
    ``split_factor`` chunks of the dim, concatenated; the next ``Shard(0)`` then picks one
    of those pieces. Values and local shapes equal torch's for the same placements.

    Example:
        >>> _StridedShard(0, split_factor=2), _StridedShard(0, split_factor=2).is_shard(0)
        (_StridedShard(dim=0, sf=2), True)
    """

    dim: int
    split_factor: int = 1

    def __post_init__(self):
        if type(self.dim) is not int:
            raise PlacementError(f"_StridedShard(dim) takes an int tensor dimension, got {self.dim!r}.")
        if type(self.split_factor) is not int or self.split_factor < 1:
            raise PlacementError(
                f"_StridedShard(split_factor=) takes a positive int (the number of shards a later "
                f"mesh dim makes of the dim), got {self.split_factor!r}."
            )

    def local_shape(self, shape: tuple, k: int, c: int) -> tuple:
        d = self.dim
        return (*shape[:d], strided_local_size(shape[d], k, c, self.split_factor), *shape[d + 1:])

    def to_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, shape: Sequence[int]) -> torch.Tensor:
        from ._comm import gather_strided

        return gather_strided(local, mesh, mesh_dim, self.dim, shape[self.dim], self.split_factor)

    def from_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, coord: int) -> torch.Tensor:
        from ._comm import take_strided

        return take_strided(local, mesh.shape[mesh_dim], coord, self.dim, self.split_factor)

    def __repr__(self) -> str:
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"

    def __fx_repr__(self):
        return f"_StridedShard({self.dim}, {self.split_factor})", {"_StridedShard": _StridedShard}


@dataclass(frozen=True)
class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor.

    Example:
        >>> Replicate(), Replicate() == Replicate()
        (Replicate(), True)
    """

    def is_replicate(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Replicate()"

    def __fx_repr__(self):
        return "Replicate()", {"Replicate": Replicate}


@dataclass(frozen=True)
class Partial(Placement):
    """Every rank holds an operand; the tensor is their reduction by ``op`` over the mesh dim.

    ``op`` is ``"sum"`` (the default), ``"avg"``, ``"max"``, ``"min"`` or ``"product"``
    (``"prod"`` is read as ``"product"``, torch's collectives' name for it).

    Example:
        >>> Partial(), Partial("max").op, Partial("prod")
        (Partial('sum'), 'max', Partial('product'))
    """

    op: str = "sum"

    def __post_init__(self):
        if self.op in _ALIASES:
            object.__setattr__(self, "op", _ALIASES[self.op])
        if self.op not in PARTIAL_OPS:
            raise PlacementError(f"Partial(op={self.op!r}): op must be one of {list(PARTIAL_OPS)}.")

    def is_partial(self) -> bool:
        return True

    def to_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, shape: Sequence[int]) -> torch.Tensor:
        from ._comm import reduce_partial

        return reduce_partial(local, mesh, mesh_dim, self.op)

    def from_replicate(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, coord: int) -> torch.Tensor:
        # Operands of a sum: the value on the first rank, zeros elsewhere; of a product: the
        # value on the first rank, ones elsewhere (exact, where torch's DTensor refuses: an
        # n-th root is neither); of an average, a max or a min: the value itself on every rank.
        if self.op in ("sum", "product"):
            from ._comm import identity_unless_first

            return identity_unless_first(local, coord, self.op)
        return local

    def reduce_scatter(self, local: torch.Tensor, mesh: MeshRef, mesh_dim: int, dim: int, coord: int) -> torch.Tensor:
        """The reduction's chunk of tensor dim ``dim`` for this rank, in one collective
        (``Partial -> Shard(dim)``)."""
        from ._comm import reduce_scatter_partial

        return reduce_scatter_partial(local, mesh, mesh_dim, self.op, dim, coord)

    def settled(self) -> "Placement":
        return Replicate()

    def cost_to(self, dst: "Placement") -> float:
        # Partial -> Shard is one reduce-scatter; -> Replicate an all-reduce.
        if dst == self:
            return 0.0
        return 1.0 if dst.is_shard() else 2.0

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"

    def __fx_repr__(self):
        return f"Partial({self.op!r})", {"Partial": Partial}


def _from_torch(p: Any) -> Placement | None:
    # torch's DTensor placements convert one-to-one, so code written for DTensor reads here.
    name = type(p).__name__
    if not type(p).__module__.startswith("torch.distributed"):
        return None
    if name == "Shard":
        return Shard(int(p.dim))
    if name == "_StridedShard":
        return _StridedShard(int(p.dim), split_factor=int(p.split_factor))
    if name == "Replicate":
        return Replicate()
    if name == "Partial":
        return Partial(str(getattr(p, "reduce_op", "sum")))
    return None


def render(placements: Sequence[Placement]) -> str:
    """``(Shard(0), Replicate())`` for messages.

    Example:
        >>> render([Shard(0), Replicate()])
        '(Shard(0), Replicate())'
    """
    return "(" + ", ".join(repr(p) for p in placements) + ("," if len(placements) == 1 else "") + ")"


def normalize_placements(placements: Any, mesh_ndim: int, ndim: int, *, what: str) -> tuple:
    """Check ``placements`` against a mesh and a tensor rank; return them with ``Shard`` dims >= 0.

    Args:
        placements: a sequence with one ``Shard``/``Replicate``/``Partial`` per mesh dim
            (torch's DTensor placements are accepted and converted).
        mesh_ndim: number of mesh dimensions.
        ndim: number of dimensions of the (global) tensor.
        what: who is asking, for messages (``"ShardedTensor.from_local"``).

    Raises:
        PlacementError: wrong type or count, or a ``Shard`` dim out of range.

    Example:
        >>> normalize_placements([Shard(-1)], 1, 2, what="demo")
        (Shard(1),)
    """
    if isinstance(placements, Placement) or not isinstance(placements, (list, tuple)):
        raise PlacementError(
            f"{what}: placements must be a list or tuple with one placement per mesh dim, got "
            f"{placements!r}. Write e.g. [Shard(0)] for a 1-D mesh."
        )
    out = []
    for i, p in enumerate(placements):
        if not isinstance(p, Placement):
            q = _from_torch(p)
            if q is None:
                raise PlacementError(
                    f"{what}: placements[{i}] is {p!r} ({type(p).__name__}); use Shard(dim), "
                    "_StridedShard(dim, split_factor=), Replicate() or Partial(op) from subclass_kit.sharded."
                )
            p = q
        out.append(p)
    if len(out) != mesh_ndim:
        raise PlacementError(
            f"{what}: got {len(out)} placements {render(out)} for a {mesh_ndim}-D mesh; pass "
            f"exactly one placement per mesh dimension ({mesh_ndim})."
        )
    for i, p in enumerate(out):
        sd = p.shard_dim()
        if sd is not None:
            if not -ndim <= sd < ndim:
                raise PlacementError(
                    f"{what}: placements[{i}] = {p!r} is out of range for a {ndim}-D tensor "
                    f"(valid dims are {-ndim}..{ndim - 1}). Shard a dimension the tensor has."
                )
            d = sd % ndim
            if d != sd:
                out[i] = Shard(d) if type(p) is Shard else _StridedShard(d, split_factor=p.split_factor)  # type: ignore[attr-defined]
    res = tuple(out)
    if not LAYOUTS_SEEN[0] and not is_simple(res):
        LAYOUTS_SEEN[0] = True
    return res


_SIMPLE: dict = {}


def is_simple(placements: tuple) -> bool:
    """True when no tensor dim is sharded by two mesh dims and no placement is strided: the
    layouts every op rule handles (the others are brought to one first, see ``_layouts``).

    Example:
        >>> is_simple((Shard(0), Shard(1))), is_simple((Shard(0), Shard(0)))
        (True, False)
    """
    hit = _SIMPLE.get(placements)
    if hit is None:
        dims = [p.shard_dim() for p in placements if p.is_shard()]
        hit = len(dims) == len(set(dims)) and not any(type(p) is _StridedShard for p in placements)
        if len(_SIMPLE) > 4096:
            _SIMPLE.clear()
        _SIMPLE[placements] = hit
    return hit
