"""The ports of PyTorch's ``test_dtensor.py``, ``test_redistribute.py``, ``test_init.py`` and
``test_random_ops.py``, gathered: ``run(2)`` runs the 2-rank ports (_dtensor_unit_core_tasks,
_dtensor_unit_init_tasks, _dtensor_unit_redist_tasks), ``run(4)`` the 4-rank ones
(_dtensor_unit_mesh_tasks), each on the kit and on torch's DTensor. Returns
``{upstream file: {port name: {lib: result or "error: ..."}}}``. With ``PORTS_TRACE=1`` in the
environment each rank prints every port's time (stderr).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch.distributed as dist

from sharded import _dtensor_unit_core_tasks as core
from sharded import _dtensor_unit_init_tasks as init
from sharded import _dtensor_unit_mesh_tasks as mesh
from sharded import _dtensor_unit_redist_tasks as redist


def ports(size: int) -> dict:
    """{upstream file: [port functions]} for a world of ``size`` ranks."""
    if size == 4:
        return mesh.PORTS
    return {**core.PORTS, **init.PORTS, "test_redistribute.py": redist.PORTS}


def run(size: int) -> dict:
    out: dict = {}
    for file, fns in ports(size).items():
        for fn in fns:
            for lib, L in core.LIBS.items():
                t0 = time.perf_counter()
                try:
                    r = fn(L)
                except Exception:
                    r = "error: " + traceback.format_exc(limit=8)[-1500:]
                if os.environ.get("PORTS_TRACE"):
                    print(f"port {dist.get_rank()} {fn.__name__} {lib} {time.perf_counter() - t0:.2f}s",
                          file=sys.stderr, flush=True)
                out.setdefault(file, {}).setdefault(fn.__name__, {})[lib] = r
                dist.barrier()
    return out
