"""The kit changes the ports of PyTorch's DTensor unit tests asked for, each checked on its
own (2 gloo ranks; see _port_fix_tasks)."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _port_fix_tasks

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def fixes():
    return world(2).run(_port_fix_tasks.run, timeout=120)


def test_run_check_compares_strides(fixes):
    # test_dtensor.py's test_metadata_consistency_check: one rank's shard transposed
    assert [r["run_check_stride"] for r in fixes] == [True, True]


def test_factory_on_a_sub_mesh(fixes):
    # test_init.py's test_zeros_submesh: the rank outside the mesh holds an empty local
    assert [r["factory_outside_sub_mesh"] for r in fixes] == [((8, 3), (8, 3)), ((8, 3), (0,))]


def test_distribute_takes_the_ambient_mesh(fixes):
    assert [r["distribute_ambient_mesh"] for r in fixes] == [((2, 2), True)] * 2


def test_multinomial_with_replacement_keeps_rows(fixes):
    # test_random_ops.py's test_multinomial_sharded: Shard(0) kept, the dense draw's values
    assert [r["multinomial_replacement_rows"] for r in fixes] == [(True, True)] * 2


def test_partial_gradient_of_partial_redistribute(fixes):
    # test_redistribute.py's test_partial_to_partial_forward_backward: no collective
    import subclass_kit.sharded as sk

    for grad_pl, comms, empty_pl, ones in (r["partial_grad_stays_partial"] for r in fixes):
        assert grad_pl == (sk.Partial(),) and comms == 0 and empty_pl == (sk.Partial(),) and ones
