"""Eager per-op cost of the kit's ShardedTensor beside torch's DTensor, in one run.

One rank (a 1-rank gloo group in a freshly started process, always reaped), a 16x16 float
tensor ``x`` under ``Replicate()`` and under ``Shard(0)``, a 16x16 ``y`` under
``Replicate()`` (the right operand of ``mm``, the table of ``embedding``) and 16 class
indices ``i`` under ``x``'s placement (the targets of ``cross_entropy``/``nll_loss``, the
indices of ``embedding``: a batch-sharded loss, a replicated table). Ops: ``add``, ``mul``,
``mm``, ``view``, ``t``, ``sum``, ``detach``, and the families issue 20 names: ``var``,
``std``, ``layer_norm``, ``softmax``, ``cross_entropy``, ``nll_loss``, ``embedding``,
``dropout`` (training), ``mse_loss``. Every op is timed for the kit, DTensor and a plain
tensor round-robin, so load hits them alike; a row's ``ratio`` is the median over rounds of
the round's ratio (its ``median_us`` the median over all rounds), and ``median over ops``
is the median of the kit's per-op ratios to DTensor (issues 12 and 20's figure).
"""

from __future__ import annotations

import functools
import statistics

from ._spawn import measure_on_ranks

__all__ = ["OPS", "run"]

_TIMEOUT = 600.0
_KINDS = {"plain": "plain", "DTensor": "torch", "kit ShardedTensor": "kit"}

#: The ops measured, each ``(x, y, i) -> result`` on tensors of one implementation.
OPS = {
    "add": lambda x, y, i: x + x,
    "mul": lambda x, y, i: x * x,
    "mm": lambda x, y, i: x @ y,
    "view": lambda x, y, i: x.view(-1),
    "t": lambda x, y, i: x.t(),
    "sum": lambda x, y, i: x.sum(),
    "detach": lambda x, y, i: x.detach(),
    # ops of the rule families found from torch's metadata and the norm/loss/embedding rules
    "var": lambda x, y, i: x.var(1),
    "std": lambda x, y, i: x.std(1),
    "layer_norm": lambda x, y, i: _F().layer_norm(x, (16,)),
    "softmax": lambda x, y, i: x.softmax(1),
    "cross_entropy": lambda x, y, i: _F().cross_entropy(x, i),
    "nll_loss": lambda x, y, i: _F().nll_loss(x, i),
    "embedding": lambda x, y, i: _F().embedding(i, y),
    "dropout": lambda x, y, i: _F().dropout(x, 0.1),
    "mse_loss": lambda x, y, i: _F().mse_loss(x, x),
}


def _F():
    import torch.nn.functional as F

    return F


def _operands(quick: bool) -> dict:
    """``{placement name: {impl: (x, y, i)}}`` on the current 1-rank group."""
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
    i = torch.randint(16, (16,), generator=g)
    out = {}
    for name, kit_pl, torch_pl in (("Replicate", Replicate(), TR()), ("Shard(0)", Shard(0), TS(0))):
        out[name] = {
            "plain": (a, b, i),
            "DTensor": (DTensor.from_local(a, mesh, [torch_pl]), DTensor.from_local(b, mesh, [TR()]),
                        DTensor.from_local(i, mesh, [torch_pl])),
            "kit ShardedTensor": (ShardedTensor.from_local(a, mesh, [kit_pl]),
                                  ShardedTensor.from_local(b, mesh, [Replicate()]),
                                  ShardedTensor.from_local(i, mesh, [kit_pl])),
        }
    return out


def _measure(quick: bool) -> list:
    import torch
    from . import interleaved, ratio_rows

    rounds, min_run_time = (5, 0.02) if quick else (15, 0.03)
    rows = []
    for pl, impls in _operands(quick).items():
        ratios, kit_us, ref_us = [], [], []
        for op, f in OPS.items():
            fns = {impl: functools.partial(f, *xs) for impl, xs in impls.items()}
            res, ratio = interleaved(fns, rounds=rounds, reference="DTensor", min_run_time=min_run_time)
            got = ratio_rows(f"eager_op {pl}", op, res, reference="DTensor", kinds=_KINDS, world_size=1)
            by = {r["impl"]: r for r in got}
            for impl, row in by.items():
                row["ratio"] = round(ratio[impl], 3)
            rows += got
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
