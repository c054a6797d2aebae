"""Rank tasks for test_aoti_dist.py (module-level so the gloo harness pickles them by name)."""

from __future__ import annotations

import copy
import os
import time

import torch
import torch.distributed as dist
from torch import nn

BATCH = torch.export.Dim("batch", min=2, max=256)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


class AllReduceThenScale(nn.Module):
    """A module calling the kit's collective: sum over ranks, then a local op."""

    def forward(self, x):
        from subclass_kit.collectives import all_reduce

        return all_reduce(x, "sum") * 2 + 1


def _inputs(seed, *batches):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 6, generator=g) for b in batches]


def sync() -> None:
    """A barrier that tolerates a slow peer: compiles and first loads take different
    times on each rank, longer than the group's 30 s collective timeout."""
    import datetime

    dist.monitored_barrier(timeout=datetime.timedelta(seconds=300))


def _package(name, ep, out_dir, pairs) -> dict:
    from subclass_kit.deploy import aoti_package, load_package

    rank = dist.get_rank()
    t0 = time.perf_counter()
    path = aoti_package(ep, os.path.join(out_dir, f"{name}-rank{rank}.pt2"))
    seconds = time.perf_counter() - t0
    data = os.path.join(out_dir, f"{name}-rank{rank}.data")
    torch.save(pairs, data)
    run = load_package(path)
    err = 0.0
    for x, e in pairs:
        # Every rank must have the package loaded before its collective runs; between calls,
        # see the deadlock note in _reload.load_and_compare.
        sync()
        err = max(err, (run(x) - e).abs().max().item())
    return {
        "case": {"name": name, "package": path, "data": data},
        "in_process_error": err, "compile_s": seconds, "package_bytes": os.path.getsize(path),
    }


def build_packages(out_dir: str) -> dict:
    """On every rank: the TP MLP (Colwise+Rowwise over the 2-rank mesh) and the all_reduce
    module, each exported strict and non-strict (batch dynamic) and checked against eager;
    the non-strict programs (torch.export's default) are AOT-packaged and run."""
    from torch.distributed.device_mesh import init_device_mesh

    from subclass_kit.sharded import ColwiseParallel, RowwiseParallel, ShardedTensor, parallelize

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dense = _mlp()
    tp = parallelize(copy.deepcopy(dense), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert all(isinstance(p, ShardedTensor) for p in tp.parameters())
    ar = AllReduceThenScale()
    k = dist.get_world_size()

    def reduced(x):  # the reference, from torch.distributed's own collective
        parts = [torch.empty_like(x) for _ in range(k)]
        dist.all_gather(parts, x)
        return sum(parts) * 2 + 1

    report = {}
    with torch.no_grad():
        (x0,) = _inputs(0, 5)
        tp_pairs = [(x, dense(x)) for x in _inputs(1, 3, 70)]  # TP input: replicated
        ar_pairs = [(x, reduced(x)) for x in _inputs(10 + dist.get_rank(), 3, 70)]  # per rank
        eps = {}
        for strict in (True, False):
            mode = "strict" if strict else "nonstrict"
            eps["tp", strict] = torch.export.export(tp, (x0,), strict=strict, dynamic_shapes=({0: BATCH},))
            report[f"tp_{mode}_export_error"] = max(
                (eps["tp", strict].module()(x) - e).abs().max().item() for x, e in tp_pairs
            )
            eps["ar", strict] = torch.export.export(ar, (x0,), strict=strict, dynamic_shapes=({0: BATCH},))
            report[f"ar_{mode}_targets"] = sorted(
                {str(n.target) for n in eps["ar", strict].graph.nodes if n.op == "call_function"}
            )
            report[f"ar_{mode}_export_error"] = max(
                (eps["ar", strict].module()(x) - e).abs().max().item() for x, e in ar_pairs
            )
        report["tp"] = _package("tp_mlp", eps["tp", False], out_dir, tp_pairs)
        report["ar"] = _package("all_reduce", eps["ar", False], out_dir, ar_pairs)
    return report
