"""``MeshRef``: the small frozen descriptor of a DeviceMesh that a ShardedTensor's ctx holds.

torch's ``DeviceMesh`` is hashable and survives pickling and deepcopy, but it carries a
rank-map tensor, process-group handles and a ``repr`` that omits its ranks, so it makes a
poor ctx value (no tensors, a canonical form for stable cache keys). A ``MeshRef`` keeps what
the computation needs: the device type, the mesh shape, its ranks, dim names, and the name
of this rank's process group along each mesh dimension (the names the native collectives
take). ``mesh_ref`` makes one from a DeviceMesh (and remembers the mesh);
``MeshRef.device_mesh()`` resolves it back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Union
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import MeshError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# What the kit's functions take as a mesh: torch's DeviceMesh or the kit's MeshRef.
MeshLike = Union["DeviceMesh", "MeshRef"]

__all__ = ["MeshRef", "mesh_ref", "current_mesh", "LOCAL_GROUP", "OUTSIDE_GROUP", "LAYOUTS_SEEN", "this_rank"]

# The group name of a one-rank mesh dimension that needs no process group (collectives over
# one rank are the identity, so they are never issued).
LOCAL_GROUP = "<local>"
# The group name of every mesh dim on a rank outside the mesh (a sub-mesh of the world):
# such a rank holds empty locals and issues no collective, as torch's DTensor does.
OUTSIDE_GROUP = "<outside>"

#: ``[True]`` once this process has a layout the op rules do not handle (one tensor dim
#: over several mesh dims, a strided shard: see ``placements.is_simple``) or a mesh without
#: this rank: from then on ShardedTensor's dispatch looks for them among an op's arguments.
LAYOUTS_SEEN = [False]

_MESHES: dict = {}
_REFS: dict = {}  # id(DeviceMesh) -> (DeviceMesh, MeshRef)


def this_rank() -> int:
    """This process's global rank (0 when torch.distributed is not initialized)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@dataclass(frozen=True)
class MeshRef:
    """A DeviceMesh as a hashable, picklable, tensor-free value.

    Example:
        >>> m = MeshRef.local()
        >>> m.shape, m.ndim, m.size(0), m.coordinate()
        ((1,), 1, 1, (0,))
    """

    device_type: str
    shape: tuple
    ranks: tuple  # the mesh's global ranks, row-major
    dim_names: tuple | None
    group_names: tuple  # this rank's group along each mesh dim

    @classmethod
    def local(cls, device_type: str = "cpu") -> "MeshRef":
        """A one-rank mesh that needs no process group (``__samples__`` use it).

        Raises:
            MeshError: ``device_type`` is not a torch device type (``"cpu"``, ``"cuda"``, ...).
        """
        try:
            ok = isinstance(device_type, str) and torch.device(device_type).type == device_type
        except RuntimeError:
            ok = False
        if not ok:
            raise MeshError(
                f"MeshRef.local({device_type!r}): device_type must be a torch device type "
                "without an index, such as 'cpu' or 'cuda' (what DeviceMesh takes)."
            )
        return cls(device_type, (1,), (0,), None, (LOCAL_GROUP,))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> int:
        """Ranks along mesh dim ``dim`` (all ranks when None)."""
        return math.prod(self.shape) if dim is None else self.shape[dim]

    @property
    def is_local(self) -> bool:
        return all(g == LOCAL_GROUP for g in self.group_names)

    @property
    def outside(self) -> bool:
        """True on a rank that is not part of the mesh (a sub-mesh of the world)."""
        return OUTSIDE_GROUP in self.group_names

    def coordinate(self, rank: int | None = None) -> tuple:
        """The coordinate of ``rank`` (default: this process) on the mesh; ``()`` for this
        process when it is outside the mesh (its tensors hold empty locals, as torch's).

        Raises:
            MeshError: the rank is not part of the mesh.
        """
        if self.is_local:
            return (0,) * self.ndim
        if rank is None and self.outside:
            return ()
        rank = this_rank() if rank is None else rank
        try:
            flat = self.ranks.index(rank)
        except ValueError:
            raise MeshError(
                f"rank {rank} is not in the mesh {self} (ranks {list(self.ranks)}); a "
                "ShardedTensor lives only on the ranks of its mesh. Build the tensor on a mesh "
                "that contains this rank."
            ) from None
        coord = []
        for n in reversed(self.shape):
            coord.append(flat % n)
            flat //= n
        return tuple(reversed(coord))

    def __repr__(self) -> str:
        names = "" if self.dim_names is None else f", dim_names={self.dim_names}"
        return f"MeshRef({self.device_type!r}, shape={self.shape}, ranks={self.ranks}{names})"

    def __fx_repr__(self):
        # Evaluable source for FX codegen (a MeshRef is a compile-time constant).
        return (
            f"MeshRef({self.device_type!r}, {self.shape!r}, {self.ranks!r}, {self.dim_names!r}, "
            f"{self.group_names!r})",
            {"MeshRef": MeshRef},
        )

    def device_mesh(self) -> DeviceMesh:
        """The torch ``DeviceMesh`` this describes (rebuilt from its process groups if needed).

        A local mesh made without a process group gets a one-rank gloo world on a free port
        the first time it is resolved.
        """
        m = _MESHES.get(self)
        if m is not None:
            return m
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        if self.is_local:
            _ensure_single_rank_world()
            if dist.get_world_size() != 1:
                raise MeshError(
                    f"{self} is a one-rank mesh without a process group, but this process is "
                    f"rank {dist.get_rank()} of {dist.get_world_size()}: pass a real DeviceMesh."
                )
            m = init_device_mesh(self.device_type, (1,))
        else:
            from .. import _compat

            try:
                groups = [_compat.resolve_group_name(n) for n in self.group_names]
            except Exception as e:  # torch raises ValueError/RuntimeError by version
                raise MeshError(
                    f"cannot rebuild the DeviceMesh of {self}: its process groups "
                    f"{list(self.group_names)} do not exist in this process. Create the mesh "
                    "(init_device_mesh) before loading tensors that refer to it."
                ) from e
            mesh = torch.tensor(self.ranks, dtype=torch.int).reshape(self.shape)
            if len(groups) == 1:
                m = DeviceMesh.from_group(groups[0], self.device_type, mesh_dim_names=self.dim_names)
            else:
                m = DeviceMesh.from_group(groups, self.device_type, mesh, mesh_dim_names=self.dim_names)
        _MESHES[self] = m
        _REFS[id(m)] = (m, self)
        return m


