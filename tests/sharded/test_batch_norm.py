"""Batch norm and the variance over a sharded dim on a 2-rank gloo world, against dense.

Batch norm runs as torch's decomposition on the ShardedTensors: its statistics are sums over
the batch and spatial dims, so with either sharded they cost an all-reduce of per-channel
sums (``var``/``var_mean`` over a sharded dim take the two-sum rule) and the activations
never move; a channel shard needs no communication at all. DTensor's batch-norm strategy
keeps only a channel shard and gathers a batch or spatial one to Replicate first."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _bn_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 300.0
C = _bn_tasks.SHAPE[1]


def test_batch_norm_train_eval_backward_and_compiled_match_dense_without_gathering():
    r = world(2).run(_bn_tasks.batch_norms, "aot_eager", timeout=TIMEOUT)[0]
    for key, v in r.items():
        if key.startswith("frames"):
            assert v == 1, key  # one graph for two steps with new values
            continue
        assert v["gathered"] == [] and v["whole"] == [], key
        # Only per-channel statistics travel: no collective carries more than 4 per channel
        # (the variance's count, mean, deviation sum and M2 of each rank's rows).
        assert all(n <= 4 * C for n in v["comms"].values()), (key, v["comms"])
    # Statistics over a sharded batch or spatial dim: the variance's one all-gather of them.
    for key in ("train Shard(0)", "train Shard(2)"):
        assert r[key]["comms"].get("all_gather_into_tensor") == 4 * C, (key, r[key]["comms"])
    # Per-channel work on a channel shard, and eval mode, communicate nothing in the op.
    for key in ("eval Shard(0)", "eval Shard(1)", "eval Shard(2)", "train Replicate()"):
        assert r[key]["comms"] == {}, (key, r[key]["comms"])


def test_variance_over_a_sharded_dim_gathers_only_statistics():
    r = world(2).run(_bn_tasks.variances, timeout=TIMEOUT)[0]
    # Reducing the sharded dim: the results are whole, and only four result-sized statistics
    # per rank travel (count, mean, deviation sum, M2), in one all-gather.
    assert r["var dim 0 of Shard(0)"] == (["(Replicate(),)"], {"all_gather_into_tensor": 4 * 6 * 4})
    assert r["var_mean dims 0,1 of Shard(0)"] == (["(Replicate(),)", "(Replicate(),)"], {"all_gather_into_tensor": 4 * 4})
    assert r["var dims 0,2 keepdim of Shard(0)"] == (["(Replicate(),)"], {"all_gather_into_tensor": 4 * 6})
    # A dim the op does not reduce keeps its shard, shifted past the removed ones.
    assert r["var dim 0 of Shard(1)"] == (["(Shard(0),)"], {})
    assert r["std_mean dim 1 keepdim of Shard(0)"] == (["(Shard(0),)", "(Shard(0),)"], {})


@pytest.mark.slow
def test_batch_norm_inductor():
    r = world(2).run(_bn_tasks.batch_norms, "inductor", ("Shard(0)",), timeout=TIMEOUT * 2)[0]
    assert r["frames Shard(0)"] == 1
    assert r["train Shard(0)"]["comms"].get("all_gather_into_tensor") == 4 * C  # the variance's statistics
