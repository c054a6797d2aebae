"""The guards benchmark suite runs and produces the rows the bench report expects."""

from subclass_kit.bench import _guards_bench as guards_bench


def test_quick_run_rows():
    rows = guards_bench.run(quick=True)
    groups = {r["group"] for r in rows}
    assert groups == {"check", "build", "inner_count", "depth", "dispatcher", "dynamo"}
    for r in rows:
        assert {"group", "name", "impl", "kind", "median_us", "ratio", "reference"} <= set(r)
        assert isinstance(r["median_us"], float) and r["median_us"] > 0
    names = {(r["group"], r["name"], r["impl"]) for r in rows}
    assert ("check", "GuardSet.check passes", "on kit TwoTensor") in names
    assert ("build", "guards.build", "on kit TwoTensor") in names
    assert ("build", "guards.build", "on kit ScaledTensor, dim 0 dynamic") in names
    assert ("dynamo", "guard check on kit TwoTensor", "dynamo guard_manager.check") in names
    assert ("dynamo", "guard check on kit TwoTensor", "kit GuardSet.check") in names
    for n in ("1 ctx value", "8 ctx values", "200 ctx values"):
        assert ("dispatcher", "GuardedDispatcher serves the newest entry", n) in names
    # Every case has its reference among its rows, at ratio 1.
    for case in {(r["group"], r["name"]) for r in rows}:
        refs = [r for r in rows if (r["group"], r["name"]) == case and r["impl"] == r["reference"]]
        assert len(refs) == 1 and refs[0]["ratio"] == 1.0, case
