"""The benchmark runner: torch.utils.benchmark timing, rows with ratios, JSON + Markdown + a
matplotlib chart (or a clear hint without matplotlib). Speed is never asserted."""

import doctest
import json
import logging
import sys
import types

import pytest
import torch

from subclass_kit import bench
from subclass_kit.bench import _chart as chart


def _fake_suite(world_sizes=(None,)):
    """A suite module timing real (tiny) functions, registered the way bench.main finds suites."""

    def run(quick):
        rows = []
        for ws in world_sizes:
            res = bench.side_by_side(
                {"torch thing": lambda: sum(range(50)), "kit thing": lambda: sum(range(20)), "plain": lambda: None},
                rounds=2, min_run_time=0.002,
            )
            extra = {} if ws is None else {"world_size": ws}
            rows += bench.ratio_rows("grp", "op", res, reference="torch thing",
                                     kinds={"torch thing": "torch", "kit thing": "kit", "plain": "plain"}, **extra)
        return rows

    return types.SimpleNamespace(run=run)


def test_side_by_side_is_torch_benchmark_round_robin():
    calls = {"a": 0, "b": 0}

    def a():
        calls["a"] += 1

    def b():
        calls["b"] += 1

    res = bench.side_by_side({"a": a, "b": b}, rounds=3, number=7)
    for k in ("a", "b"):
        m = res[k]
        assert isinstance(m, torch.utils.benchmark.Measurement)
        assert len(m.times) == 3 and m.median > 0  # one sample per round, merged
        assert m.task_spec.num_threads == torch.get_num_threads()
    # A fixed count: warm-up (2 calls) + 7 timed calls, in each of 3 rounds, the same for both.
    assert calls["a"] == calls["b"] == 3 * (2 + 7)


def test_ratio_rows_divide_by_the_reference_and_validate():
    res = bench.side_by_side({"ref": lambda: None, "x": lambda: sum(range(30))}, rounds=2, min_run_time=0.002)
    rows = bench.ratio_rows("g", "n", res, reference="ref", kinds={"ref": "torch", "x": "kit"}, world_size=2)
    by = {r["impl"]: r for r in rows}
    assert by["ref"]["ratio"] == 1.0 and all(r["world_size"] == 2 and r["reference"] == "ref" for r in rows)
    assert by["x"]["ratio"] == pytest.approx(res["x"].median / res["ref"].median, rel=1e-2)
    assert by["x"]["median_us"] == pytest.approx(res["x"].median * 1e6, abs=1e-3)
    with pytest.raises(KeyError, match="reference 'nope'"):
        bench.ratio_rows("g", "n", res, reference="nope", kinds={"ref": "torch", "x": "kit"})
    with pytest.raises(ValueError, match="kinds must be one of"):
        bench.ratio_rows("g", "n", res, reference="ref", kinds={"ref": "torch", "x": "mine"})


def test_main_writes_json_markdown_png(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "subclass_kit.bench.fake_bench", _fake_suite())
    rows = bench.main(quick=True, out=str(tmp_path), suites=("fake_bench",))
    assert {r["impl"] for r in rows} == {"torch thing", "kit thing", "plain"}
    assert all(r["suite"] == "fake" and r["threads"] == torch.get_num_threads() for r in rows)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["rows"] == rows and data["env"]["quick"] is True
    assert data["env"]["threads"] == torch.get_num_threads() and "torch.utils.benchmark" in data["env"]["timer"]
    md = (tmp_path / "bench.md").read_text()
    assert md.count("\n| fake |") == len(rows)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_json_and_markdown_still_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "subclass_kit.bench.fake_bench", _fake_suite())
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, mod, None)  # import fails as if not installed
    (tmp_path / "bench.png").write_bytes(b"stale")
    with caplog.at_level(logging.INFO, logger="subclass_kit.bench"):
        rows = bench.main(quick=True, out=str(tmp_path), suites=("fake_bench",))
    assert rows and (tmp_path / "bench.json").exists() and (tmp_path / "bench.md").exists()
    assert not (tmp_path / "bench.png").exists()
    assert any("pip install 'subclass-kit[bench]'" in r.getMessage() for r in caplog.records)
    assert any("running fake_bench" in r.getMessage() for r in caplog.records)


def test_chart_has_one_log_panel_per_suite_with_labels_and_ratios():
    rows = []
    for suite in ("one", "two"):
        for r in _fake_suite(world_sizes=(1, 2)).run(quick=True):
            rows.append({"suite": suite, **r})
    fig = chart.figure(rows, {"torch": torch.__version__, "quick": True})
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["suite: one", "suite: two"]
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    # The reference is the line at 1, not a bar; world size and impl tell the bars apart.
    assert ticks == ["kit thing · 1 rank", "plain · 1 rank", "kit thing · 2 ranks", "plain · 2 ranks"]
    texts = [t.get_text() for t in ax.texts]
    kit = next(r for r in rows if r["suite"] == "one" and r["impl"] == "kit thing" and r["world_size"] == 2)
    assert any(t.startswith(f"{kit['ratio']:.2f}×") for t in texts)
    assert any(t.startswith("grp: op   (÷ torch thing = ") and "2 ranks" in t for t in texts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"subclass_kit", "plain tensor", "reference (= 1×)"} <= set(legend)


