"""Faults: no process group, bad arguments, a rank that dies or hangs mid-collective.

Every error names the collective, what was expected and how to fix it; a dead or stuck
peer surfaces as CollectiveError within the process group's (short) timeout, and the
harness reaps every process afterwards.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from expecttest import assert_expected_inline
from torch.distributed.device_mesh import init_device_mesh

import subclass_kit
import subclass_kit.collectives as kit

from kit_helpers.harness import World, pid_alive, run_alone, world


def _without_a_process_group():
    assert not dist.is_initialized()
    x = torch.ones(4)
    calls = {
        "all_reduce": lambda: kit.all_reduce(x, "sum"),
        "all_gather_tensor": lambda: kit.all_gather_tensor(x, 0),
        "reduce_scatter_tensor": lambda: kit.reduce_scatter_tensor(x, "sum", 0),
        "all_to_all_single": lambda: kit.all_to_all_single(x, None, None),
        "broadcast": lambda: kit.broadcast(x, 0),
        "all_reduce_autograd": lambda: kit.all_reduce_autograd(x, "sum"),
        "all_gather_tensor_autograd": lambda: kit.all_gather_tensor_autograd(x, 0),
        "reduce_scatter_tensor_autograd": lambda: kit.reduce_scatter_tensor_autograd(x, "sum", 0),
        "all_to_all_single_autograd": lambda: kit.all_to_all_single_autograd(x, None, None),
        "group name": lambda: kit.all_reduce(x, "sum", "0"),
        "ranks": lambda: kit.all_reduce(x, "sum", [0, 1]),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except kit.NoProcessGroupError as e:
            assert isinstance(e, RuntimeError) and isinstance(e, subclass_kit.SubclassKitError)
            out[name] = str(e)
    return out


@pytest.mark.dist
def test_no_process_group_says_so():
    # A fresh process: torch.distributed must be uninitialized whatever this one has done.
    out = run_alone(_without_a_process_group)
    for name, msg in out.items():
        assert "init_process_group" in msg, (name, msg)
    assert_expected_inline(out["all_reduce"], """\
subclass_kit.collectives.all_reduce needs a process group, but torch.distributed has no default group on this process. Call torch.distributed.init_process_group(...) on every rank first (e.g. init_process_group('gloo') with MASTER_ADDR/MASTER_PORT, RANK and WORLD_SIZE set), or pass group= explicitly.""")
    assert out["broadcast"].startswith("subclass_kit.collectives.broadcast needs a process group")


def _argument_errors():
    x = torch.ones(3, 4)
    mesh2 = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    calls = {
        "unknown group name": lambda: kit.all_reduce(x, "sum", "no-such-group"),
        "ranks without a group": lambda: kit.all_reduce(x, "sum", [1]),
        "2-D mesh without mesh_dim": lambda: kit.all_reduce(x, "sum", mesh2),
        "mesh_dim without a mesh": lambda: kit.all_reduce(x, "sum", None, mesh_dim=0),
        "bad group type": lambda: kit.all_reduce(x, "sum", 3.5),
        "bad reduce op": lambda: kit.all_reduce(x, "mean"),
        "no gradient for op": lambda: kit.all_reduce_autograd(x, "product"),
        "not divisible": lambda: kit.reduce_scatter_tensor(x, "sum", 0),
        "dim out of range": lambda: kit.all_gather_tensor(x, 2),
        "split count": lambda: kit.all_to_all_single(x, [3], [3]),
        "split sum": lambda: kit.all_to_all_single(x, [1, 1], [1, 1]),
        "one split list": lambda: kit.all_to_all_single(x, [1, 2], None),
        "bad src": lambda: kit.broadcast(x, 5),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
        except (kit.GroupResolutionError, kit.CollectiveArgumentError) as e:
            assert isinstance(e, ValueError)
            out[name] = f"{type(e).__name__}: {e}"
        else:
            out[name] = "no error"
    return out


@pytest.mark.dist
def test_argument_errors_teach():
    r = world(2).run(_argument_errors)[0]
    assert "no error" not in r.values(), r
    text = "\n".join(f"{k}: {v}" for k, v in r.items())
    assert_expected_inline(text, """\
