"""A peer that dies while a *compiled* function runs collectives (issue 21, item 6).

Inside a compiled graph the waits are torch's ``wait_tensor`` nodes, so the process
group's own ``RuntimeError`` reaches the caller (asserted below as the documented
behaviour); ``collectives.collective_errors(fn)`` wraps the call so it raises
``CollectiveError`` as eager does, and marks a pending input whose wait the graph consumed
as failed, so it is never read as if complete. Never a hang: the group's timeout is short.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import subclass_kit.collectives as kit

from kit_helpers.harness import World, pid_alive

# Short enough that a fault fails fast, long enough that the warm-up compile (each rank
# compiles, then runs the collective) does not time out when one rank compiles seconds
# slower than the other on a loaded 2-core machine.
_PG_TIMEOUT = 12.0


def _issues(x):
    return kit.all_reduce(x, "sum") * 2


def _takes(y):
    return y + 1


def _outcome(call):
    t0 = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, isinstance(e, RuntimeError), str(e), time.monotonic() - t0
    return "no error", False, "", time.monotonic() - t0


def _peer_dies_under_compile():
    x = torch.ones(1 << 16)
    issues = torch.compile(_issues, fullgraph=True, backend="aot_eager")
    takes = torch.compile(_takes, fullgraph=True, backend="aot_eager")
    issues(x), takes(kit.all_reduce(x, "sum"))  # both compiled while both ranks live
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(17)
    time.sleep(0.3)
    out = {}
    y = kit.all_reduce(x, "sum")  # issued (asynchronously) on a group whose peer is gone
    out["takes, wrapped"] = _outcome(lambda: kit.collective_errors(takes)(y))
    out["its input, later"] = _outcome(lambda: y + 1)
    out["issues, wrapped"] = _outcome(lambda: kit.collective_errors(issues)(x))
    out["issues, bare"] = _outcome(lambda: issues(x))
    return out


@pytest.mark.dist
def test_a_dead_peer_under_compile_is_a_collective_error_when_wrapped():
    w = World(2, pg_timeout=_PG_TIMEOUT)
    pids = w.pids
    out, died = w.run(_peer_dies_under_compile, expect_exit=(1,), timeout=120)
    assert died == ("exited", 17)
    for case in ("takes, wrapped", "issues, wrapped"):
        kind, is_runtime, msg, seconds = out[case]
        assert kind == "CollectiveError" and is_runtime, (case, out[case])
        assert "a collective inside _takes" in msg or "a collective inside _issues" in msg, msg
        assert "Another rank may have exited" in msg
        assert seconds < _PG_TIMEOUT + 10
    # The graph consumed the input's wait; its later use raises instead of reading the
    # buffer as if the all_reduce had completed.
    kind, _, msg, _ = out["its input, later"]
    assert kind == "CollectiveError" and msg == out["takes, wrapped"][2]
    # Unwrapped, the process group's own error reaches the caller (documented), never a hang.
    kind, is_runtime, msg, seconds = out["issues, bare"]
    assert kind == "RuntimeError" and is_runtime and "gloo" in msg, out["issues, bare"]
    assert seconds < _PG_TIMEOUT + 10
    assert w.closed and not any(pid_alive(p) for p in pids)


def test_other_errors_pass_through_unchanged():
    def bad(x):
        return x @ torch.ones(3, 3)

    wrapped = kit.collective_errors(torch.compile(bad, backend="eager"))
    with pytest.raises(RuntimeError) as info:
        wrapped(torch.ones(2, 2))
    assert not isinstance(info.value, kit.CollectiveError)
    assert torch.equal(wrapped(torch.ones(2, 3)), torch.ones(2, 3) @ torch.ones(3, 3))


def _peer_never_joins_under_compile():
    x = torch.ones(8)
    issues = torch.compile(_issues, fullgraph=True, backend="aot_eager")
    issues(x)
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(_PG_TIMEOUT + 2)  # alive, but never issues the collective
        return None
    return _outcome(lambda: kit.collective_errors(issues)(x))


@pytest.mark.dist
def test_a_silent_peer_under_compile_times_out_as_a_collective_error():
    w = World(2, pg_timeout=_PG_TIMEOUT)
    pids = w.pids
    (kind, is_runtime, msg, seconds), _ = w.run(_peer_never_joins_under_compile, timeout=60)
    w.close()
    assert kind == "CollectiveError" and is_runtime, msg
    assert "Timed out" in msg or "timeout" in msg.lower()
    assert _PG_TIMEOUT - 1 < seconds < _PG_TIMEOUT + 10
    assert not any(pid_alive(p) for p in pids)
