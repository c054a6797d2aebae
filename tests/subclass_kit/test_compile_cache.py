"""Compile caches across processes: with a shared ``TORCHINDUCTOR_CACHE_DIR``, a second fresh
process hits AOTAutograd's cache and the FX graph cache for exemplar inputs, static and dynamic,
and computes the same ``_stable_hash_for_caching`` under a different ``PYTHONHASHSEED``.

(torch's own test TwoTensor bypasses AOTAutograd's cache under dynamic shapes: its default hash
pickles the symbolic sizes. The kit's hash renders them by name.)
"""

from __future__ import annotations

import json

import pytest

from kit_helpers.processes import run_python

_CHILD = r"""
import json
import torch
from torch._dynamo.utils import counters
from subclass_kit.examples import ScaledTensor, TwoTensor

def f(x, w):
    return torch.mm(x, w).relu() * 2

def plain(t):
    return t.a if isinstance(t, TwoTensor) else t

def case(name, x, dynamic):
    torch._dynamo.reset()
    counters.clear()
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    w = torch.randn(x.shape[1], 3, generator=torch.Generator().manual_seed(1))
    out = torch.compile(f, backend="inductor", fullgraph=True)(x, w)
    ok = torch.allclose(plain(out), plain(f(x, w)), rtol=1e-4, atol=1e-5)
    report[name] = {
        "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        "fx": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
        "hash": x._stable_hash_for_caching(),
        "ok": bool(ok),
    }

report = {"seed_probe": hash("probe")}
g = torch.Generator().manual_seed(0)
case("scaled-static", ScaledTensor.from_float(torch.randn(16, 8, generator=g)), False)
case("scaled-dynamic", ScaledTensor.from_float(torch.randn(DYN, 8, generator=g)), True)
case("two-dynamic", TwoTensor(torch.randn(DYN, 4, generator=g), torch.randn(DYN, 4, generator=g)), True)
print(json.dumps(report))
"""


def _child(rows: int, seed: str, cache_dir) -> dict:
    code = _CHILD.replace("DYN", str(rows))
    out = run_python(code, env={"PYTHONHASHSEED": seed, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}, timeout=600)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.dist  # spawns fresh interpreters
def test_second_process_hits_aot_autograd_and_fx_graph_caches(tmp_path):
    first = _child(12, "1", tmp_path)
    # The second process sees other sizes for the dynamic inputs: the dynamic graphs are reused.
    second = _child(20, "2", tmp_path)
    assert first.pop("seed_probe") != second.pop("seed_probe")
    for name in ("scaled-static", "scaled-dynamic", "two-dynamic"):
        a, b = first[name], second[name]
        assert a["ok"] and b["ok"], name
        assert a["aot"].get("autograd_cache_bypass", 0) == 0 and b["aot"].get("autograd_cache_bypass", 0) == 0, (name, a, b)
        assert a["aot"].get("autograd_cache_saved", 0) == 1, (name, a)
        assert b["aot"].get("autograd_cache_hit", 0) == 1 and b["aot"].get("autograd_cache_miss", 0) == 0, (name, b)
        assert b["fx"].get("fxgraph_cache_hit", 0) >= 1 and b["fx"].get("fxgraph_cache_miss", 0) == 0, (name, b)
    # Same input metadata in both processes -> the same stable hash, whatever the hash seed.
    assert first["scaled-static"]["hash"] == second["scaled-static"]["hash"]
