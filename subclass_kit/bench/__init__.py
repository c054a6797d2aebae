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

__all__ = ["SUITES", "main", "markdown_table", "side_by_side"]

# Suites that may not exist yet (they arrive with their features) are skipped, not failed.
SUITES = ("dispatch_bench", "guards_bench", "collectives_bench", "tp_bench")


def side_by_side(fns: dict, *, number: int, repeat: int) -> dict:
    """``{name: (median_us, best_us)}`` per call of each fn, measured round-robin in
    blocks so that load from other processes hits every implementation alike.

    Example:
        >>> r = side_by_side({"noop": lambda: None}, number=10, repeat=3)
        >>> sorted(r), len(r["noop"])
        (['noop'], 2)
    """
    import statistics
    import time

    for fn in fns.values():
        for _ in range(max(5, number // 10)):
            fn()
    samples: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[k].append((time.perf_counter() - t0) / number * 1e6)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


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
