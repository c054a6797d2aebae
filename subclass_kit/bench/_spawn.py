"""Suites that measure on a real gloo world (collectives, tp): spawn ``size`` ranks on
127.0.0.1, call one measuring function on each, return rank 0's rows; every rank is reaped."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import time
from typing import Any, Callable


def _rank(measure: Callable[[], list], rank: int, size: int, port: int, pg_timeout: float, queue) -> None:
    import torch
    import torch.distributed as dist

    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=pg_timeout)
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
        rows = measure()
        dist.barrier()
        queue.put((rank, "ok", rows))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback

        queue.put((rank, "error", "".join(traceback.format_exception(type(e), e, e.__traceback__))))


def measure_on_ranks(measure: Callable[[], Any], size: int, *, what: str, method: str,
                     pg_timeout: float, timeout: float, preload: tuple = ()) -> Any:
    """Run ``measure()`` on each of ``size`` fresh ranks in one gloo group; rank 0's result.

    Args:
        measure: a picklable callable (module-level function or a partial of one).
        size: the number of ranks.
        what: names the world in errors (``"collectives bench: a 2-rank world"``).
        method: the multiprocessing start method (``"forkserver"``, ``"spawn"``).
        pg_timeout: the process group's timeout in seconds.
        timeout: how long the whole world may take, in seconds.
        preload: modules a forkserver imports once for every rank.

    Raises:
        TimeoutError: the world did not finish in ``timeout`` seconds.
        RuntimeError: a rank died or raised (with its traceback).
    """
    import torch.distributed as dist

    ctx: Any = multiprocessing.get_context(method)  # the start method is chosen at run time
    if preload:
        ctx.set_forkserver_preload(list(preload))
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(measure, r, size, store.port, pg_timeout, queue), daemon=True)
             for r in range(size)]
    try:
        for p in procs:
            p.start()
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what} did not finish in {timeout:.0f}s")
            try:
                rank, status, payload = queue.get(timeout=min(left, 5.0))
            except Exception:  # queue.Empty: check for dead ranks
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                if dead:
                    raise RuntimeError(f"{what}: rank(s) {dead} of {size} died") from None
                continue
            if status != "ok":
                raise RuntimeError(f"{what}: rank {rank} of {size} failed:\n{payload}")
            got[rank] = payload
        return got[0]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
