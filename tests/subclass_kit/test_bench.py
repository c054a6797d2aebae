"""The benchmark runner produces its three artefacts with sane rows (no speed asserted)."""

import json

import pytest

from subclass_kit import bench


@pytest.mark.slow
def test_bench_writes_json_markdown_png(tmp_path):
    rows = bench.main(quick=True, out=str(tmp_path), suites=("dispatch_bench",))
    impls = {(r["group"], r["impl"]) for r in rows}
    for impl in ("plain", "floor", "torch_two", "kit_two"):
        assert ("eager_dispatch", impl) in impls
    assert all(r["median_us"] > 0 for r in rows)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["rows"] == rows and data["env"]["quick"] is True
    md = (tmp_path / "bench.md").read_text()
    assert md.count("\n| dispatch |") == len(rows)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_suite_is_reported_not_fatal(tmp_path):
    rows = bench.main(quick=True, out=str(tmp_path), suites=("no_such_bench",))
    assert rows == []
    assert "no_such_bench" in json.loads((tmp_path / "bench.json").read_text())["env"]["skipped"][0]
