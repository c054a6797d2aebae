"""Load AOTInductor packages in a process that has never imported subclass_kit.

Imports torch only: a package must run where the kit is not installed. Used as a script
(``python _reload.py CASES.json``, prints a JSON report) and as the ranks of a fresh gloo
world (``--rank``), where the packages' collectives need a process group.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def load_and_compare(cases: list, barrier=None) -> dict:
    """For each case ``{"name", "package", "data"}`` (``data``: a torch.save'd list of
    ``(input, expected)`` pairs): load, run every input, report the largest error and the
    load and first-call times. Every package is loaded before any runs; ``barrier`` (ranks)
    is called in between, so no rank waits in a packaged collective while another is still
    loading (the first load takes seconds)."""
    import torch._inductor

    report, loaded = {}, []
    for case in cases:
        t0 = time.perf_counter()
        loaded.append(torch._inductor.aoti_load_package(case["package"]))
        report[case["name"]] = {"load_s": time.perf_counter() - t0}
    if barrier is not None:
        barrier()
    for case, run in zip(cases, loaded):
        pairs = torch.load(case["data"], weights_only=True)
        errors, first = [], None
        for x, expected in pairs:
            if barrier is not None:
                # torch 2.13: a package's gloo collective called right after the previous
                # one can deadlock (the caller holds the GIL while enqueueing; gloo's worker
                # holds the queue lock while it waits for the GIL). A Python-level barrier
                # in between lets the worker finish first.
                barrier()
            t2 = time.perf_counter()
            out = run(x)
            if first is None:
                first = time.perf_counter() - t2
            assert type(out) is torch.Tensor, type(out)
            assert out.shape == expected.shape, (case["name"], out.shape, expected.shape)
            errors.append((out - expected).abs().max().item())
        report[case["name"]].update(max_error=max(errors), first_call_s=first)
    report["kit_imported"] = any(m == "subclass_kit" or m.startswith("subclass_kit.") for m in sys.modules)
    return report




def _rank_main(rank: int, size: int, port: int, cases_file: str) -> None:
    """One rank of a fresh gloo world (``python _reload.py --rank R SIZE PORT CASES.json``):
    load this rank's packages, wait for every rank, run them, print the report."""
    import datetime
    import faulthandler

    import torch.distributed as dist

    # A rank about to be killed for hanging says where every thread is (stderr).
    faulthandler.dump_traceback_later(float(os.environ.get("RELOAD_DUMP_AFTER", "180")), exit=False)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
    with open(cases_file) as f:
        cases = json.load(f)[rank]
    barrier = lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=300))  # noqa: E731
    report = load_and_compare(cases, barrier=barrier)
    print(json.dumps(report), flush=True)
    # Leave without process-group teardown (it can block). gloo sends asynchronously: a
    # rank that exits right after its last collective may take its last message with it.
    # After a final barrier every rank has received all it needs except rank 0's ack, so
    # rank 0 (also the store's host) leaves last, once every other rank has said so.
    barrier()
    if rank == 0:
        store.wait([f"left{r}" for r in range(1, size)], datetime.timedelta(seconds=300))
    else:
        store.set(f"left{rank}", "1")
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        _rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        with open(sys.argv[1]) as f:
            print(json.dumps(load_and_compare(json.load(f))))
