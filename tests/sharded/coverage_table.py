"""Coverage table: ShardedTensor and torch's DTensor over torch's op_db, in one run.

Runs ``_sweep.sweep`` for both implementations on the same 2-rank gloo world, the same ops,
samples, layouts (R / S / P) and tolerances, and writes a JSON record and a Markdown table
(each op's verdict the worse of the two ranks'):
per implementation the count of ops per worst status, the ops DTensor passes and the kit
does not (must be empty), the ops the kit passes and DTensor does not, and the ops the kit
ran through its generic gathering fallback. Usage, from the repository root::

    PYTHONPATH=tests python tests/sharded/coverage_table.py --out build/coverage [--ops a,b]

It takes tens of minutes on two cores (DTensor's sweep is the longer one); the project's
test suite runs the kit half in ``test_op_sweep.py``.

``--time`` adds the speed pass (``_sweep.time_ops``): on every op and layout where both
implementations pass forward on the same sample, the kit's eager forward time over DTensor's
(interleaved rounds, median of the per-round ratios; the op's first sample of
its first ``--time-samples`` that the layout applies to, so that Shard reaches the ops whose
first samples have no even dim), written as ``timing.json`` and
``timing.md``: per layout the number of ops timed and the median, p25 and p75 of their
ratios (over all, and over the ops where both issued the same collectives), the 20 ops
slowest relative to DTensor (in either set), and every op's ratios. ``--impls ''`` skips
the coverage sweeps (time only). The timing pass takes about as long as the kit's sweep.
``--every N`` keeps every Nth entry (``--every 8``: 193 op-layout pairs, a few minutes), to
time two trees side by side on the same subset.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kit_helpers.harness import world  # noqa: E402

from sharded import _sweep  # noqa: E402

STATUSES = ("pass", "wrong", "error", "timeout", "unsupported", "skip")
CHUNK = 40


LAYOUTS = ("R", "S", "P")


def worse_of_ranks(r0: dict, r1: dict) -> dict:
    """Rank 0's sweep records, each layout's verdict replaced by rank 1's where that is worse:
    under a Partial operand the ranks hold different values, and a result right on rank 0
    can be wrong on rank 1 (DTensor's ``item()`` and convolutions of a Partial input)."""
    out = {}
    for op, rec in r0.items():
        rec = dict(rec)
        other = r1.get(op, {})
        for layout in LAYOUTS:
            if layout in rec and layout in other and _sweep._ORDER[other[layout][0]] > _sweep._ORDER[rec[layout][0]]:
                rec[layout] = (other[layout][0], f"rank 1: {other[layout][1]}")
        judged = [rec[la][0] for la in LAYOUTS if la in rec and rec[la][0] != "skip"]
        rec["status"] = max(judged, key=_sweep._ORDER.__getitem__) if judged else "skip"
        out[op] = rec
    return out


def _swept(impl: str, samples: int):
    def task(chunk):
        return worse_of_ranks(*world(2).run(_sweep.sweep, chunk, impl, LAYOUTS, samples, True, timeout=1800))

    def failed(why):
        return {"status": "error", "R": ("error", why), "gathered": [], "whole": [], "seconds": 0.0}

    return task, failed


def _timed(samples: int, rounds: int):
    def task(chunk):
        return world(2).run(_sweep.time_ops, chunk, LAYOUTS, samples, rounds, timeout=1800)[0]

    def failed(why):
        return {layout: {"skip": why} for layout in LAYOUTS}

    return task, failed


def run(names: list, what: str, task, failed, log) -> dict:
    """``task(chunk)`` (rank 0's ``{op: record}``) over ``names`` in chunks; an op that kills
    the world gets ``failed(why)``."""
    out: dict = {}
    for i in range(0, len(names), CHUNK):
        chunk = names[i:i + CHUNK]
        t0 = time.perf_counter()
        try:
            r0 = task(chunk)
        except AssertionError as e:
            # A chunk that kills the world is split in halves, down to the op that does it.
            if len(chunk) == 1:
                out[chunk[0]] = failed(f"the world failed: {str(e)[:300]}")
                continue
            half = len(chunk) // 2
            out.update(run(chunk[:half], what, task, failed, log))
            out.update(run(chunk[half:], what, task, failed, log))
            continue
        out.update(r0)
        log(f"{what}: {i + len(chunk)}/{len(names)} ops, {time.perf_counter() - t0:.0f} s")
    return out


def table(kit: dict, dt: dict) -> str:
    ck, cd = Counter(v["status"] for v in kit.values()), Counter(v["status"] for v in dt.values())
    lines = ["| | " + " | ".join(STATUSES) + " |", "|---|" + "---|" * len(STATUSES)]
    for label, c in (("ShardedTensor (kit)", ck), ("DTensor", cd)):
        lines.append(f"| {label} | " + " | ".join(str(c.get(s, 0)) for s in STATUSES) + " |")
    dt_only = sorted(k for k in dt if dt[k]["status"] == "pass" and kit.get(k, {}).get("status") not in ("pass",))
    kit_only = sorted(k for k in kit if kit[k]["status"] == "pass" and dt.get(k, {}).get("status") not in ("pass",))
    gathered = sorted(k for k, v in kit.items() if v.get("gathered"))
    wrong_dt = sorted(k for k, v in dt.items() if v["status"] == "wrong")
    lines += ["", f"Ops DTensor passes and the kit does not ({len(dt_only)}): {', '.join(dt_only) or 'none'}",
              "", f"Ops the kit passes and DTensor does not ({len(kit_only)}): {', '.join(kit_only)}",
              "", f"DTensor wrong results ({len(wrong_dt)}): {', '.join(wrong_dt)}",
              "", f"Ops that took the kit's generic gathering fallback ({len(gathered)}):", ""]
    lines += [f"- {k}: {', '.join(kit[k]['gathered'])}" for k in gathered]
    return "\n".join(lines) + "\n"


def _quartiles(xs: list) -> dict:
    if not xs:
        return {"median": None, "p25": None, "p75": None}
    p25, median, p75 = statistics.quantiles(xs * 2 if len(xs) == 1 else xs, n=4, method="inclusive")
    return {"median": round(median, 3), "p25": round(p25, 3), "p75": round(p75, 3)}


def _same_comms(r: dict) -> bool:
    return r.get("kit_comms") == r.get("dtensor_comms")


def _slowest(timed: dict, n: int, keep) -> list:
    worst = []
    for op, rec in timed.items():
        got = [(r["ratio"], layout) for layout, r in rec.items() if "ratio" in r and keep(r)]
        if got:
            worst.append((*max(got), op))
    worst.sort(reverse=True)
    return [{"op": op, "layout": layout, "ratio": ratio} for ratio, layout, op in worst[:n]]


def timing_summary(timed: dict, slowest: int = 20) -> dict:
    """Per layout (and over all): ops timed, median, p25 and p75 of the kit / DTensor ratios,
    over every timed op and over those where both issued the same collectives (like for
    like); the ``slowest`` ops by their worst layout's ratio, in either set."""

    def stats(keep) -> dict:
        per: dict = {}
        for layout in (*LAYOUTS, "all"):
            xs = sorted(r["ratio"] for rec in timed.values() for la, r in rec.items()
                        if "ratio" in r and keep(r) and layout in (la, "all"))
            per[layout] = {"ops": len(xs), **_quartiles(xs)}
        return per

    return {"layouts": stats(lambda r: True), "same_comms": stats(_same_comms),
            "slowest": _slowest(timed, slowest, lambda r: True),
            "slowest_same_comms": _slowest(timed, slowest, _same_comms)}


def _comms(counts: dict) -> str:
    return " ".join(f"{k}x{v}" if v > 1 else k for k, v in counts.items()) or "none"


def timing_table(timed: dict, summary: dict) -> str:
    def cell(r):
        if "ratio" not in r:
            return "-"
        return f"{r['ratio']:.2f}" + (" (g)" if r.get("gathered") else "") + ("" if _same_comms(r) else " (c)")

    lines = ["Kit eager forward time over DTensor's, per op (median of interleaved rounds), where both pass",
             "forward on the same sample. (g): the kit took its gathering fallback; (c): the two issued",
             "different collectives (one communicates where the other does not, or another collective),",
             "so the ratio compares different work.", "",
             "| layout | ops timed | median | p25 | p75 | same collectives: ops | median | p25 | p75 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for layout, v in summary["layouts"].items():
        w = summary["same_comms"][layout]
        lines.append(f"| {layout} | {v['ops']} | {v['median']} | {v['p25']} | {v['p75']} "
                     f"| {w['ops']} | {w['median']} | {w['p25']} | {w['p75']} |")
    for key, title in (("slowest", "ops"), ("slowest_same_comms", "ops among those with the same collectives")):
        lines += ["", f"Slowest {len(summary[key])} {title}, relative to DTensor (by their worst layout):", "",
                  "| op | " + " | ".join(LAYOUTS) + " | worst: kit us | DTensor us | kit collectives "
                  "| DTensor collectives |", "|---|" + "---|" * (len(LAYOUTS) + 4)]
        for s in summary[key]:
            rec, w = timed[s["op"]], timed[s["op"]][s["layout"]]
            lines.append(f"| {s['op']} | " + " | ".join(cell(rec.get(la, {})) for la in LAYOUTS)
                         + f" | {w['kit_us']} | {w['dtensor_us']} | {_comms(w['kit_comms'])} "
                         f"| {_comms(w['dtensor_comms'])} |")
    lines += ["", "Every op timed:", "", "| op | " + " | ".join(LAYOUTS) + " |", "|---|" + "---|" * len(LAYOUTS)]
    for op, rec in timed.items():
        if any("ratio" in r for r in rec.values()):
            lines.append(f"| {op} | " + " | ".join(cell(rec.get(la, {})) for la in LAYOUTS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/coverage")
    ap.add_argument("--ops", default=None)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--impls", default="kit,dtensor", help="coverage sweeps to run ('' for none)")
    ap.add_argument("--time", action="store_true", help="also time kit vs DTensor per op (timing.md/json)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds per op and layout")
    ap.add_argument("--time-samples", type=int, default=8,
                    help="samples searched for the first one a layout applies to, in the timing pass")
    ap.add_argument("--every", type=int, default=1,
                    help="only every Nth op_db entry (a quick subset, e.g. two trees timed side by side)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = (a.ops.split(",") if a.ops else _sweep.op_names())[::max(1, a.every)]
    logf = open(os.path.join(a.out, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    res = {}
    for impl in filter(None, a.impls.split(",")):
        t0 = time.perf_counter()
        res[impl] = run(names, impl, *_swept(impl, a.samples), log)
        log(f"{impl}: done in {time.perf_counter() - t0:.0f} s")
        with open(os.path.join(a.out, f"{impl}.json"), "w") as f:
            json.dump(res[impl], f, indent=1, default=list)
    if "kit" in res and "dtensor" in res:
        md = table(res["kit"], res["dtensor"])
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(md)
        print(md)
    if a.time:
        t0 = time.perf_counter()
        timed = run(names, "timing", *_timed(a.time_samples, a.rounds), log)
        log(f"timing: done in {time.perf_counter() - t0:.0f} s")
        summary = timing_summary(timed)
        with open(os.path.join(a.out, "timing.json"), "w") as f:
            json.dump({"summary": summary, "ops": timed}, f, indent=1)
        md = timing_table(timed, summary)
        with open(os.path.join(a.out, "timing.md"), "w") as f:
            f.write(md)
        print(md[:md.index("Every op timed")])


if __name__ == "__main__":
    main()
