"""Ops taken off the generic gathering fallback, on a 2-rank gloo world against dense: the
``shared_dims`` family (``multi_margin_loss``, ``multilabel_margin_loss``, ``cdist``,
``bilinear``, ``ctc_loss``, each with its backward), the chunked ``linear_cross_entropy``
and the ``independent`` family's index reductions (``index_reduce``, ``segment_reduce``). A
shard the rule keeps costs no collective in the forward (the chunked cross entropy's mean:
one scalar); a shard it cannot keep is made whole by the rule, never by the fallback."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _shared_dims_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_shared_dims_keep_the_shard_and_match_dense():
    results = world(2).run(_shared_dims_tasks.eager, timeout=TIMEOUT)
    assert results[0] == results[1]
    r = results[0]
    for name, (_, _, layouts) in _shared_dims_tasks.CASES.items():
        for label in layouts:
            got = r[f"{name} {label}"]
            assert got["gathered"] == [], (name, label, got)  # forward and backward
            if "gathers" in label:
                assert got["comms"] > 0 and got["placements"] == "(Replicate(),)", (name, label, got)
            else:
                assert got["comms"] == _shared_dims_tasks.COMMS.get((name, label), 0), (name, label, got)
    for (name, label), placements in _shared_dims_tasks.PLACEMENTS.items():
        assert r[f"{name} {label}"]["placements"] == placements, (name, label)


def test_scaled_mm_keeps_rows_and_columns():
    r = world(2).run(_shared_dims_tasks.scaled_mm, timeout=TIMEOUT)[0]
    assert r["rows"] == ("(Shard(0),)", 0, [])
    assert r["rows, plain scales"] == ("(Shard(0),)", 0, [])  # a plain row-wise scale is cut locally
    assert r["columns"] == ("(Shard(1),)", 0, [])  # the bias cut with the columns
    assert r["v2 rows"] == ("(Shard(0),)", 0, []) and r["v2 columns"] == ("(Shard(1),)", 0, [])
    placements, comms, gathered = r["contraction"]
    assert placements == "(Replicate(),)" and comms > 0 and gathered == []


def test_shared_dims_compiled_aot_eager():
    results = world(2).run(_shared_dims_tasks.compiled, "aot_eager", timeout=TIMEOUT)
    assert results[0] == {"frames": 1, "gathered": [], "table grad": "(Shard(1),)"}


@pytest.mark.slow
def test_shared_dims_compiled_inductor():
    results = world(2).run(_shared_dims_tasks.compiled, "inductor", timeout=TIMEOUT * 2)
    assert results[0] == {"frames": 1, "gathered": [], "table grad": "(Shard(1),)"}
