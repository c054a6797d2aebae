"""Group resolution: every way of naming a group becomes one ``GroupRef(name, size)``.

The native ``_c10d_functional`` ops take a group *name*; users hold a ProcessGroup, a
DeviceMesh (and a mesh dimension), a group name, a list of ranks, or nothing at all (the
default world group). Resolution runs in eager and under torch.compile alike: every branch
here is either plain attribute access dynamo understands (``dist.group.WORLD``, which it
guards by identity, ``pg.group_name``, ``mesh.get_group(dim)``) or a lookup marked
``torch.compiler.assume_constant_result``, which dynamo evaluates once while tracing and bakes
into the graph as a constant. So ``all_reduce(x, "sum")`` compiles with ``fullgraph=True``
without the user naming any global.
"""

from __future__ import annotations

from typing import NamedTuple, Union

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .. import _compat
from .errors import GroupResolutionError, NoProcessGroupError

__all__ = ["GroupRef", "GroupLike", "ReduceOpLike", "resolve_group"]

GroupLike = Union[None, dist.ProcessGroup, DeviceMesh, str, "list[int]", "tuple[DeviceMesh, int]"]
# A reduce op: its name ("sum", "avg", ...; any case) or a torch.distributed.ReduceOp member.
ReduceOpLike = Union[str, dist.ReduceOp]


class GroupRef(NamedTuple):
    """A resolved group: the name the native ops take and the number of ranks in it."""

    name: str
    size: int


def _no_group(where: str) -> NoProcessGroupError:
    return NoProcessGroupError(
        f"subclass_kit.collectives.{where} needs a process group, but torch.distributed has "
        "no default group on this process. Call torch.distributed.init_process_group(...) "
        "on every rank first (e.g. init_process_group('gloo') with MASTER_ADDR/MASTER_PORT, "
        "RANK and WORLD_SIZE set), or pass group= explicitly."
    )


@torch.compiler.assume_constant_result
def _size_of_named(name: str, where: str) -> int:
    if not dist.is_initialized():
        raise _no_group(where)
    try:
        pg = _compat.resolve_group_name(name)
    except Exception as e:  # torch raises ValueError/RuntimeError depending on version
        raise GroupResolutionError(
            f"subclass_kit.collectives.{where}: no process group is registered under the name "
            f"{name!r}. Pass the ProcessGroup itself, a DeviceMesh, a list of ranks, or the "
            "name of an existing group (ProcessGroup.group_name)."
        ) from e
    return pg.size()


@torch.compiler.assume_constant_result
def _name_of_ranks(ranks: tuple, where: str) -> str:
    if not dist.is_initialized():
        raise _no_group(where)
    pg = _compat.find_group_by_ranks(list(ranks))
    if pg is None:
        raise GroupResolutionError(
            f"subclass_kit.collectives.{where}: no process group has exactly the ranks "
            f"{list(ranks)}. Create it on every rank first with "
            f"torch.distributed.new_group({list(ranks)}) (group creation is itself collective, "
            "so it cannot happen inside a collective call), then pass that group or its ranks."
        )
    return pg.group_name


def _from_mesh(mesh: DeviceMesh, mesh_dim, where: str) -> GroupRef:
    if mesh_dim is None:
        if mesh.ndim != 1:
            raise GroupResolutionError(
                f"subclass_kit.collectives.{where}: a {mesh.ndim}-D DeviceMesh names "
                f"{mesh.ndim} groups; pass mesh_dim= (an index or one of the mesh's dim "
                f"names {mesh.mesh_dim_names}) to choose one."
            )
        mesh_dim = 0
    pg = mesh.get_group(mesh_dim)
    return GroupRef(pg.group_name, pg.size())


def resolve_group(group: GroupLike = None, mesh_dim: "int | str | None" = None, *, where: str = "resolve_group") -> GroupRef:
    """Resolve any accepted ``group=`` value to a ``GroupRef(name, size)``.

    Args:
        group: None (the default world group), a ProcessGroup, a DeviceMesh (1-D, or with
            ``mesh_dim``), a ``(DeviceMesh, mesh_dim)`` pair, a group name, or a list of
            the ranks of an existing group.
        mesh_dim: which dimension of a DeviceMesh (index or name); only with a mesh.
        where: the calling collective's name, for error messages.

    Returns:
        ``GroupRef(name, size)``.

    Raises:
        NoProcessGroupError: torch.distributed is not initialized.
        GroupResolutionError: ``group`` names no usable group.

    Example (rank 0 of a 2-rank process group):
        >>> import torch.distributed as dist
        >>> resolve_group()
        GroupRef(name='0', size=2)
        >>> resolve_group([0, 1]) == resolve_group(dist.group.WORLD)
        True
    """
    if mesh_dim is not None and not isinstance(group, DeviceMesh):
        raise GroupResolutionError(
            f"subclass_kit.collectives.{where}: mesh_dim={mesh_dim!r} only applies when group "
            f"is a DeviceMesh, got group of type {type(group).__name__}."
        )
    if group is None:
        pg = dist.group.WORLD
        if pg is None:
            raise _no_group(where)
        return GroupRef(pg.group_name, pg.size())
    if isinstance(group, dist.ProcessGroup):
        return GroupRef(group.group_name, group.size())
    if isinstance(group, DeviceMesh):
        return _from_mesh(group, mesh_dim, where)
    if isinstance(group, str):
        return GroupRef(group, _size_of_named(group, where))
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        return _from_mesh(group[0], group[1], where)
    if isinstance(group, (list, tuple)) and len(group) > 0 and all(isinstance(r, int) for r in group):
        return GroupRef(_name_of_ranks(tuple(group), where), len(group))
    raise GroupResolutionError(
        f"subclass_kit.collectives.{where}: group must be None (the default world group), a "
        "ProcessGroup, a DeviceMesh (with mesh_dim= unless 1-D), a group name, or a non-empty "
        f"list of ranks; got {type(group).__name__} {group!r:.80}."
    )
