"""PyTorch's DTensor unit tests ``test_math_ops.py``, ``test_pointwise_ops.py`` and
``test_tensor_ops.py`` ported to the kit (see _dtensor_unit_ops1_tasks): every port runs on
the kit and on torch's DTensor in one 2-rank world (the 2-D-mesh ones in one 4-rank world),
asserting upstream's values and placements on both and upstream's collective counts (exact on
DTensor, no more on the kit); here, per port, the kit also issues no more collectives than
DTensor case by case, and the ports are counted per file against upstream's tests."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _dtensor_unit_ops1_tasks as T

pytestmark = pytest.mark.dist

# Ported checks per upstream file (each upstream test method, a parametrized one per case).
PORTED = {"test_math_ops.py": 26, "test_pointwise_ops.py": 13, "test_tensor_ops.py": 37}
# Upstream's test methods per file (torch/test/distributed/tensor), so ported + skipped is all.
UPSTREAM = {"test_math_ops.py": 28, "test_pointwise_ops.py": 12, "test_tensor_ops.py": 38}

# Real gaps of the kit (strict: they fail today, and must be revisited once they pass).
GAPS: dict = {}


@pytest.fixture(scope="module")
def results():
    out: dict = {}
    for ranks in (2, 4):
        for f, ports in world(ranks).run(T.run, ranks, timeout=600)[0].items():
            out.setdefault(f, {}).update(ports)
    return out


def _ok(r) -> bool:
    return not (isinstance(r, str) and r.startswith("error"))


def _params():
    out = []
    for ranks in (2, 4):
        for f, names in T.ports(ranks).items():
            for n in names:
                gap = GAPS.get((f, n))
                marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
                out.append(pytest.param(f, n, marks=marks, id=f"{f[:-3]}::{n}"))
    return out


def test_ported_checks_per_file():
    skipped = T.skipped()
    for f, n in PORTED.items():
        names = T.ports(2)[f] + T.ports(4)[f]
        assert len(names) == len(set(names)) == n, (f, len(names))
        assert not set(names) & set(skipped[f]), f
        # every upstream test method is ported or skipped with a reason (parametrized ones
        # are one method each upstream)
        methods = {m.removesuffix("_maximum").removesuffix("_minimum") for m in names} | set(skipped[f])
        assert len(methods) == UPSTREAM[f], (f, len(methods))
        assert set(T.DOCUMENTED[f]) <= set(names), f


@pytest.mark.parametrize("fname, port", _params())
def test_port(results, fname, port):
    r = results[fname][port]
    assert _ok(r["dtensor"]), r["dtensor"]
    assert _ok(r["kit"]), r["kit"]
    kit, dt = r["kit"], r["dtensor"]
    for case, n in dt.items():
        if isinstance(n, str):
            assert kit[case] == n, (case, kit[case], n)  # placements: the kit's equal DTensor's
        else:
            assert kit[case] <= n, (case, kit[case], n)  # collectives: no more than DTensor's


def test_table(results):
    """The per-file table: ported, passing on the kit, on DTensor, documented exceptions."""
    rows = []
    for f, n in PORTED.items():
        ports = results[f]
        assert len(ports) == n
        on_dt = sum(_ok(r["dtensor"]) for r in ports.values())
        on_kit = sum(_ok(r["kit"]) and (f, p) not in GAPS for p, r in ports.items())
        rows.append((f, n, on_kit, on_dt, len(T.DOCUMENTED[f]), len(T.skipped()[f])))
        assert on_dt == n, f
        assert on_kit == n - sum(g[0] == f for g in GAPS), f
    table = "\n".join(["file | ported | pass on kit | pass on DTensor | documented exceptions | skipped"] +
                      [" | ".join(map(str, row)) for row in rows])
    print("\n" + table)
