"""``subclass-kit bench``: the benchmark suite, side by side with torch's own subclasses.

Each suite module exposes ``run(quick: bool) -> list[dict]``; every row has ``group``,
``name``, ``impl`` and ``median_us`` and the ratios its suite defines. ``main`` runs them all
in one process (ratios are only meaningful measured together) and writes ``bench.json``,
``bench.md`` and ``bench.png``.
"""

from __future__ import annotations

import importlib
import json
import os
import platform

import torch

__all__ = ["SUITES", "main", "markdown_table"]

# Suites that may not exist yet (they arrive with their features) are skipped, not failed.
SUITES = ("dispatch_bench", "guards_bench", "collectives_bench")


def markdown_table(rows: list) -> str:
    """Rows as a Markdown table with every key as a column.

    Example:
        >>> print(markdown_table([{"name": "add", "median_us": 1.5}]))
        | name | median_us |
        |---|---|
        | add | 1.5 |
    """
    cols: list = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(quick: bool = False, out: str = "bench-out", suites=SUITES) -> list:
    """Run every available suite; write JSON, Markdown and PNG into ``out``; return the rows.

    Example:
        >>> rows = main(quick=True, out="/tmp/bench")  # doctest: +SKIP
    """
    from .chart import bar_chart_png

    os.makedirs(out, exist_ok=True)
    rows: list = []
    skipped = []
    for name in suites:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ImportError as e:
            skipped.append(f"{name}: {e}")
            continue
        for r in mod.run(quick=quick):
            rows.append({"suite": name.removesuffix("_bench"), **r})
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "quick": quick,
        "skipped": skipped,
    }
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(f"# subclass-kit bench\n\n{json.dumps(env)}\n\n{markdown_table(rows)}\n")
    bars = [(f"{r['suite']} {r['group']} {r['name']} {r['impl']}"[:48], float(r["median_us"])) for r in rows]
    bar_chart_png(os.path.join(out, "bench.png"), bars, title="median us per call (lower is better)")
    return rows
