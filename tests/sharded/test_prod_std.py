"""``Partial('product')`` and one-collective ``var``/``std`` over a shard, on 2 gloo ranks
(see _prod_std_tasks): values against dense, collective counts against torch's DTensor."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _prod_std_tasks

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def results():
    return world(2).run(_prod_std_tasks.run, timeout=120)


def test_partial_product(results):
    assert all(r["partial_product"] == "ok" for r in results)


def test_prod_over_a_shard_no_collective(results):
    assert results[0]["prod_over_a_shard"]["kit"][0] == 0


def test_var_std_one_collective(results):
    counts = results[0]["var_std_one_collective"]
    assert counts["('plain', 'kit')"][0] == 4  # var, std, var_mean, std_mean: one gather each
