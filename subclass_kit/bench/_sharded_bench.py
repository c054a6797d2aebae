"""Eager per-op cost of the kit's ShardedTensor beside torch's DTensor, in one run.

One rank (a 1-rank gloo group in a freshly started process, always reaped), a 16x16 float
tensor under ``Replicate()`` and under ``Shard(0)`` (the right operand of ``mm`` is
``Replicate()``), ops ``add``, ``mul``, ``mm``, ``view``, ``t``, ``sum``, ``detach``, ``var``,
``layer_norm``, ``softmax``, ``mse_loss``. Every
op is timed for the kit, DTensor and a plain tensor round-robin, so load hits them alike;
``median over ops`` is the median of the kit's per-op ratios to DTensor (issue 12's figure).
"""

from __future__ import annotations

import functools
import statistics

from ._spawn import measure_on_ranks

__all__ = ["OPS", "run"]

_TIMEOUT = 600.0
_KINDS = {"plain": "plain", "DTensor": "torch", "kit ShardedTensor": "kit"}

#: The ops measured, each ``(x, y) -> result`` on tensors of one implementation.
OPS = {
    "add": lambda x, y: x + x,
    "mul": lambda x, y: x * x,
    "mm": lambda x, y: x @ y,
    "view": lambda x, y: x.view(-1),
    "t": lambda x, y: x.t(),
    "sum": lambda x, y: x.sum(),
    "detach": lambda x, y: x.detach(),
    # ops of the rule families found from torch's metadata and the norm/decomposition rules
    "var": lambda x, y: x.var(1),
    "layer_norm": lambda x, y: _F().layer_norm(x, (16,)),
    "softmax": lambda x, y: x.softmax(1),
    "mse_loss": lambda x, y: _F().mse_loss(x, x),
}


def _F():
    import torch.nn.functional as F

    return F


def _operands(quick: bool) -> dict:
    """``{placement name: {impl: (x, y)}}`` on the current 1-rank group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS

    from ..sharded import Replicate, Shard, ShardedTensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    out = {}
    for name, kit_pl, torch_pl in (("Replicate", Replicate(), TR()), ("Shard(0)", Shard(0), TS(0))):
        out[name] = {
            "plain": (a, b),
            "DTensor": (DTensor.from_local(a, mesh, [torch_pl]), DTensor.from_local(b, mesh, [TR()])),
            "kit ShardedTensor": (ShardedTensor.from_local(a, mesh, [kit_pl]),
                                  ShardedTensor.from_local(b, mesh, [Replicate()])),
        }
    return out


def _measure(quick: bool) -> list:
    import torch

    from . import ratio_rows, side_by_side

    rounds, min_run_time = (5, 0.02) if quick else (11, 0.05)
    rows = []
    for pl, impls in _operands(quick).items():
        ratios, kit_us, ref_us = [], [], []
        for op, f in OPS.items():
            fns = {impl: functools.partial(f, x, y) for impl, (x, y) in impls.items()}
            res = side_by_side(fns, rounds=rounds, min_run_time=min_run_time)
            got = ratio_rows(f"eager_op {pl}", op, res, reference="DTensor", kinds=_KINDS, world_size=1)
            rows += got
            by = {r["impl"]: r for r in got}
            ratios.append(by["kit ShardedTensor"]["ratio"])
            kit_us.append(by["kit ShardedTensor"]["median_us"])
            ref_us.append(by["DTensor"]["median_us"])
        # The case issue 12 states its target on: the median of the per-op ratios.
        common = {"group": f"eager_op {pl}", "name": "median over ops", "world_size": 1,
                  "iqr_us": 0.0, "threads": torch.get_num_threads(), "reference": "DTensor"}
        rows.append({**common, "impl": "DTensor", "kind": "torch",
                     "median_us": round(statistics.median(ref_us), 3), "ratio": 1.0})
        rows.append({**common, "impl": "kit ShardedTensor", "kind": "kit",
                     "median_us": round(statistics.median(kit_us), 3),
                     "ratio": round(statistics.median(ratios), 3)})
    return rows


def run(quick: bool = False) -> list[dict]:
    """Rows (see ``subclass_kit.bench``), ratios to DTensor, world size 1.

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
        >>> sorted({r["group"] for r in rows})  # doctest: +SKIP
        ['eager_op Replicate', 'eager_op Shard(0)']
    """
    return measure_on_ranks(functools.partial(_measure, quick), 1, what="sharded bench: a 1-rank world",
                            method="forkserver", preload=("torch", "torch.distributed"), pg_timeout=60.0,
                            timeout=_TIMEOUT)


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick=True)))
