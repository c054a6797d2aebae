"""The coverage driver's speed pass (``coverage_table.py --time``, ``_sweep.time_ops``) on a
few ops: the records and the table are well formed and both ranks timed in lockstep. Speed
itself is not asserted (no wall-clock asserts; the figures come from a full run of the tool).
"""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _sweep, coverage_table

pytestmark = pytest.mark.dist

OPS = ["add", "sum", "nn.functional.linear"]


def test_time_ops_records_and_table():
    r0, r1 = world(2).run(_sweep.time_ops, OPS, coverage_table.LAYOUTS, 8, 3, 0.002, timeout=300)
    assert sorted(r0) == sorted(OPS) == sorted(r1)
    for op in OPS:
        for layout in coverage_table.LAYOUTS:
            rec = r0[op][layout]
            if "skip" in rec:
                assert isinstance(rec["skip"], str) and "skip" in r1[op][layout], (op, layout, rec)
                continue
            assert rec["ratio"] > 0 and rec["kit_us"] > 0 and rec["dtensor_us"] > 0, (op, layout, rec)
            assert rec["gathered"] == [], (op, layout, rec)  # these ops have sharding rules
            assert all(n >= 1 for n in [*rec["kit_comms"].values(), *rec["dtensor_comms"].values()])
            # The ranks ran the same number of calls, so their collectives paired up.
            assert rec["number"] >= 1 and r1[op][layout]["number"] == rec["number"], (op, layout)
    # linear passes forward on every layout on both implementations; replicated, neither
    # communicates.
    linear = r0["nn.functional.linear"]
    assert all("ratio" in linear[la] for la in coverage_table.LAYOUTS)
    assert linear["R"]["kit_comms"] == linear["R"]["dtensor_comms"] == {}

    summary = coverage_table.timing_summary(r0, slowest=2)
    timed = {la: sum("ratio" in r0[op][la] for op in OPS) for la in coverage_table.LAYOUTS}
    assert {la: v["ops"] for la, v in summary["layouts"].items() if la != "all"} == timed
    for v in [*summary["layouts"].values(), *summary["same_comms"].values()]:
        assert v["ops"] == 0 or v["p25"] <= v["median"] <= v["p75"]
    same = sum(r["kit_comms"] == r["dtensor_comms"] for rec in r0.values() for r in rec.values() if "ratio" in r)
    assert summary["same_comms"]["all"]["ops"] == same <= summary["layouts"]["all"]["ops"]
    worst = max((r["ratio"], op) for op, rec in r0.items() for r in rec.values() if "ratio" in r)
    assert len(summary["slowest"]) == 2 and (summary["slowest"][0]["ratio"], summary["slowest"][0]["op"]) == worst
    md = coverage_table.timing_table(r0, summary)
    assert "| all |" in md and f"| {worst[1]} |" in md
    every = md.split("Every op timed")[1]
    assert all(f"\n| {op} |" in every for op in OPS if any("ratio" in r for r in r0[op].values()))


def test_the_coverage_verdict_is_the_worse_of_the_ranks():
    ok = {"status": "pass", "R": ("pass", ""), "P": ("pass", ""), "gathered": []}
    wrong_on_1 = {"status": "wrong", "R": ("pass", ""), "P": ("wrong", "values differ"), "gathered": []}
    skip = {"status": "skip", "R": ("skip", "no sample"), "gathered": []}
    got = coverage_table.worse_of_ranks({"conv1d": ok, "add": ok, "x": skip}, {"conv1d": wrong_on_1, "add": ok, "x": skip})
    assert got["conv1d"]["status"] == "wrong" and got["conv1d"]["P"] == ("wrong", "rank 1: values differ")
    assert got["conv1d"]["R"] == ("pass", "") and got["add"] == ok and got["x"]["status"] == "skip"
