"""``subclass-kit bench``: the benchmark suite, side by side with torch's own subclasses.

Timing is ``torch.utils.benchmark.Timer``: ``blocked_autorange`` (or ``timeit`` with a fixed
count where ranks must stay in step), run round-robin by :func:`side_by_side` so that load
from other processes hits every implementation alike. The chart is drawn by matplotlib
(the optional ``bench`` extra); without it the bench still writes JSON and Markdown.

Adding a suite: write ``subclass_kit/bench/_<name>_bench.py`` (internal, hence the ``_``) exposing
``run(quick: bool) -> list[dict]`` (build its rows with :func:`ratio_rows`), and add
``"_<name>_bench"`` to :data:`SUITES` below -- one module, one line. The chart gets one
panel per suite without further changes.

A row: ``group`` and ``name`` (together: what is measured, one *case*), ``impl`` (who does
it, as a person reads it: ``"kit ACT"``, ``"torch ACT"``), ``kind`` (``kit``, ``torch``,
``native``, ``floor``, ``plain`` or ``scaling``: the colour in the chart), ``median_us``,
``iqr_us``, ``threads`` (torch's intra-op threads while timing), ``ratio`` (median over the
``reference`` impl's median in the same case) and, for distributed suites, ``world_size``.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["KINDS", "SUITES", "interleaved", "main", "markdown_table", "ratio_rows", "side_by_side"]

_log = logging.getLogger(__name__)

# The registry: one entry per suite module in this package. Suites whose import fails
# (their feature is missing from this install) are skipped and listed in the JSON.
SUITES = (
    "_dispatch_bench",
    "_guards_bench",
    "_collectives_bench",
    "_sharded_bench",
    "_tp_bench",
    "_boundary_bench",
    "_jagged_bench",
    "_dp_bench",
)

#: Who an implementation belongs to; decides its colour and legend entry in the chart.
KINDS = ("kit", "torch", "native", "floor", "plain", "scaling")


def side_by_side(
    fns: Mapping[str, Callable[..., object]],
    *,
    rounds: int,
    min_run_time: float = 0.05,
    number: int | None = None,
) -> dict:
    """Time every fn in ``rounds`` round-robin rounds; one merged ``Measurement`` per name.

    Each round runs ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time)``
    for every fn in turn, so slow phases of a shared machine hit all of them alike and
    their ratios stay meaningful. With ``number`` each round is ``Timer.timeit(number)``
    instead: a fixed call count, for code that must run the same number of times on every
    rank (collectives). Timing uses torch's current intra-op thread count.

    Example:
        >>> r = side_by_side({"noop": lambda: None}, rounds=2, min_run_time=0.001)
        >>> sorted(r), r["noop"].median > 0, len(r["noop"].times) >= 2
        (['noop'], True, True)
    """
    from torch.utils.benchmark import Measurement, Timer

    threads = torch.get_num_threads()
    timers = {k: Timer(stmt="fn()", globals={"fn": fn}, label=k, num_threads=threads) for k, fn in fns.items()}
    got: dict[str, list] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, timer in timers.items():
            got[k].append(timer.timeit(number) if number is not None else timer.blocked_autorange(min_run_time=min_run_time))
    return {k: Measurement.merge(ms)[0] for k, ms in got.items()}


def interleaved(
    fns: Mapping[str, Callable[..., object]],
    *,
    rounds: int,
    reference: str,
    min_run_time: float = 0.05,
    number: int | None = None,
) -> tuple[dict, dict]:
    """Time ``fns`` in ``rounds`` one-round :func:`side_by_side` calls, the order reversed
    every other round; return ``(merged, ratios)``.

    ``merged`` maps each name to its ``Measurement`` over all rounds; ``ratios`` maps each
    name to the median over rounds of that round's median divided by ``reference``'s. Each
    round's ratio compares times taken back to back, so the median of them is robust to the
    slow phases of a shared machine (which can double one implementation's times for
    seconds), and alternating the order cancels a first-or-second bias. ``number`` fixes the
    call count of every timing (ranks of a world must call alike; see :func:`side_by_side`).

    Example:
        >>> merged, ratios = interleaved({"a": lambda: None, "b": lambda: None}, rounds=3,
        ...                              reference="a", number=10)
        >>> sorted(merged), ratios["a"], len(merged["b"].times)
        (['a', 'b'], 1.0, 3)
    """
    from torch.utils.benchmark import Measurement

    if reference not in fns:
        raise KeyError(f"interleaved: reference {reference!r} is not among {sorted(fns)}")
    if rounds < 1:
        raise ValueError(f"interleaved: rounds must be at least 1, got {rounds}")
    order = list(fns.items())
    per_round = [side_by_side(dict(reversed(order) if r % 2 else order), rounds=1, min_run_time=min_run_time,
                              number=number) for r in range(rounds)]
    merged = {k: Measurement.merge([one[k] for one in per_round])[0] for k in fns}
    ratios = {k: statistics.median(one[k].median / one[reference].median for one in per_round) for k in fns}
    return merged, ratios


def ratio_rows(
    group: str,
    name: str,
    measured: dict,
    *,
    reference: str,
    kinds: dict[str, str],
    **extra: object,
) -> list[dict]:
    """Rows for one case: every impl's median, spread and ratio to the ``reference`` impl.

    ``measured`` maps impl names to ``Measurement`` objects (as :func:`side_by_side`
    returns them); ``kinds`` maps each impl to one of :data:`KINDS`. ``extra`` is copied
    into every row (e.g. ``world_size=2``).

    Example:
        >>> m = side_by_side({"a": lambda: None, "b": lambda: None}, rounds=1, min_run_time=0.001)
        >>> rows = ratio_rows("g", "noop", m, reference="a", kinds={"a": "torch", "b": "kit"})
        >>> [(r["impl"], r["kind"], r["reference"]) for r in rows], rows[0]["ratio"]
        ([('a', 'torch', 'a'), ('b', 'kit', 'a')], 1.0)
    """
    if reference not in measured:
        raise KeyError(f"ratio_rows({group!r}, {name!r}): reference {reference!r} is not among {sorted(measured)}")
    bad = {k: kinds.get(k) for k in measured if kinds.get(k) not in KINDS}
    if bad:
        raise ValueError(f"ratio_rows({group!r}, {name!r}): kinds must be one of {KINDS}, got {bad}")
    ref = measured[reference].median
    return [
        {
            "group": group, "name": name, "impl": impl, "kind": kinds[impl], **extra,
            "median_us": round(m.median * 1e6, 3), "iqr_us": round(m.iqr * 1e6, 3),
            "threads": m.task_spec.num_threads, "ratio": round(m.median / ref, 3), "reference": reference,
        }
        for impl, m in measured.items()
    ]


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


def main(quick: bool = False, out: str = "bench-out", suites: Sequence[str] = SUITES) -> list[dict[str, Any]]:
    """Run every available suite; write ``bench.json``, ``bench.md`` and (with matplotlib)
    ``bench.png`` into ``out``; return the rows.

    Progress goes to the ``subclass_kit.bench`` logger.

    Example:
        >>> rows = main(quick=True, out="/tmp/bench")  # doctest: +SKIP
    """
    from ._chart import CHART_HINT, write_chart

    os.makedirs(out, exist_ok=True)
    rows: list = []
    skipped = []
    for name in suites:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ImportError as e:
            _log.warning("bench: suite %s skipped (%s)", name, e)
            skipped.append(f"{name}: {e}")
            continue
        _log.info("bench: running %s%s", name, " (quick)" if quick else "")
        t0 = time.perf_counter()
        got = mod.run(quick=quick)
        _log.info("bench: %s done, %d rows in %.1f s", name, len(got), time.perf_counter() - t0)
        rows += [{"suite": name.lstrip("_").removesuffix("_bench"), **r} for r in got]
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "timer": "torch.utils.benchmark.Timer",
        "quick": quick,
        "skipped": skipped,
    }
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(f"# subclass-kit bench\n\n{json.dumps(env)}\n\n{markdown_table(rows)}\n")
    png = os.path.join(out, "bench.png")
    if write_chart(png, rows, env):
        _log.info("bench: wrote %s", png)
    else:
        if os.path.exists(png):  # a chart from an earlier run would not show these rows
            os.remove(png)
        _log.warning("bench: no chart written: %s", CHART_HINT)
    return rows
