"""The kit's AsyncCollectiveTensor beside torch's, on real gloo worlds of 1 and 2 ranks.

Two groups of rows, each measured in one run so the ratios compare like with like:

- ``act_op``: per-op cost of ``view``, ``t``, ``detach`` (on a pending result: no wait) and
  ``add`` (on a waited one: the compute path) for the kit's wrapper, torch's, and a plain
  tensor;
- ``all_reduce_first_use``: ``all_reduce`` then the first op on its result (issue, wrap,
  wait, compute), for the kit, torch, and the bare native ops (the floor).

Each world runs in freshly started processes (gloo on 127.0.0.1, a store on a free port),
which are always reaped.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import _compat
from ._spawn import measure_on_ranks

__all__ = ["run"]

_TIMEOUT = 600.0


_KINDS = {"plain": "plain", "native": "native", "torch ACT": "torch", "kit ACT": "kit"}


def _measure(quick: bool) -> list:
    import torch
    import torch.distributed as dist
    funcol = _compat.torch_funcol()

    from .. import collectives as kit
    from . import ratio_rows, side_by_side

    ws = dist.get_world_size()
    # A fixed call count (Timer.timeit), not autorange: every rank must issue the same
    # collectives, and autorange sizes its blocks from each rank's own clock.
    number, rounds = (100, 15) if quick else (200, 41)
    timed = lambda fns, n=number: side_by_side(fns, rounds=rounds, number=n)  # noqa: E731
    x = torch.randn(16, 16)
    world = dist.group.WORLD
    rows = []

    # Per-op cost. Views run on pending results (issued, not yet waited: no wait happens).
    kit_act: Any = kit.all_reduce(x, "sum")
    torch_act = funcol.all_reduce(x, "sum", world)
    plain = x.clone()
    ops = {
        "view": lambda t: (lambda: t.view(256)),
        "t": lambda t: (lambda: t.t()),
        "detach": lambda t: (lambda: t.detach()),
    }
    for op, make in ops.items():
        res = timed({"plain": make(plain), "torch ACT": make(torch_act), "kit ACT": make(kit_act)})
        rows += ratio_rows("act_op", op, res, reference="torch ACT", kinds=_KINDS, world_size=ws)
    kit_act.trigger_wait()
    torch_act.trigger_wait()
    res = timed({"plain": lambda: plain.add(1), "torch ACT": lambda: torch_act.add(1), "kit ACT": lambda: kit_act.add(1)})
    rows += ratio_rows("act_op", "add", res, reference="torch ACT", kinds=_KINDS, world_size=ws)

    # Issue + first use. The native ops without any wrapper are the floor.
    f = _compat.funcol_ops
    assert world is not None  # the group was initialized above
    name = world.group_name
    res = timed(
        {
            "native": lambda: f.wait_tensor(f.all_reduce(x, "sum", name)).add(1),
            "torch ACT": lambda: funcol.all_reduce(x, "sum", world).add(1),
            "kit ACT": lambda: kit.all_reduce(x, "sum").add(1),
        },
        max(10, number // 10),
    )
    rows += ratio_rows("all_reduce_first_use", "all_reduce+add", res, reference="torch ACT", kinds=_KINDS,
                       world_size=ws)
    return rows


def _world(size: int, quick: bool) -> list:
    return measure_on_ranks(functools.partial(_measure, quick), size, what=f"collectives bench: a {size}-rank world",
                            method="forkserver", preload=("torch", "torch.distributed"), pg_timeout=60.0,
                            timeout=_TIMEOUT)


def run(quick: bool = False) -> list[dict]:
    """Rows (see ``subclass_kit.bench``) with ``world_size``, ratios to torch's ACT.

    Measures world sizes 1 and 2 in one run (each in its own spawned processes).

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
        >>> {r["world_size"] for r in rows}  # doctest: +SKIP
        {1, 2}
    """
    return _world(1, quick) + _world(2, quick)


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick=True)))
