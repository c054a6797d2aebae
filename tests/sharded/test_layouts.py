"""Layouts that shard one tensor dim over several mesh dims, on a (2, 2) mesh of 4 gloo
ranks: torch's nested ``[Shard(0), Shard(0)]`` and FSDP-over-TP's strided
``[_StridedShard(0, split_factor=2), Shard(0)]``, through distribute, redistribute (every
layout to every other, uneven sizes), full_tensor, gradients and the op rules; Partial
``distribute``; and sub-meshes (a rank outside the mesh holds an empty local). Each checked
against dense values and against torch's DTensor on the same layouts in the same world
(per-rank locals, collective counts). One spawned world for all."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _layouts_tasks as T

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_every_layout_redistributes_to_every_other_as_dtensor():
    # 14 layouts (simple, nested, strided, Partial) x 14, three shapes (two uneven): the
    # full value and the gradient equal dense, the locals equal DTensor's and the
    # collectives are no more than DTensor's wherever DTensor itself is right.
    for r in world(4).run(T.redistribute_all, timeout=TIMEOUT):
        assert r["bad"] == [], r["bad"][:5]
        assert r["pairs"] == 480
