"""Ops moved off the generic gathering fallback, on a 2-rank gloo world against dense: the
activations' gradients (an elementwise rule that keeps a Partial incoming gradient), views
the built-in handler serves getting their own signature (view_as_real/view_as_complex
keeping a shard: the view family's rule), addbmm, kthvalue/median/mode
along an unsharded dim. (Batch norm is in test_batch_norm.py; the op_db sweep checks
every op of its NO_GATHER list.)"""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _no_gather_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 200.0


def test_activation_gradients_keep_a_partial_incoming_gradient():
    r = world(2).run(_no_gather_tasks.activation_backwards, timeout=TIMEOUT)[0]
    assert r.pop("gathered") == []
    for name in _no_gather_tasks.BACKWARDS:
        # Linear in the incoming gradient: no all-reduce before the op.
        assert r[f"{name} Partial"] == "(Partial('sum'),)", name
        assert r[f"{name} Shard(1)"] == "(Shard(1),)", name


def test_views_addbmm_and_order_statistics_without_gathering():
    r = world(2).run(_no_gather_tasks.views_and_small_ops, timeout=TIMEOUT)[0]
    assert r["gathered"] == []
    assert r["view_as_real Shard(0)"] == ("(Shard(0),)", True)  # a view of the shard
    assert r["view_as_complex Shard(0)"] == "(Shard(0),)"
    for name in ("kthvalue", "median", "nanmedian", "mode"):
        assert r[f"{name} dim 1"] == "(Shard(0),)", name  # the rows' shard stays
        assert r[f"{name} dim 0"] == "(Replicate(),)", name  # the sharded dim is gathered
