"""The guards benchmark suite runs and produces the rows the bench report expects."""

from subclass_kit.bench import guards_bench


def test_quick_run_rows():
    rows = guards_bench.run(quick=True)
    groups = {r["group"] for r in rows}
    assert groups == {"check", "inner_count", "depth", "dynamo"}
    for r in rows:
        assert {"group", "name", "impl", "median_us"} <= set(r) and isinstance(r["median_us"], float)
    names = {(r["group"], r["name"], r["impl"]) for r in rows}
    assert ("check", "pass", "kit TwoTensor") in names
    assert ("dynamo", "guard_manager.check", "kit TwoTensor") in names
