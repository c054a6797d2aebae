"""Placements: how one mesh dimension lays out a tensor (``Shard``, ``Replicate``, ``Partial``).

A ``ShardedTensor`` has one placement per mesh dimension. Applied in mesh-dimension order to
the global tensor ``G``: ``Shard(d)`` keeps chunk ``c`` of ``torch.chunk(G, k, d)`` on the
rank at coordinate ``c`` of a mesh dimension of size ``k`` (so shards may be uneven, the
last ones smaller or empty); ``Replicate()`` keeps all of ``G``; ``Partial(op)`` keeps an
addend, ``G = op-reduce(locals)`` over that mesh dimension.

Placements are frozen dataclasses: hashable, picklable, equal after deepcopy and
canonicalizable, as a ctx value must be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .errors import PlacementError

__all__ = ["Placement", "Shard", "Replicate", "Partial", "PARTIAL_OPS", "normalize_placements", "render"]

PARTIAL_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base of the three placements; ``is_shard()``, ``is_replicate()``, ``is_partial()``."""

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


@dataclass(frozen=True)
class Shard(Placement):
    """Split the tensor along ``dim`` across the ranks of one mesh dimension (torch.chunk).

    Example:
        >>> Shard(0), Shard(-1).dim, Shard(1).is_shard(1)
        (Shard(0), -1, True)
    """

    dim: int

    def __post_init__(self):
        if type(self.dim) is not int:
            raise PlacementError(f"Shard(dim) takes an int tensor dimension, got {self.dim!r} ({type(self.dim).__name__}).")

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or self.dim == dim

    def __repr__(self) -> str:
        return f"Shard({self.dim})"

    def __fx_repr__(self):
        return f"Shard({self.dim})", {"Shard": Shard}


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

    ``op`` is ``"sum"`` (the default), ``"avg"``, ``"max"`` or ``"min"``.

    Example:
        >>> Partial(), Partial("max").op
        (Partial('sum'), 'max')
    """

    op: str = "sum"

    def __post_init__(self):
        if self.op not in PARTIAL_OPS:
            raise PlacementError(f"Partial(op={self.op!r}): op must be one of {list(PARTIAL_OPS)}.")

    def is_partial(self) -> bool:
        return True

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
        PlacementError: wrong type or count, a ``Shard`` dim out of range, or one tensor
            dim sharded by two mesh dims.

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
                    "Replicate() or Partial(op) from subclass_kit.sharded."
                )
            p = q
        out.append(p)
    if len(out) != mesh_ndim:
        raise PlacementError(
            f"{what}: got {len(out)} placements {render(out)} for a {mesh_ndim}-D mesh; pass "
            f"exactly one placement per mesh dimension ({mesh_ndim})."
        )
    sharded_by: dict = {}
    for i, p in enumerate(out):
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise PlacementError(
                    f"{what}: placements[{i}] = {p!r} is out of range for a {ndim}-D tensor "
                    f"(valid dims are {-ndim}..{ndim - 1}). Shard a dimension the tensor has."
                )
            d = p.dim % ndim
            if d in sharded_by:
                raise PlacementError(
                    f"{what}: tensor dim {d} is sharded by mesh dims {sharded_by[d]} and {i} "
                    f"({render(out)}); sharding one tensor dim over several mesh dims is not "
                    "supported. Shard different tensor dims, or flatten those mesh dims into one."
                )
            sharded_by[d] = i
            out[i] = Shard(d)
    return tuple(out)
