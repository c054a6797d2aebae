"""PyTorch's DTensor unit tests ``test_math_ops.py``, ``test_pointwise_ops.py`` and
``test_tensor_ops.py`` (torch's test/distributed/tensor/), ported to the kit: each port is
named after its upstream test and runs the same body on the kit and on torch's DTensor
(``_LIBS``, built on _dtensor_api_tasks'), asserting what upstream asserts (values against
the dense op, placements, and the collective counts upstream states: exactly on DTensor, no
more than that on the kit). A port returns ``{case: collective count}`` so the test can also
compare the two libraries case by case.

This module holds the shared pieces; the ports live in ``_dtensor_unit_ops1_math_tasks`` and
``_dtensor_unit_ops1_linalg_tasks`` (test_math_ops), ``_dtensor_unit_ops1_pointwise_tasks``
and ``_dtensor_unit_ops1_tensor_tasks``/``_index_tasks`` (test_tensor_ops). ``run(ranks)`` runs
every port of that world size and returns ``{upstream file: {port: {lib: counts dict or "error: ..."}}}``.
"""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from sharded import _dtensor_api_tasks as api
from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close
_mesh, _k = api._mesh, api._k

_LIBS = {name: SimpleNamespace(**vars(L), name=name) for name, L in api._LIBS.items()}
_LIBS["kit"].parallel = __import__("subclass_kit.sharded", fromlist=["parallelize"])
_LIBS["kit"].parallelize = _LIBS["kit"].parallel.parallelize
_LIBS["dtensor"].parallel = __import__("torch.distributed.tensor.parallel", fromlist=["parallelize_module"])
_LIBS["dtensor"].parallelize = _LIBS["dtensor"].parallel.parallelize_module


def _is_kit(L) -> bool:
    return L.name == "kit"


def _pls(x) -> list:
    """Placements as comparable names, a Partial with its reduce op (``P(sum)``)."""
    out = []
    for p in x.placements:
        if p.is_partial():
            out.append(f"P({getattr(p, 'reduce_op', None) or p.op})")
        else:
            out.append(api._pl(SimpleNamespace(placements=[p]))[0])
    return out


def _count(L, comms: Comms, want: int, what: str = "") -> int:
    """Upstream's collective count: exactly ``want`` on DTensor, no more on the kit."""
    got = comms.total()
    ok = got == want if not _is_kit(L) else got <= want
    assert ok, f"{L.name} {what}: {dict(comms.counts)} collectives, upstream expects {want}"
    return got


def _mesh2d(names=None) -> DeviceMesh:
    return DeviceMesh("cpu", torch.arange(dist.get_world_size()).reshape(2, -1), mesh_dim_names=names)


def _seed(s: int = 0) -> None:
    torch.manual_seed(s)


def _raises(fn, exc=RuntimeError) -> str:
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


# Ports where the kit's documented choice gives the dense answer (or gathers) where DTensor
# refuses or keeps a pending reduction: each asserts the kit's documented behaviour, and
# docs/sharded.md lists them ("PyTorch's DTensor unit tests").
DOCUMENTED = {
    "test_math_ops.py": {
        "test_dist": "p=2 over a shard gathers (DTensor: its norm Partial)",
        "test_nll_loss_and_cross_entropy": "a mean over a sharded batch all-reduces the total weight: exact with "
                                           "ignored targets (DTensor: no collective, its average of means)",
    },
    "test_pointwise_ops.py": {
        "test_dropout": "the kit's random stream: dense dropout under one seed",
        "test_dropout_errors": "dropout of a Partial: reduced, then the dense draw (DTensor raises)",
        "test_inplace_op_partial_to_replicate": "clamp_ of a Partial: reduced, written in place (DTensor raises)",
    },
    "test_tensor_ops.py": {
        "test_fill_inplace_partial_sum": "fill_ of a Partial: the dense fill (DTensor: each operand filled)",
        "test_unbind": "unbind along the sharded dim gathers it (DTensor raises)",
    },
}


def _modules():
    from sharded import _dtensor_unit_ops1_linalg_tasks as ma
    from sharded import _dtensor_unit_ops1_pointwise_tasks as pw
    from sharded import _dtensor_unit_ops1_tensor_tasks as to

    return {"test_math_ops.py": ma, "test_pointwise_ops.py": pw, "test_tensor_ops.py": to}


def _files():
    return {f: m.PORTS for f, m in _modules().items()}


def skipped() -> dict:
    """``{upstream file: {test not ported: why}}``."""
    return {f: m.SKIPPED for f, m in _modules().items()}


def ports(ranks: int) -> dict:
    """``{upstream file: [port names]}`` for the ports run on ``ranks`` ranks."""
    return {f: [fn.__name__ for fn in by.get(ranks, [])] for f, by in _files().items()}


def run(ranks: int) -> dict:
    out: dict = {}
    for fname, by_ranks in _files().items():
        for fn in by_ranks.get(ranks, []):
            for lib, L in _LIBS.items():
                try:
                    r = fn(L)
                except Exception:
                    r = "error: " + traceback.format_exc(limit=8)[-1800:]
                out.setdefault(fname, {}).setdefault(fn.__name__, {})[lib] = r
                dist.barrier()
    return out
