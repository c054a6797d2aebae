"""ShardedTensor across real gloo worlds of 2 and 3 ranks (3 gives uneven shards).

Each test runs one task on every rank of a shared spawned world; the task compares with
dense references and raises on the first mismatch (the failure carries the rank's
traceback), then returns a summary asserted here.
"""

from __future__ import annotations

import pytest
from expecttest import assert_expected_inline

from kit_helpers.harness import world

from sharded import _tasks

pytestmark = pytest.mark.dist

TIMEOUT = 150.0  # per task; the harness kills and reaps every rank past it


@pytest.mark.parametrize("size", [2, 3])
def test_values_redistribution_ops_autograd(size):
    results = world(size).run(_tasks.values, timeout=TIMEOUT)
    ops = results[0]["ops"]
    assert all(r["ops"] == ops for r in results)  # the same rule on every rank
    assert_expected_inline("\n".join(f"{k}: {v}" for k, v in ops.items()), """\
S0 + R row: Shard(0)
S1 + plain row: Shard(1)
S1 * S0: Shard(1)
P + P: Partial('sum')
P + R: Partial('sum')
P * 2: Partial('sum')
P + 1: Replicate()
avg + 1: Partial('avg')
relu P: Replicate()
where: Shard(0)
mm S0 R: Shard(0)
mm R S1: Shard(1)
mm S1 S0: Partial('sum')
mm S1 R: Partial('sum')
mm S0 S0: Partial('sum')
mm P R: Partial('sum')
addmm colwise: Shard(1)
addmm rowwise: Partial('sum')
bmm batch: Shard(0)
t: Shard(1)
view keeps H: Shard(1)
view merges: _StridedShard(dim=0, sf=2)
view merges leading: Shard(0)
view splits leading: Shard(0)
flatten leading: Shard(0)
view merges uneven: Replicate()
unsqueeze: Shard(2)
expand: Shard(1)
slice sharded: Replicate()
slice other: Shard(0)
sum sharded: Partial('sum')
sum all: Partial('sum')
sum other: Shard(0)
mean sharded: Partial('sum')
amax sharded: Partial('max')
sum of P: Partial('sum')
softmax sharded: Replicate()
softmax other: Shard(0)
zeros_like P: Replicate()
cat sharded: Replicate()
cat other: Shard(0)
stack: Shard(2)
mul_ add_: Shard(0)
mul_ through merged view: Shard(0)""")
    assert results[0]["autograd"] == {"a.grad": "Shard(1)", "b.grad": "Shard(0)"}
    rows = [6 // size + (r < 6 % size) for r in range(size)]
    assert [r["mesh"]["2-D local"] for r in results] == [(n, 5) for n in rows]
    errors = [r["errors"] for r in results]
    last = errors[-1]
    assert all(e["inconsistent"] == "ok" for e in errors[:-1])
    assert "is not this rank's shard" in last["inconsistent"] and "Pass shape= with the true global shape" in last["inconsistent"]
    assert errors[0]["replicas"] == "ok"
    assert all("placements[0] is Replicate() but the local tensor" in e["replicas"] for e in errors[1:])


def test_device_mesh_is_the_equal_mesh_handed_in_last():
    # Was order-dependent: the first equal mesh ever described (e.g. by a docs example)
    # came back from .device_mesh.
    results = world(2).run(_tasks.equal_meshes, timeout=TIMEOUT)
    assert all(r == {"second": True, "same ref": True, "first again": True, "values": True} for r in results), results


@pytest.mark.dist
def test_tensor_parallel_mlp_matches_dense_eager_and_compiled():
    (summary, *_) = world(2).run(_tasks.mlp, 8, "record", timeout=TIMEOUT)
    assert summary == {
        "weights": ["Shard(0)", "Shard(0)", "Shard(1)", "Replicate()"],
        "local rows": 4,
        "frames": 1,
        # One all-reduce forward (the Rowwise output), one backward (the input's gradient).
        "fw all_reduce": 1,
        "bw all_reduce": 1,
        "fw waits": 1,
    }


def test_tensor_parallel_mlp_uneven_features_on_three_ranks():
    # 10 hidden features over 3 ranks: shards of 4, 4 and 2.
    results = world(3).run(_tasks.mlp, 10, "aot_eager", timeout=TIMEOUT)
    assert [r["local rows"] for r in results] == [4, 4, 2]
    assert all(r["frames"] == 1 for r in results)


def test_compiled_regions_take_and_return_sharded_tensors():
    (summary, *_) = world(2).run(_tasks.compiled, timeout=TIMEOUT)
    assert summary == {
        "mm placements": "(Partial('sum'),)",
        "view placements": ["(Shard(0),)", "(Replicate(),)", "(Shard(1),)"],
        "merged placements": "(Shard(0),)",
        "merged grad placements": "(Shard(0),)",
        "frames": [1, 1, 1, 1, 1],
    }


@pytest.mark.slow
def test_tensor_parallel_mlp_inductor():
    (summary, *_) = world(2).run(_tasks.mlp, 8, "inductor", timeout=TIMEOUT * 2)
    assert summary["frames"] == 1
