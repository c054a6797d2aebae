"""PyTorch's DTensor unit tests for the factories, ``distribute_module``, ``from_local``'s
checks and the placements/communication where DTensor was sharper, ported to the kit and run
on DTensor in the same 2-rank world (see _dtensor_api_tasks): every port passes on both, and
the kit issues no more collectives than DTensor."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _dtensor_api_tasks

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ports():
    results = world(2).run(_dtensor_api_tasks.run, timeout=400)
    return results[0]


def test_ports_pass_on_both(ports):
    bad = {(n, lib): r for n, libs in ports.items() for lib, r in libs.items() if isinstance(r, str) and r.startswith("error")}
    assert not bad, bad
    for name in ("test_ones", "test_empty", "test_full", "test_zeros", "test_zeros_full_mesh",
                 "test_from_local_uneven_sharding_raise_error", "test_from_local_mesh_context",
                 "test_distribute_module_input_fn_output_fn"):
        assert ports[name] == {"kit": "ok", "dtensor": "ok"}, name


def test_from_local_run_check_metadata(ports):
    r = ports["test_from_local_run_check_metadata"]
    assert r["dtensor"] == {"dtype": "ValueError", "requires_grad": "ValueError"}
    assert r["kit"] == {"dtype": "ShardMetadataError", "requires_grad": "ShardMetadataError"}


def test_random_factories(ports):
    r = ports["test_rand_randn_factories"]
    # The kit's documented random stream: the global value is the dense draw under one seed.
    assert r["kit"] == {"rand": True, "randn": True}


def test_placements_as_dtensor(ports):
    for name in ("test_meta_partial_to_empty",):
        assert ports[name]["kit"] == ports[name]["dtensor"] == ["P"], ports[name]
    kit, dt = ports["test_dist_p1"]["kit"], ports["test_dist_p1"]["dtensor"]
    for p in kit:
        assert kit[p][0] == dt[p][0] == ["P"], (p, kit, dt)  # DTensor: its norm partial
        assert kit[p][1] <= dt[p][1]
    kit, dt = ports["test_multinomial"]["kit"], ports["test_multinomial"]["dtensor"]
    for case in kit:
        assert kit[case][:2] == dt[case][:2] == (["S0"], 0), (case, kit, dt)
        assert kit[case][2], case  # the kit's samples are the dense op's under the same seed


def test_communication_no_worse_than_dtensor(ports):
    kit, dt = ports["test_partial_mul"]["kit"], ports["test_partial_mul"]["dtensor"]
    assert kit == dt, (kit, dt)
    kit, dt = ports["test_view_ops_no_gather"]["kit"], ports["test_view_ops_no_gather"]["dtensor"]
    for case in dt:
        assert kit[case][0] == dt[case][0], (case, kit, dt)
        assert kit[case][1] <= dt[case][1], (case, kit, dt)
    kit, dt = ports["test_layer_norm_fwd_bwd"]["kit"], ports["test_layer_norm_fwd_bwd"]["dtensor"]
    worse = {c: (kit[c], dt[c]) for c in dt if kit[c][0] > dt[c][0] or kit[c][1] > dt[c][1]}
    assert not worse, worse