unknown group name: GroupResolutionError: subclass_kit.collectives.all_reduce: no process group is registered under the name 'no-such-group'. Pass the ProcessGroup itself, a DeviceMesh, a list of ranks, or the name of an existing group (ProcessGroup.group_name).
ranks without a group: GroupResolutionError: subclass_kit.collectives.all_reduce: no process group has exactly the ranks [1]. Create it on every rank first with torch.distributed.new_group([1]) (group creation is itself collective, so it cannot happen inside a collective call), then pass that group or its ranks.
2-D mesh without mesh_dim: GroupResolutionError: subclass_kit.collectives.all_reduce: a 2-D DeviceMesh names 2 groups; pass mesh_dim= (an index or one of the mesh's dim names ('dp', 'tp')) to choose one.
mesh_dim without a mesh: GroupResolutionError: subclass_kit.collectives.all_reduce: mesh_dim=0 only applies when group is a DeviceMesh, got group of type NoneType.
bad group type: GroupResolutionError: subclass_kit.collectives.all_reduce: group must be None (the default world group), a ProcessGroup, a DeviceMesh (with mesh_dim= unless 1-D), a group name, or a non-empty list of ranks; got float 3.5.
bad reduce op: CollectiveArgumentError: subclass_kit.collectives.all_reduce: unknown reduce op 'mean'; use one of ['sum', 'avg', 'product', 'min', 'max', 'band', 'bor', 'bxor'].
no gradient for op: CollectiveArgumentError: subclass_kit.collectives.all_reduce_autograd: no gradient is defined here for reduce op 'product'; use 'sum', 'avg', 'max' or 'min', or the non-differentiable all_reduce.
not divisible: CollectiveArgumentError: subclass_kit.collectives.reduce_scatter_tensor: dim 0 of the input (shape (3, 4)) must be divisible by the group size 2; pad it or pick another scatter_dim.
dim out of range: CollectiveArgumentError: subclass_kit.collectives.all_gather_tensor: gather_dim=2 is out of range for a 2-D tensor of shape (3, 4).
split count: CollectiveArgumentError: subclass_kit.collectives.all_to_all_single: need one split size per rank (2); got 1 output and 1 input split sizes.
split sum: CollectiveArgumentError: subclass_kit.collectives.all_to_all_single: input_split_sizes [1, 1] sum to 2 but dim 0 of the input is 3.
one split list: CollectiveArgumentError: subclass_kit.collectives.all_to_all_single: pass both output_split_sizes and input_split_sizes, or neither (even splits).
bad src: CollectiveArgumentError: subclass_kit.collectives.broadcast: src=5 is not a rank of the group '0' (ranks 0..1 within the group).""")


# ---- a peer that dies or hangs ---------------------------------------------------------

_PG_TIMEOUT = 4.0


def _peer_dies_mid_collective():
    x = torch.ones(1 << 20)
    if dist.get_rank() == 1:
        kit.all_reduce(x, "sum")  # issued, then this rank dies before it can complete
        os._exit(17)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        # The first may still complete from what rank 1 sent before dying; the next cannot.
        for _ in range(3):
            y = kit.all_reduce(x, "sum")
            view = y.view(-1)
            y.trigger_wait()
    except kit.CollectiveError as e:
        # A view of the failed result must fail too, never read the half-written buffer.
        try:
            view + 1
            view_says = "read garbage"
        except kit.CollectiveError as again:
            view_says = "raised" if str(again) == str(e) else str(again)
        return type(e).__name__, str(e), time.monotonic() - t0, isinstance(e, RuntimeError), view_says
    return "no error", "", time.monotonic() - t0, False, None


def _peer_never_joins():
    if dist.get_rank() == 1:
        time.sleep(_PG_TIMEOUT + 2)  # alive but never issues the collective
        return None
    t0 = time.monotonic()
    try:
        kit.all_reduce(torch.ones(8), "sum") + 1
    except kit.CollectiveError as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


@pytest.mark.dist
def test_rank_dying_mid_collective_is_a_clear_error_and_everything_is_reaped():
    w = World(2, pg_timeout=_PG_TIMEOUT)
    pids = w.pids
    (kind, msg, seconds, is_runtime, view_says), died = w.run(_peer_dies_mid_collective, expect_exit=(1,), timeout=60)
    assert died == ("exited", 17)
    assert view_says == "raised"
    assert kind == "CollectiveError" and is_runtime, msg
    assert "all_reduce on group '0' (2 ranks) did not complete" in msg
    assert "Another rank may have exited" in msg
    assert seconds < _PG_TIMEOUT + 10
    assert w.closed and not any(pid_alive(p) for p in pids)


@pytest.mark.dist
def test_rank_that_never_joins_times_out_within_the_group_timeout():
    w = World(2, pg_timeout=_PG_TIMEOUT)
    pids = w.pids
    (kind, msg, seconds), _ = w.run(_peer_never_joins, timeout=60)
    w.close()
    assert kind == "CollectiveError", msg
    assert "Timed out" in msg or "timeout" in msg.lower()
    assert _PG_TIMEOUT - 1 < seconds < _PG_TIMEOUT + 10
    assert not any(pid_alive(p) for p in pids)
