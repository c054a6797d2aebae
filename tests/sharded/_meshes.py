"""Mesh descriptors for in-process tests: a ShardedTensor's ctx needs only a MeshRef, and
ops that need no communication (construction, local ops, shape checks) run without a
process group. ``fake_mesh(k)`` describes a k-rank mesh this process is rank 0 of."""

from __future__ import annotations

from subclass_kit.sharded import MeshRef


def fake_mesh(k: int) -> MeshRef:
    """A 1-D mesh of ``k`` ranks (groups named but never used in-process)."""
    return MeshRef("cpu", (k,), tuple(range(k)), None, (f"no-group-{k}",))


def strides(shape) -> tuple:
    """The contiguous strides of ``shape`` (``from_local(shape=, stride=)`` takes both, as torch)."""
    out, acc = [], 1
    for s in reversed(tuple(shape)):
        out.append(acc)
        acc *= int(s)
    return tuple(reversed(out))
