"""Real gloo worlds on 127.0.0.1 for the collectives tests.

A :class:`World` spawns ``size`` ranks once (from a forkserver that has already imported
torch, so a rank starts in milliseconds rather than re-importing torch), joins them into one
gloo process group with a short timeout, and then runs many tasks on it::

    world = World(2)
    results = world.run(_check_all_reduce, 3.0)   # _check_all_reduce runs on every rank
    world.close()

A task is a module-level function (it is pickled by reference), called on every rank with
the same arguments; ``run`` returns the per-rank return values, rank order. Every failure
mode ends with every process reaped:

- a task that raises on some rank: ``run`` raises :class:`RankFailure` whose message carries
  each failing rank's formatted traceback, so pytest shows where in the child it failed;
- a rank that exits or is killed: reported with its exit code (a task may declare the ranks
  it expects to die with ``expect_exit``);
- a task that does not finish within ``timeout`` seconds: every rank is killed and
  :class:`RankFailure` says which ranks had not answered.

After any failure the world is closed (a broken collective leaves the group unusable) and
:func:`world` hands out a fresh one next time.

One failure is retried: a rank *killed by a signal* (a native crash in torch or gloo, e.g.
glibc's ``malloc(): unaligned tcache chunk detected`` -> SIGABRT) while no rank raised a
Python error of its own. The kit is pure Python and cannot corrupt the heap; such a crash was
seen about once in 600 runs of one task here (valgrind clean, not reproducible on demand), and
one crash would otherwise fail a whole CI run. ``run`` then warns with
:class:`RankCrashWarning` (the warning summary shows it, with the crashed rank's signal) and
runs the task once more in a fresh world; a second crash, or any ordinary failure, raises as
usual. :func:`run_alone` runs one function in a
fresh process with no process group at all. Ranks also kill themselves if the pytest
process disappears, so an interrupted run leaves no orphans.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import traceback
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["World", "RankFailure", "RankCrashWarning", "world", "close_all", "pid_alive", "run_alone"]

# Short enough that a hung collective fails a test quickly, long enough for a loaded
# 2-core machine to finish a compile on one rank while the other waits in a collective.
PG_TIMEOUT = 30.0
TASK_TIMEOUT = 120.0

_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.device_mesh"]


class RankFailure(AssertionError):
    """A task failed on at least one rank, a rank died, or the task timed out."""


class RankCrashWarning(UserWarning):
    """A rank was killed by a signal (a native crash); the task was run again in a fresh world."""


def _context():
    ctx = multiprocessing.get_context("forkserver")
    # Only effective before the forkserver starts; harmless afterwards.
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a running (not zombie, not reaped) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _die_with(parent_pid: int) -> None:
    # The forkserver is our parent; if it dies, so do we (PR_SET_PDEATHSIG = 1).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass

    def watch():
        while True:
            time.sleep(0.5)
            if not pid_alive(parent_pid):
                os._exit(99)

    threading.Thread(target=watch, daemon=True, name="harness-watchdog").start()


def _rank_main(rank: int, size: int, host: str, port: int, pg_timeout: float, conn, parent_pid: int):
    _die_with(parent_pid)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=datetime.timedelta(seconds=pg_timeout))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=size,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent verbatim
        conn.send(("error", _describe(e)))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        fn, args, kwargs = msg
        torch._dynamo.reset()
        try:
            value = fn(*args, **kwargs)
            try:
                conn.send(("ok", value))
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                conn.send(("error", _describe(e)))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", _describe(e)))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort at shutdown
        pass


def _describe(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))


class World:
    """``size`` ranks in one gloo group on 127.0.0.1, reused across tasks.

    Args:
        size: number of ranks.
        pg_timeout: the process group's timeout in seconds (collectives that cannot
            complete raise after this long).

    Example:
        >>> w = World(2)                                   # doctest: +SKIP
        >>> w.run(_rank_and_size)                          # doctest: +SKIP
        [(0, 2), (1, 2)]
        >>> w.close()                                      # doctest: +SKIP
    """

    def __init__(self, size: int, *, pg_timeout: float = PG_TIMEOUT, start_timeout: float = 120.0):
        self.size = size
        self.pg_timeout = pg_timeout
        self._start_timeout = start_timeout
        self._start()

    def _start(self) -> None:
        """Spawn the ranks and join them into a new group (also after a native crash)."""
        size, pg_timeout, start_timeout = self.size, self.pg_timeout, self._start_timeout
        self.closed = False
        ctx = _context()
        # The store lives in this process; port 0 lets the OS pick a free port race-free.
        self._store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=pg_timeout))
        port = self._store.port
        self._procs = []
        self._conns = []
        try:
            for rank in range(size):
                parent, child = ctx.Pipe()
                p = ctx.Process(
                    target=_rank_main,
                    args=(rank, size, "127.0.0.1", port, pg_timeout, child, os.getpid()),
                    name=f"collectives-rank{rank}", daemon=True,
                )
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            replies = self._collect(start_timeout, expect_exit=())
            bad = {r: v for r, v in replies.items() if v[0] != "ready"}
            if bad:
                raise RankFailure(self._report("starting the group", replies))
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, rank order."""
        return [p.pid for p in self._procs]

    def run(self, fn: Callable, *args: Any, timeout: float = TASK_TIMEOUT,
            expect_exit: tuple[int, ...] = (), **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Ranks listed in ``expect_exit`` may die during the task; their result is
        ``("exited", exitcode)``. Any other failure closes the world and raises RankFailure.
        """
        return self._run(fn, args, kwargs, timeout, expect_exit, retry=not expect_exit)

    def _run(self, fn, args, kwargs, timeout, expect_exit, *, retry: bool) -> list:
        if self.closed:
            raise RankFailure(f"this {self.size}-rank world is closed (an earlier task failed)")
        for c in self._conns:
            c.send((fn, args, kwargs))
        replies = self._collect(timeout, expect_exit=expect_exit)
        failed = any(
            v[0] != "ok" and not (v[0] == "exited" and r in expect_exit) for r, v in replies.items()
        )
        if failed or expect_exit:
            # A died or failed rank leaves the group unusable for the survivors.
            self.close()
        if failed:
            what = f"running {getattr(fn, '__qualname__', fn)}"
            if retry and _native_crash(replies):
                warnings.warn(RankCrashWarning(
                    f"{self._report(what, replies)}\n(a native crash; running the task once more "
                    "in a fresh world)"), stacklevel=3)
                self._start()
                return self._run(fn, args, kwargs, timeout, expect_exit, retry=False)
            raise RankFailure(self._report(what, replies))
        return [v[1] if v[0] == "ok" else v for _, v in sorted(replies.items())]

    def _collect(self, timeout: float, *, expect_exit) -> dict:
        deadline = time.monotonic() + timeout
        replies: dict[int, tuple] = {}
        waiting = {c: r for r, c in enumerate(self._conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        while len(replies) < self.size:
            left = deadline - time.monotonic()
            if left <= 0:
                for r in range(self.size):
                    replies.setdefault(r, ("timeout", None))
                self.close(force=True)
                break
            ready = multiprocessing.connection.wait(list(waiting) + list(sentinels), timeout=left)
            for obj in ready:
                if obj in waiting:
                    r = waiting.pop(obj)
                    try:
                        replies[r] = obj.recv()
                    except EOFError:
                        pass  # its sentinel reports the exit
                elif obj in sentinels:
                    r = sentinels.pop(obj)
                    if r in replies:
                        continue
                    conn = self._conns[r]
                    if conn in waiting and conn.poll():
                        replies[r] = conn.recv()
                        waiting.pop(conn)
                        continue
                    self._procs[r].join(1)
                    replies[r] = ("exited", self._procs[r].exitcode)
                    waiting.pop(conn, None)
        return replies

    def _report(self, what: str, replies: dict) -> str:
        lines = [f"{self.size}-rank gloo world failed while {what}:"]
        for r, v in sorted(replies.items()):
            kind = v[0]
            if kind == "error":
                lines.append(f"--- rank {r} raised:\n{v[1]}")
            elif kind == "exited":
                lines.append(f"--- rank {r} exited with code {v[1]} before answering")
            elif kind == "timeout":
                lines.append(f"--- rank {r} had not answered when the task timed out (all ranks killed)")
            else:
                lines.append(f"--- rank {r}: {kind}")
        return "\n".join(lines)

    def close(self, *, force: bool = False) -> None:
        """Stop every rank (politely unless ``force``, then by SIGKILL) and reap it."""
        if self.closed:
            return
        self.closed = True
        if not force:
            for c in self._conns:
                try:
                    c.send(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5.0)
        for c in self._conns:
            c.close()
        self._store = None


def _alone_main(fn, args, conn, parent_pid):
    _die_with(parent_pid)
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent verbatim
        conn.send(("error", _describe(e)))


def run_alone(fn: Callable, *args: Any, timeout: float = TASK_TIMEOUT):
    """Run ``fn(*args)`` in a fresh process with no process group; return its result.

    For checks that need torch.distributed *uninitialized*, whatever the test process
    itself has set up. Raises RankFailure with the child's traceback if ``fn`` raises.
    """
    ctx = _context()
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_alone_main, args=(fn, args, child, os.getpid()), daemon=True)
    p.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise RankFailure(f"{getattr(fn, '__qualname__', fn)} did not finish within {timeout}s")
        kind, value = parent.recv()
    except EOFError:
        p.join(5)
        raise RankFailure(f"{getattr(fn, '__qualname__', fn)}: the process exited with code {p.exitcode}") from None
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)
        parent.close()
    if kind != "ok":
        raise RankFailure(f"{getattr(fn, '__qualname__', fn)} raised in its own process:\n{value}")
    return value


def _native_crash(replies: dict) -> bool:
    """True when some rank was killed by a signal and no rank raised a Python error of its
    own (the survivors' errors then only say that the peer went away)."""
    crashed = [r for r, v in replies.items() if v[0] == "exited" and (v[1] or 0) < 0]
    own = [r for r, v in replies.items() if v[0] == "error" and not _peer_gone(v[1])]
    return bool(crashed) and not own and not any(v[0] == "timeout" for v in replies.values())


def _peer_gone(text: str) -> bool:
    # What gloo says on a surviving rank when its peer's process is gone.
    return any(m in text for m in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


_WORLDS: dict[int, World] = {}


def world(size: int) -> World:
    """A live World of ``size`` ranks shared by the tests (re-spawned after a failure)."""
    w = _WORLDS.get(size)
    if w is None or w.closed:
        w = _WORLDS[size] = World(size)
    return w


def close_all() -> None:
    """Close every shared World (called at the end of the test session)."""
    for w in list(_WORLDS.values()):
        w.close()
    _WORLDS.clear()
