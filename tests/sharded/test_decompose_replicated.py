"""Ops the kit runs as torch's decomposition (``sharded/_ops/decompose.py``): on
all-Replicate operands the op runs once on the locals (the decomposition's steps never
reach the wrapper), on a shard the decomposition runs; both match dense."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _decompose_tasks

pytestmark = pytest.mark.dist


def test_replicated_operands_run_the_op_once_and_shards_decompose():
    r0, r1 = world(2).run(_decompose_tasks.values_and_paths, timeout=300)
    assert r0 == r1
    for name in _decompose_tasks.CASES:
        rep, shard = r0[f"{name} R"], r0[f"{name} S"]
        assert rep["close"] and shard["close"], (name, rep, shard)
        assert rep["placements"] == "(Replicate(),)", (name, rep)
        # Replicate: only the ops the function itself calls reach the wrapper (addr's and
        # mv's slicing, bce's sigmoid); a shard: the decomposition's steps too.
        assert len(shard["ops"]) > len(rep["ops"]), (name, rep["ops"], shard["ops"])


def test_replicated_shortcut_compiles_to_the_eager_values():
    assert world(2).run(_decompose_tasks.compiled_matches_eager, timeout=300) == [True, True]
