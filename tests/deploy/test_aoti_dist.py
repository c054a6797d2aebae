"""Deploying on 2 gloo ranks: per-rank AOTInductor packages of a tensor-parallel MLP
(ShardedTensor parameters, ColwiseParallel + RowwiseParallel) and of a module that calls
``subclass_kit.collectives.all_reduce``, each with the batch dim dynamic.

Each rank exports its own program, strict and non-strict, and compares both with eager
(cheap); the non-strict programs (torch.export's default) are compiled and run; then a
NEW 2-rank world -- fresh processes that import torch only -- loads the packages (the
collectives in them run on the new world's default group) and compares again. Slow: two
compiles per rank, ranks compiling concurrently.
"""

from __future__ import annotations

import pytest

from collectives._harness import World, world

from . import _tasks

pytestmark = [pytest.mark.slow, pytest.mark.dist]

TIMEOUT = 400.0


def test_tp_and_collectives_packages_per_rank(tmp_path):
    reports = world(2).run(_tasks.build_packages, str(tmp_path), timeout=TIMEOUT)
    for r in reports:
        for mode in ("strict", "nonstrict"):
            assert r[f"tp_{mode}_export_error"] <= 1e-5, r
            assert r[f"ar_{mode}_export_error"] <= 1e-5, r
            assert any("all_reduce" in t for t in r[f"ar_{mode}_targets"]), r
            assert any("wait_tensor" in t for t in r[f"ar_{mode}_targets"]), r
        assert r["tp"]["in_process_error"] <= 1e-5 and r["ar"]["in_process_error"] <= 1e-5, r
    fresh = World(2)
    try:
        # rank i loads the packages rank i built
        cases = [[r["tp"]["case"], r["ar"]["case"]] for r in reports]
        reloaded = fresh.run(_tasks.reload_own, cases, timeout=TIMEOUT)
    finally:
        fresh.close()
    for rank, rep in enumerate(reloaded):
        assert rep.pop("kit_imported") is False
        assert sorted(rep) == ["all_reduce", "tp_mlp"]
        for name, r in rep.items():
            assert r["max_error"] <= 1e-5, (rank, name, r)
    print("dist deploy figures:", reports, reloaded)
