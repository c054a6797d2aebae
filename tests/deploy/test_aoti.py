"""The AOTInductor half of the deploy matrix (slow: each package is a C++ compile).

Export itself is covered for every combination in test_export_matrix.py; what AOTInductor
adds is lowering the (recorded) wrappers to inner-tensor kernels and a package that runs
without Python. An AOTI compile costs ~10-30 s on 2 busy cores, so one package per
exemplar, chosen to cover each axis at least once:

- TwoTensor, strict, as is: dynamo-traced export, a wrapped parameter as graph input, and
  a wrapped *output* turned plain by ``to_plain()`` (recorded as ``subclass_kit::to_plain``);
- ScaledTensor, strict, parametrized: dynamo traces ``__tensor_unflatten__`` in forward;
- BlockScaled, non-strict, parametrized: the path that failed with "Unable to cast
  NotImplemented to Tensor" (issue 14), with a ragged last block.

All three are compiled with the batch dim dynamic, compared with eager in this process at
batch sizes the export never saw, then loaded together in ONE fresh interpreter that
imports torch only (not subclass_kit) and compared again. The per-rank TP model and
collectives inside a package are in test_aoti_dist.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from subclass_kit.deploy import aoti_package, load_package

from deploy._models import build, export, inputs

pytestmark = pytest.mark.slow

CELLS = [
    ("TwoTensor", True, "as_is"),
    ("ScaledTensor", True, "parametrized"),
    ("BlockScaled", False, "parametrized"),
]
BATCHES = (3, 100)  # exported at batch 6
_CONFIG: dict = {}  # torch._inductor.config before / after building the packages


def _cell_id(cell) -> str:
    name, strict, form = cell
    return f"{name}-{'strict' if strict else 'nonstrict'}-{form}"


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("aoti")
    built = {}
    _CONFIG["before"] = torch._inductor.config.save_config_portable()
    for cell in CELLS:
        name, strict, form = cell
        m = build(name, form)
        ep = export(m, strict)
        t0 = time.perf_counter()
        path = aoti_package(ep, str(out_dir / f"{_cell_id(cell)}.pt2"))
        seconds = time.perf_counter() - t0
        xs = inputs(*BATCHES)
        with torch.no_grad():
            pairs = [(x, m(x)) for x in xs]
        data = out_dir / f"{_cell_id(cell)}.data"
        torch.save(pairs, data)
        built[_cell_id(cell)] = {
            "module": m, "package": path, "data": str(data), "pairs": pairs,
            "compile_s": seconds, "size": os.path.getsize(path),
        }
    _CONFIG["after"] = torch._inductor.config.save_config_portable()
    return built


def test_packaging_leaves_the_inductor_config_as_it_was(packages):
    # torch writes the package's device facts into config.aot_inductor.metadata in place;
    # left there, they change every later FX graph / AOTAutograd cache key in the process
    # (a warm cache from a fresh process then misses; tests/guards/test_cache_hits.py).
    before, after = _CONFIG["before"], _CONFIG["after"]
    keys = before.keys() | after.keys()
    changed = {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}
    assert not changed, changed


@pytest.mark.parametrize("cell", CELLS, ids=_cell_id)
def test_package_matches_eager(packages, cell):
    p = packages[_cell_id(cell)]
    run = load_package(p["package"])
    for x, expected in p["pairs"]:
        out = run(x)
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_packages_in_a_fresh_process(packages, tmp_path):
    cases = [{"name": k, "package": v["package"], "data": v["data"]} for k, v in packages.items()]
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    script = pathlib.Path(__file__).with_name("_reload.py")
    done = subprocess.run(
        [sys.executable, str(script), str(spec)], capture_output=True, text=True, timeout=300,
        cwd=str(tmp_path),  # nothing of the repository importable by accident
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.pop("kit_imported") is False
    assert sorted(report) == sorted(packages)
    for name, r in report.items():
        assert r["max_error"] <= 1e-5, (name, r)
    # Figures for the deploy notes (never asserted).
    with torch.no_grad():
        for name, r in report.items():
            m, (x, _) = packages[name]["module"], packages[name]["pairs"][0]
            t0 = time.perf_counter()
            m(x)
            r["eager_call_s"] = time.perf_counter() - t0
            r["compile_s"] = packages[name]["compile_s"]
            r["package_bytes"] = packages[name]["size"]
    print("deploy figures:", json.dumps(report, indent=1))
