"""The ``independent`` rule family on a 2-rank gloo world: ops that never mix some dims keep
a shard of those dims with no collective (channels of pooling, interpolation and padding, an
fft's untransformed dims, a second batch dim of matrix ops, uneven over the ranks), gather a
shard of a dim they work along, reduce a Partial first, forward and backward equal to dense,
eagerly and compiled; a factorization failing in one rank's shard raises on every rank."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _independent_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_independent_dims_keep_the_shard_eager():
    results = world(2).run(_independent_tasks.eager, timeout=TIMEOUT)
    assert results[0] == results[1]
    for name, (_, _, kept, along) in _independent_tasks.CASES.items():
        on_kept = results[0][f"{name} Shard({kept})"]
        # The shard of a dim the op never mixes stays, with no collective (but the check of
        # a factorization's info) and no fallback.
        comms = 1 if name in _independent_tasks.CHECKED else 0
        assert on_kept == {"placements": f"(Shard({kept}),)", "comms": comms, "gathered": []}, name
        # A shard of a dim it works along is made whole first, by the rule.
        got = results[0][f"{name} Shard({along})"]
        assert got["comms"] > 0 and got["gathered"] == [], (name, along, got)
        # A pending sum passes through an op linear in it; else it is reduced first.
        got = results[0][f"{name} Partial('sum')"]
        if name in _independent_tasks.LINEAR:
            assert got == {"placements": "(Partial('sum'),)", "comms": 0, "gathered": []}, name
        else:
            assert got["comms"] > 0 and got["placements"] == "(Replicate(),)" and got["gathered"] == [], (name, got)


def test_independent_dims_compiled_aot_eager():
    results = world(2).run(_independent_tasks.compiled, "aot_eager", timeout=TIMEOUT)
    assert results[0] == results[1]
    for chain in ("image", "linalg"):
        assert results[0][chain] == {"frames": 1, "placements": "(Shard(1),)", "gathered": []}, chain


@pytest.mark.slow
def test_independent_dims_compiled_inductor():
    results = world(2).run(_independent_tasks.compiled, "inductor", ("image",), timeout=TIMEOUT * 2)
    assert results[0]["image"] == {"frames": 1, "placements": "(Shard(1),)", "gathered": []}


def test_factorization_errors_raise_on_every_rank():
    results = world(2).run(_independent_tasks.errors_on_every_rank, timeout=TIMEOUT)
    assert results[0] == results[1]
    # Each op's dense form raises on this batch; so does each rank.
    assert set(results[0].values()) == {"raised"}, results[0]


def test_ops_that_move_elements_keep_a_partial_with_no_collective():
    results = world(2).run(_independent_tasks.movers, timeout=TIMEOUT)
    assert results[0] == results[1]
    for name, (_, sum_passes) in _independent_tasks.MOVERS.items():
        assert results[0][f"{name} max"] == {"placements": "(Partial('max'),)", "comms": 0}, name
        got = results[0][f"{name} sum"]
        if sum_passes:
            assert got == {"placements": "(Partial('sum'),)", "comms": 0}, name
        else:  # each rank would add the pad value: reduced first
            assert got["placements"] == "(Replicate(),)" and got["comms"] > 0, (name, got)
    # tile/repeat keep a shard of a dim they do not repeat.
    for name in ("tile", "repeat"):
        assert results[0][f"{name} Shard(1)"] == {"placements": "(Shard(1),)", "comms": 0}, name
    # Compiled (aot_eager, fullgraph): one graph, still pending.
    assert results[0]["compiled chain"] == {"frames": 1, "placements": "(Partial('sum'),)"}
