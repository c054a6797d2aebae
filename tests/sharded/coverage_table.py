"""Coverage table: ShardedTensor and torch's DTensor over torch's op_db, in one run.

Runs ``_sweep.sweep`` for both implementations on the same 2-rank gloo world, the same ops,
samples, layouts (R / S / P) and tolerances, and writes a JSON record and a Markdown table:
per implementation the count of ops per worst status, the ops DTensor passes and the kit
does not (must be empty), the ops the kit passes and DTensor does not, and the ops the kit
ran through its generic gathering fallback. Usage, from the repository root::

    PYTHONPATH=tests python tests/sharded/coverage_table.py --out build/coverage [--ops a,b]

It takes tens of minutes on two cores (DTensor's sweep is the longer one); the project's
test suite runs the kit half in ``test_op_sweep.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kit_helpers.harness import world  # noqa: E402

from sharded import _sweep  # noqa: E402

STATUSES = ("pass", "wrong", "error", "timeout", "unsupported", "skip")
CHUNK = 40


def run(names: list, impl: str, samples: int, log) -> dict:
    out: dict = {}
    for i in range(0, len(names), CHUNK):
        chunk = names[i:i + CHUNK]
        t0 = time.perf_counter()
        try:
            r0, _ = world(2).run(_sweep.sweep, chunk, impl, ("R", "S", "P"), samples, True, timeout=1800)
        except AssertionError as e:
            # A chunk that kills the world is split in halves, down to the op that does it.
            if len(chunk) == 1:
                out[chunk[0]] = {"status": "error", "R": ("error", f"the world failed: {str(e)[:300]}"),
                                 "gathered": [], "whole": [], "seconds": 0.0}
                continue
            half = len(chunk) // 2
            out.update(run(chunk[:half], impl, samples, log))
            out.update(run(chunk[half:], impl, samples, log))
            continue
        out.update(r0)
        log(f"{impl}: {i + len(chunk)}/{len(names)} ops, {time.perf_counter() - t0:.0f} s")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/coverage")
    ap.add_argument("--ops", default=None)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--impls", default="kit,dtensor")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = a.ops.split(",") if a.ops else _sweep.op_names()
    logf = open(os.path.join(a.out, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    res = {}
    for impl in a.impls.split(","):
        t0 = time.perf_counter()
        res[impl] = run(names, impl, a.samples, log)
        log(f"{impl}: done in {time.perf_counter() - t0:.0f} s")
        with open(os.path.join(a.out, f"{impl}.json"), "w") as f:
            json.dump(res[impl], f, indent=1, default=list)
    if "kit" in res and "dtensor" in res:
        md = table(res["kit"], res["dtensor"])
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(md)
        print(md)


if __name__ == "__main__":
    main()
