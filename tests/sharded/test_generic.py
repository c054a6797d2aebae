"""The generic gathering fallback on a 2-rank gloo world: every op without a sharding rule
runs on the gathered operands and matches dense (values, gradients, eager and compiled),
writes reach the shards, views that gathered refuse writes, random ops are consistent, and
each op is logged once."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _generic_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_rule_less_ops_match_dense_eager_and_compiled():
    results = world(2).run(_generic_tasks.values_and_grads, "aot_eager", timeout=TIMEOUT)
    assert results[0] == results[1]
    # One graph per op and layout (fullgraph): the fallback traces without a break.
    assert set(results[0]["frames"].values()) == {1}
    paths = results[0]["paths"]
    assert "aten.take.default" in paths["take"]
    assert all(paths[name] for name in paths), paths  # every one of them gathered


def test_inplace_and_out_writes_reach_the_shards():
    results = world(2).run(_generic_tasks.writes, timeout=TIMEOUT)
    r = results[0]
    assert r["zero_ Shard(0)"] == "(Shard(0),)" and r["zero_ Shard(1)"] == "(Shard(1),)"
    assert r["mv out= Shard(0)"] == "(Shard(0),)"
    assert r["zero_ partial"] == "(Partial('sum'),)"
    assert r["as_strided_"] == "raises" and r["mv out= resize"] == "raises"
    assert r["as_strided_ regroup"] == "(Shard(0),)"


def test_inplace_views_of_shards_take_the_out_of_place_placements():
    r = world(2).run(_generic_tasks.inplace_views, "aot_eager", timeout=TIMEOUT)[0]
    # squeeze_(0) shifts the shard dim down; t_ swaps it; a Partial stays Partial.
    assert (r["squeeze_ Shard(1)"], r["t_ Shard(1)"]) == ("(Shard(0),)", "(Shard(1),)")
    assert (r["squeeze_ Shard(2)"], r["t_ Shard(2)"]) == ("(Shard(1),)", "(Shard(0),)")
    assert r["squeeze_ Partial"] == r["t_ Partial"] == "(Partial('sum'),)"
    for lname in ("Shard(1)", "Shard(2)", "Partial"):
        assert r[f"frames {lname}"] == 1, lname
        assert not [op for op in r[f"gathered {lname}"] if "_." in op], r[f"gathered {lname}"]


def test_random_ops_are_consistent():
    results = world(2).run(_generic_tasks.random_ops, timeout=TIMEOUT)
    for key, v in results[0].items():
        if "Replicate" in key:
            assert v == "same on every rank", key


def test_each_gathering_op_is_logged_once():
    results = world(2).run(_generic_tasks.logged_once, timeout=TIMEOUT)
    assert len(results[0]) == 1
    assert "aten.bincount.default" in results[0][0] and "implements" in results[0][0]


def test_metadata_norm_and_decomposed_rules_keep_shards_eager_and_compiled():
    results = world(2).run(_generic_tasks.rules_without_gather, "aot_eager", timeout=TIMEOUT)
    r = results[0]
    for key, (pl, gathered, frames) in ((k, v) for k, v in r.items() if not k.startswith("dropout")):
        assert gathered == [], key  # no op of these went through the gathering fallback
        assert frames == 1, key
    # Reductions over the last dim and layer norm keep a shard of a leading dim.
    for name in ("layer_norm", "var over last", "var_mean", "logsumexp", "vector_norm"):
        assert (r[f"{name} Shard(0)"][0], r[f"{name} Shard(1)"][0]) == ("(Shard(0),)", "(Shard(1),)"), name
    # (matmul folds (4, 3, 6) into (12, 6): a shard of the leading dim survives the merge)
    assert r["mv Shard(0)"][0] == "(Shard(0),)"
    # A loss over sharded rows is a pending sum, not a gather.
    assert r["mse_loss Shard(0)"][0] == r["bce Shard(0)"][0] == "(Partial('sum'),)"
    assert r["dropout compiled=False"] == r["dropout compiled=True"] == "(Shard(1),)"


def _one_frame_and_no_gather(r: dict) -> dict:
    """Asserts every compiled case took one frame and no case went through the gathering
    fallback; returns the ``{case: (placements, gathered)}`` entries."""
    cases = {}
    for key, v in r.items():
        if key.startswith("frames"):
            assert v == 1, key
        else:
            assert v[1] == [], key  # no op went through the gathering fallback
            cases[key] = v
    return cases


def test_cross_entropy_with_the_batch_sharded_needs_no_gather():
    r = world(2).run(_generic_tasks.losses, "aot_eager", timeout=TIMEOUT)[0]
    for key, (placements, _) in _one_frame_and_no_gather(r).items():
        if key.endswith("Shard(0)"):
            # per-row losses keep the shard; reduced ones are Partial sums of the local losses
            assert placements == ("(Shard(0),)" if " none" in key else "(Partial('sum'),)"), key


def test_embedding_keeps_shards():
    r = world(2).run(_generic_tasks.embeddings, "aot_eager", timeout=TIMEOUT)[0]
    _one_frame_and_no_gather(r)
    for pad in ("None", "3"):
        assert r[f"R table, Shard(0) ids pad={pad}"][0] == "(Shard(0),)"  # the indices' shard
        assert r[f"Shard(0) table pad={pad}"][0] == "(Partial('sum'),)"  # vocab-parallel
        assert r[f"Shard(1) table pad={pad}"][0] == "(Shard(2),)"


def test_group_norm_keeps_a_batch_shard():
    r = world(2).run(_generic_tasks.group_norms, "aot_eager", timeout=TIMEOUT)[0]
    assert r["Shard(0)"] == ("(Shard(0),)", [])  # per-sample statistics: no communication
    assert r["Shard(1)"][1] == []  # a channel shard is gathered by the rule, not the fallback
    assert r["frames Shard(0)"] == r["frames Shard(1)"] == 1


def test_mse_loss_on_equal_placements_is_one_local_op():
    r = world(2).run(_generic_tasks.mse_losses, "aot_eager", timeout=TIMEOUT)[0]
    _one_frame_and_no_gather(r)
    assert r["none Shard(0)"][0] == "(Shard(0),)" and r["none Shard(1)"][0] == "(Shard(1),)"
    assert r["mean Shard(0)"][0] == r["sum Shard(1)"][0] == "(Partial('sum'),)"
    assert r["mean Replicate()"][0] == "(Replicate(),)"