def test_overview_has_one_headline_per_suite_and_each_suite_its_own_figure(tmp_path):
    import statistics

    rows = []
    for suite in ("one", "two"):
        for r in _fake_suite(world_sizes=(1, 2)).run(quick=True):
            rows.append({"suite": suite, **r})
    fig = chart.overview(rows, {"torch": torch.__version__})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["one", "two"]
    kit = [r["ratio"] for r in rows if r["suite"] == "one" and r["kind"] == "kit"]
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith(f"{statistics.median(kit):.2f}×  (2 cases") and "÷ torch thing" in t for t in texts), texts
    assert chart.write_chart(str(tmp_path / "bench.png"), rows, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-one.png", "bench-two.png", "bench.png"]


def test_missing_suite_is_reported_not_fatal(tmp_path):
    rows = bench.main(quick=True, out=str(tmp_path), suites=("no_such_bench",))
    assert rows == []
    assert "no_such_bench" in json.loads((tmp_path / "bench.json").read_text())["env"]["skipped"][0]


@pytest.mark.parametrize("module", [bench, chart], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted and not failed


def test_dispatch_suite_rows():
    from subclass_kit.bench import _dispatch_bench as dispatch_bench

    rows = dispatch_bench.run(quick=True)
    cases = {(r["group"], r["name"]) for r in rows}
    assert cases == {("eager_dispatch", op) for op in ("add", "mul", "view", "detach")} | {("compiled_call", "x*y+x")}
    impls = {(r["group"], r["impl"], r["kind"]) for r in rows}
    for impl, kind in (("plain", "plain"), ("floor", "floor"), ("torch TwoTensor", "torch"), ("kit TwoTensor", "kit")):
        assert ("eager_dispatch", impl, kind) in impls
    assert all(r["median_us"] > 0 and r["reference"] == "torch TwoTensor" for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows if r["impl"] == "torch TwoTensor")


@pytest.mark.dist  # a 1-rank gloo world in a freshly started process
def test_sharded_suite_rows_kit_beside_dtensor():
    import statistics

    from subclass_kit.bench import _sharded_bench as sharded_bench

    rows = sharded_bench.run(quick=True)
    groups = ("eager_op Replicate", "eager_op Shard(0)")
    assert {(r["group"], r["name"]) for r in rows} == {
        (g, n) for g in groups for n in (*sharded_bench.OPS, "median over ops")
    }
    assert all(r["world_size"] == 1 and r["reference"] == "DTensor" and r["median_us"] > 0 for r in rows)
    for g in groups:
        per_op = {(r["name"], r["impl"]): r for r in rows if r["group"] == g and r["name"] != "median over ops"}
        assert {impl for _, impl in per_op} == {"plain", "DTensor", "kit ShardedTensor"}
        assert all(r["ratio"] == 1.0 for (_, impl), r in per_op.items() if impl == "DTensor")
        # The summary row is the median of the kit's per-op ratios (issue 12's figure).
        kit = [r["ratio"] for (_, impl), r in per_op.items() if impl == "kit ShardedTensor"]
        summary = next(r for r in rows if r["group"] == g and r["name"] == "median over ops"
                       and r["impl"] == "kit ShardedTensor")
        assert summary["ratio"] == pytest.approx(statistics.median(kit), abs=1e-3)


@pytest.mark.slow  # inductor compiles the call and a 29-layer model four ways each
def test_boundary_suite_rows():
    from subclass_kit.bench import _boundary_bench as boundary_bench

    rows = boundary_bench.run(quick=True)
    by = {(r["group"], r["impl"]): r for r in rows}
    for impl in ("plain", "floor", "kit torch.compile", "kit boundary"):
        assert by[("compiled_call boundary", impl)]["reference"] == "floor"
    for impl in ("plain weights", "kit weights torch.compile", "kit weights boundary", "kit weights body",
                 "torchao int8 torch.compile"):
        assert "overhead_us" in by[("quantized model boundary", impl)]
    assert by[("compiled_call boundary", "floor")]["ratio"] == 1.0
    assert all(r["median_us"] > 0 for r in rows)


def test_jagged_suite_rows_kit_beside_njt_and_dense():
    from subclass_kit.bench import _jagged_bench as jagged_bench

    rows = jagged_bench.run(quick=True)  # eager only; the full run adds inductor
    by = {(r["group"], r["impl"]): r for r in rows}
    assert {g for g, _ in by} == {"jagged eager forward", "jagged eager forward+backward"}
    assert {i for g, i in by if g == "jagged eager forward"} == {"torch NJT", "kit JaggedTensor", "padded dense"}
    # NJT's mean(dim=1) has no backward in torch 2.13: its absence is said in the row.
    assert {i for g, i in by if g == "jagged eager forward+backward"} == {"kit JaggedTensor", "padded dense"}
    assert all("no backward" in r["note"] for r in rows if r["group"].endswith("backward"))
    assert by[("jagged eager forward", "torch NJT")]["ratio"] == 1.0
    assert all(r["median_us"] > 0 for r in rows)


@pytest.mark.dist
@pytest.mark.slow  # a 4-rank world compiling two models
def test_dp_suite_rows_kit_beside_dtensor():
    from subclass_kit.bench import _dp_bench as dp_bench

    rows = dp_bench.run(quick=True, modes=("replicate",))
    assert {(r["group"], r["name"], r["impl"]) for r in rows} == {
        ("data_parallel replicate aot_eager", case, impl)
        for case in ("train step", "first step (compile)") for impl in ("kit data_parallel", "DTensor (SimpleFSDP)")
    }
    assert all("error" not in r and r["world_size"] == 4 and r["reference"] == "DTensor (SimpleFSDP)" for r in rows), rows
    # Both train the dense model's losses, each in one graph.
    assert all(r["max_loss_diff_vs_dense"] < 1e-4 and r["graphs"] == 1 for r in rows), rows
