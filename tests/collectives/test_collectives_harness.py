"""The harness itself: results come back in rank order, failures carry the child's
traceback, and every process is reaped whatever happens."""

import os
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from kit_helpers.harness import RankCrashWarning, RankFailure, World, pid_alive, world

pytestmark = pytest.mark.dist


def _rank_and_size():
    return dist.get_rank(), dist.get_world_size()


def _sum_of_ranks():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("deliberate failure on rank 1")
    return "fine"


def _sleep(seconds):
    time.sleep(seconds)


def _sum_after_abort(marker, always):
    # os.abort is what glibc does on detecting heap corruption: SIGABRT, no Python error.
    if dist.get_rank() == 1 and (always or not os.path.exists(marker)):
        open(marker, "w").close()
        os.abort()
    return _sum_of_ranks()


@pytest.mark.parametrize("size", [2, 3])
def test_results_in_rank_order(size):
    w = world(size)
    assert w.run(_rank_and_size) == [(r, size) for r in range(size)]
    assert w.run(_sum_of_ranks) == [float(sum(range(size)))] * size


def test_child_traceback_reaches_the_failure():
    w = World(2)
    pids = w.pids
    with pytest.raises(RankFailure) as info, warnings.catch_warnings():
        warnings.simplefilter("error", RankCrashWarning)  # a Python error is never retried
        w.run(_fail_on_rank_1)
    msg = str(info.value)
    assert "rank 1 raised" in msg and "deliberate failure on rank 1" in msg
    assert "_fail_on_rank_1" in msg  # the traceback names the frame in the child
    assert w.closed and not any(pid_alive(p) for p in pids)


def test_timeout_kills_and_reaps_every_rank():
    w = World(2)
    pids = w.pids
    with pytest.raises(RankFailure, match="had not answered"):
        w.run(_sleep, 60, timeout=2)
    assert not any(pid_alive(p) for p in pids)


def test_a_native_crash_is_reported_and_run_once_more_in_a_fresh_world(tmp_path):
    w = World(2)
    pids = w.pids
    with pytest.warns(RankCrashWarning, match="rank 1 exited with code -6"):
        assert w.run(_sum_after_abort, str(tmp_path / "crashed"), False) == [1.0, 1.0]
    assert not any(pid_alive(p) for p in pids) and set(w.pids).isdisjoint(pids)
    assert w.run(_sum_of_ranks) == [1.0, 1.0]  # the fresh world stays usable
    w.close()


def test_a_second_native_crash_fails():
    w = World(2)
    with pytest.warns(RankCrashWarning), pytest.raises(RankFailure, match="rank 1 exited with code -6"):
        w.run(_sum_after_abort, os.devnull, True)
    assert w.closed
