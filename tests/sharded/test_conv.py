"""The ``conv`` rule family on a 2-rank gloo world: a convolution keeps a batch shard of its
input with no collective (weight and bias gradients pending sums), computes a weight's
out-channel shard locally (output sharded on channels), and makes a channel or spatial shard
of the input whole first -- where DTensor gives wrong values -- forward and backward equal
to dense, eagerly and compiled, for grouped, transposed, 1d/3d and unbatched convolutions
on uneven shards."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _conv_tasks

pytestmark = pytest.mark.dist

TIMEOUT = 300.0


def test_conv2d_module_matches_dense_on_every_input_shard_eager_and_compiled():
    r0, r1 = world(2).run(_conv_tasks.module, "aot_eager", timeout=TIMEOUT)
    assert r0 == r1
    for key, v in r0.items():
        if not key.endswith("frames"):
            assert v["gathered"] == [], key  # the rule ran, never the generic fallback
    # One graph per layout.
    assert {k: v for k, v in r0.items() if k.endswith("frames")} == {
        "S0 frames": 1, "S1 frames": 1, "S2 frames": 1, "weight S0 frames": 1}
    for how in ("eager", "compiled"):
        # A batch shard stays: no collective, pending sums for the parameters' gradients.
        assert r0[f"S0 {how}"]["out"] == "(Shard(0),)"
        assert r0[f"S0 {how}"]["grads"] == ["(Shard(0),)", "(Partial('sum'),)", "(Partial('sum'),)"]
        # A channel or spatial shard is made whole first.
        assert r0[f"S1 {how}"]["out"] == r0[f"S2 {how}"]["out"] == "(Replicate(),)"
        # An out-channel shard of the weight gives channel-sharded outputs and keeps its
        # shard in the weight's and bias's gradients.
        assert r0[f"weight S0 {how}"]["out"] == "(Shard(1),)"
        assert r0[f"weight S0 {how}"]["grads"][1:] == ["(Shard(0),)", "(Shard(0),)"]
    assert r0["S0 eager"]["comms"] == 0
    assert r0["S1 eager"]["comms"] > 0 and r0["S2 eager"]["comms"] > 0


def test_grouped_transposed_1d_3d_unbatched_match_dense_on_uneven_shards():
    r0, r1 = world(2).run(_conv_tasks.variants, timeout=TIMEOUT)
    assert r0 == r1
    assert r0.pop("gathered") == []
    assert r0.pop("partial grad_output") == "{\"(Partial('sum'),)\"}"
    for key, out in r0.items():
        batched = "unbatched" not in key
        if key.endswith("x Shard(0)") or key.endswith("bias") or key.endswith("bias grad"):
            assert out == ("(Shard(0),)" if batched else "(Replicate(),)"), key
        elif " w Shard(" in key:
            assert out == ("(Shard(1),)" if batched else "(Shard(0),)"), key
        else:
            assert out == "(Replicate(),)", key
