"""Behaviour that needs fresh interpreters: stable hashes across hash seeds, and the
weights-only unpickler refusing kit classes until ``serialization.allow`` (safe-globals state
is process-global, so the refusal is checked where nothing has allowed anything yet).

One child script runs under two ``PYTHONHASHSEED`` values, concurrently; the tests read its
report. (The compile-cache test spawns its own children: it needs inductor.)
"""

from __future__ import annotations

import json

import pytest

from kit_helpers.processes import run_pythons
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

pytestmark = pytest.mark.dist  # spawns fresh interpreters

_CHILD = r"""
import io, json, torch
from subclass_kit import WrapperTensor, inner, meta, serialization
from subclass_kit.examples import TwoTensor, ScaledTensor, BlockScaled

class Sets(WrapperTensor):
    left: torch.Tensor = inner()
    names: frozenset = meta(default=frozenset({"alpha", "beta", "gamma", "delta", "eps"}))

report = {c.__name__: [s._stable_hash_for_caching() for s in c.__samples__()]
          for c in (TwoTensor, ScaledTensor, BlockScaled)}
report["Sets"] = Sets(torch.ones(2))._stable_hash_for_caching()
report["seed_probe"] = hash("probe")

def saved(obj):
    buf = io.BytesIO(); torch.save(obj, buf); return buf.getvalue()

def load(data):
    try:
        out = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"type": type(out).__name__, "plain": out.to_plain().tolist(),
            "block": getattr(out, "block", None)}

b = BlockScaled.from_float(torch.arange(12.0).reshape(6, 2), block=4)
two = TwoTensor(torch.ones(2), torch.zeros(2))
b_bytes, two_bytes = saved(b), saved(two)
report["load_before_allow"] = load(b_bytes)
globals_before = {repr(g) for g in torch.serialization.get_safe_globals()}
serialization.allow(BlockScaled)
report["added"] = sorted({repr(g) for g in torch.serialization.get_safe_globals()} - globals_before)
report["load_after_allow"] = load(b_bytes)
report["other_class_after_allow"] = load(two_bytes)
report["expected_plain"] = b.to_plain().tolist()
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def reports():
    outs = run_pythons([(_CHILD, {"PYTHONHASHSEED": seed}) for seed in ("1", "2")])
    return [json.loads(o) for o in outs]


def test_stable_hash_identical_across_processes_with_different_hash_seeds(reports):
    a, b = (dict(r) for r in reports)
    assert a.pop("seed_probe") != b.pop("seed_probe")  # the seeds really differed
    for key in ("TwoTensor", "ScaledTensor", "BlockScaled", "Sets"):
        assert a[key] == b[key], key
    # ...and equal to what this process computes (nothing process-specific enters the hash).
    assert a["BlockScaled"] == [s._stable_hash_for_caching() for s in BlockScaled.__samples__()]
    assert a["ScaledTensor"] == [s._stable_hash_for_caching() for s in ScaledTensor.__samples__()]
    assert a["TwoTensor"] == [s._stable_hash_for_caching() for s in TwoTensor.__samples__()]


def test_weights_only_load_is_rejected_before_allow(reports):
    r = reports[0]["load_before_allow"]
    assert r["error"] == "UnpicklingError"
    assert "Unsupported global" in r["message"] and "subclass_kit" in r["message"]


def test_allow_admits_the_class_and_nothing_else_new(reports):
    r = reports[0]
    assert r["load_after_allow"] == {"type": "BlockScaled", "plain": r["expected_plain"], "block": 4}
    # Allowing BlockScaled does not let TwoTensor through...
    other = r["other_class_after_allow"]
    assert other["error"] == "UnpicklingError" and "TwoTensor" in other["message"]
    # ...and adds exactly the class, the rebuild function and the ctx type with its rebuilder.
    assert r["added"] == sorted(
        [
            "<class 'subclass_kit.examples.block_scaled.BlockScaled'>",
            "<class 'subclass_kit.ctx.SubclassCtx'>",
        ]
        + [a for a in r["added"] if a.startswith("<function ")]
    )
    funcs = sorted(a.split()[1] for a in r["added"] if a.startswith("<function "))
    assert funcs == ["_rebuild_ctx", "rebuild"]