def _ensure_single_rank_world() -> None:
    if dist.is_initialized():
        return
    import datetime

    # Port 0 lets the OS pick a free port race-free; the store is this process's own.
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))


def _describe(mesh) -> MeshRef:
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh, MeshRef):
        return mesh
    hit = _REFS.get(id(mesh))
    if hit is not None and hit[0] is mesh:
        # The mesh handed in last is the one .device_mesh resolves to (see below).
        _MESHES[hit[1]] = mesh
        return hit[1]
    if not isinstance(mesh, DeviceMesh):
        raise MeshError(
            f"expected a torch DeviceMesh (e.g. init_device_mesh('cpu', (world,))) or a MeshRef, "
            f"got {type(mesh).__name__} {mesh!r:.80}."
        )
    from .. import _compat

    with _compat.real_tensors():  # the rank map is a real tensor, also while tracing
        full = mesh.mesh
        shape, ranks = tuple(int(s) for s in full.shape), tuple(int(r) for r in full.flatten().tolist())
    groups: tuple
    if this_rank() in ranks:
        groups = tuple(mesh.get_group(i).group_name for i in range(mesh.ndim))
    else:
        groups = (OUTSIDE_GROUP,) * mesh.ndim
        LAYOUTS_SEEN[0] = True  # ops then look for tensors of this rank outside their mesh
    ref = MeshRef(
        device_type=mesh.device_type,
        shape=shape,
        ranks=ranks,
        dim_names=tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
        group_names=groups,
    )
    # Equal meshes (same ranks, same process groups) share one MeshRef, so a ShardedTensor's
    # .device_mesh resolves to the equal DeviceMesh most recently handed to the kit: the one
    # the caller is using now, never an older equal mesh another part of the program made.
    _MESHES[ref] = mesh
    _REFS[id(mesh)] = (mesh, ref)  # holds the mesh, so its id is never reused
    return ref


def mesh_ref(mesh: MeshLike) -> MeshRef:
    """The ``MeshRef`` of a DeviceMesh (a MeshRef is returned as is).

    Under torch.compile this runs on the real mesh while tracing and enters the graph as a
    constant; the guard is torch's guard on the DeviceMesh, by value (a new but equal mesh
    does not recompile).

    Example:
        >>> mesh_ref(MeshRef.local()) == MeshRef.local()
        True
    """
    if isinstance(mesh, MeshRef):
        return mesh
    if torch.compiler.is_compiling():
        from torch.distributed.device_mesh import DeviceMesh

        if isinstance(mesh, DeviceMesh):
            # A member the kit gives DeviceMesh (register_mesh_member, below), which dynamo
            # evaluates as a constant.
            return mesh._subclass_kit_mesh_ref()  # type: ignore[attr-defined]
    return _describe(mesh)


def current_mesh() -> DeviceMesh | None:
    """The torch ``DeviceMesh`` of the innermost ``with mesh:`` block, or None; what
    ``parallelize`` uses when no mesh is passed, as torch's ``parallelize_module`` does.

    Example:
        >>> current_mesh() is None
        True
    """
    from .. import _compat

    return _compat.current_device_mesh()


def _register() -> None:
    from .. import _compat

    _compat.register_mesh_member("_subclass_kit_mesh_ref", _describe)


_register()
