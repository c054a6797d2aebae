"""Precompile: ``torch.compile(fn, fullgraph=True).aot_compile(...)`` saved with
``save_compiled_function`` and loaded with ``torch.compiler.load_compiled_function`` in a
process that never compiled ``fn`` (an empty inductor cache), for every exemplar, a
ShardedTensor on a 2-rank mesh, a function taking an AsyncCollectiveTensor and one issuing
an all_reduce.

torch pickles the artifact's guards by rebuilding every guarded input as
``torch.empty_like(x, device="meta")`` and, at load, ``type(that).__tensor_unflatten__``: a
class whose meta ``empty_like`` came back plain could be saved but never loaded. Called with
an input whose ctx differs, a loaded function refuses (torch's ``RuntimeError: GuardManager
check failed``, naming the failed guard); it never recompiles and never runs the stale graph.
"""

from __future__ import annotations

import json

import pytest
import torch

from kit_helpers.harness import World
from kit_helpers.processes import run_python

from deploy import _precompile as P


def _refused(row) -> bool:
    return row["changed"].startswith("RuntimeError: GuardManager check failed")


@pytest.mark.parametrize("name", P.EXEMPLARS)
def test_meta_empty_like_keeps_the_class(name):
    # What torch's guard pickling needs of every wrapped input.
    _, (w, _), _ = P._exemplar(name)
    m = torch.empty_like(w, device="meta")
    assert type(m) is type(w) and m.is_meta
    assert (m.shape, m.stride(), m.dtype) == (w.shape, w.stride(), w.dtype)
    assert m.__tensor_flatten__()[1] == w.__tensor_flatten__()[1]  # the same ctx
    assert not torch.empty_like(w).is_meta  # a real device still goes to the class's own rule


def test_meta_empty_like_of_a_pending_result_is_one_and_does_not_wait():
    from subclass_kit.collectives import AsyncCollectiveTensor

    pending = AsyncCollectiveTensor(torch.ones(2, 3))
    m = torch.empty_like(pending, device="meta")
    assert type(m) is AsyncCollectiveTensor and m.is_meta and m.completed
    assert not pending.completed  # empty_like reads no data
    import pickle

    assert type(pickle.loads(pickle.dumps(m))) is AsyncCollectiveTensor  # meta: no value to wait for
    assert type(pickle.loads(pickle.dumps(pending))) is torch.Tensor  # a real one pickles its value


@pytest.mark.parametrize("name", P.EXEMPLARS)
def test_loads_in_the_saving_process(name):
    fn, inputs, _ = P._exemplar(name)
    out = P.roundtrip_in_memory(fn, inputs)
    assert torch.equal(P.plain(out), P.plain(fn(*inputs)))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_saved_then_loaded_in_a_fresh_process(backend, tmp_path):
    for name in P.EXEMPLARS:
        fn, inputs, _ = P._exemplar(name)
        P.compile_and_save(fn, inputs, str(tmp_path / f"{name}.bin"), backend)
    cache = tmp_path / "empty-inductor-cache"
    cache.mkdir()
    out = run_python(
        f"from deploy import _precompile as P; print(P.fresh_process_report({str(tmp_path)!r}))",
        env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["dynamo_frames_compiled"] == 0  # served from the artifact, not recompiled
    for name in P.EXEMPLARS:
        row = report[name]
        assert row["type_equal"], (name, row)
        assert row["max_error"] <= (1e-5 if backend == "inductor" else 0.0), (name, row)
        assert _refused(row), (name, row)
    assert "check_metadata" in report["BlockScaled"]["changed"]  # the ctx guard (block) refused it
    assert "check_metadata" in report["ScaledTensor"]["changed"]  # the outer dtype is in the ctx


@pytest.mark.dist
def test_distributed_cases_saved_then_loaded_by_a_fresh_world(tmp_path):
    # Each rank saves its own artifact; a new world (ranks that never compiled, each with an
    # empty inductor cache) loads them and runs their collectives on its own group.
    saving = World(2)
    try:
        saved = saving.run(P.rank_save, str(tmp_path), "aot_eager", timeout=300)
    finally:
        saving.close()
    assert len(saved[0]) == 2 * len(P.DIST_CASES)
    loading = World(2)
    try:
        reports = loading.run(P.rank_load, str(tmp_path), timeout=300)
    finally:
        loading.close()
    for rank, report in enumerate(reports):
        assert report["dynamo_frames_compiled"] == 0, rank
        for name in P.DIST_CASES:
            row = report[name]
            assert row["type_equal"] and row["max_error"] == 0.0, (rank, name, row)
            assert _refused(row), (rank, name, row)
