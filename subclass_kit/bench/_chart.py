"""The benchmark charts (matplotlib, the ``bench`` extra): ``bench.png`` is the overview, one
bar per suite, its headline (the median of the kit's ratios to the suite's anchor over its
cases, with their range); ``bench-<suite>.png`` holds one suite's panel, each bar an
implementation's time as a ratio to the reference implementation of its case, on a log
axis. :func:`figure` draws every suite's panel in one figure."""

from __future__ import annotations

import logging

__all__ = ["CHART_HINT", "figure", "headlines", "overview", "write_chart"]

_log = logging.getLogger(__name__)

CHART_HINT = "the chart needs matplotlib: pip install 'subclass-kit[bench]'"

# One colour per kind of implementation (colour-blind safe, Okabe-Ito), same in every panel.
_COLOURS = {
    "kit": "#0072B2",
    "torch": "#E69F00",
    "native": "#555555",
    "floor": "#999999",
    "plain": "#CCCCCC",
    "scaling": "#009E73",
}
_LEGEND = {
    "kit": "subclass_kit",
    "torch": "torch",
    "native": "native op (no wrapper)",
    "floor": "floor (minimal wrapper)",
    "plain": "plain tensor",
    "scaling": "larger input",
}


def _us(v: float) -> str:
    return f"{v:.0f} µs" if v >= 100 else f"{v:.1f} µs" if v >= 10 else f"{v:.2f} µs"


def _ranks(ws) -> str:
    return "" if ws is None else f" · {ws} rank{'s' if ws != 1 else ''}"


def _cases(rows: list) -> list:
    """``[(label, reference, [row, ...])]``: a case is a group and name; its rows from every
    world size sit together (each divided by the reference of its own world size), and the
    reference rows are left out (they are the line at 1)."""
    cases: dict = {}
    refs: dict = {}
    for r in rows:
        key = f"{r['group']}: {r['name']}"
        cases.setdefault(key, []).append(r)
        if r["impl"] == r["reference"]:
            refs.setdefault(key, []).append(r)
    out = []
    for key, rs in cases.items():
        ref_rows = refs.get(key, [])
        ref = rs[0]["reference"]
        at = ", ".join(_us(r["median_us"]) + _ranks(r.get("world_size")) for r in ref_rows)
        bars = sorted((r for r in rs if r["impl"] != r["reference"]), key=lambda r: (r.get("world_size") or 0))
        out.append((f"{key}   (÷ {ref}" + (f" = {at}" if at else "") + ")", bars))
    return out


def write_chart(path: str, rows: list, env: dict) -> bool:
    """Draw the overview of ``rows`` (as ``bench.main`` collects them) into the PNG ``path``
    and each suite's panel beside it (``bench-<suite>.png`` for ``path`` ``bench.png``).

    Returns False, writing nothing, when matplotlib is not installed.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "bench.png"
        >>> write_chart(str(path), [], {}), path.read_bytes()[:4]
        (True, b'\\x89PNG')
    """
    import os

    try:
        fig = overview(rows, env)
    except ImportError:
        return False
    fig.savefig(path, dpi=110)
    stem, ext = os.path.splitext(path)
    for suite in dict.fromkeys(r["suite"] for r in rows if "ratio" in r and "reference" in r):
        figure([r for r in rows if r["suite"] == suite], env).savefig(f"{stem}-{suite}{ext}", dpi=110)
    _log.debug("chart: overview and per-suite panels into %s", path)
    return True


def headlines(rows: list) -> list:
    """``[(suite, median, lowest, highest, cases, anchor)]``: per suite, the median of the
    kit's ratios to the reference over its cases (``kind == "kit"`` rows), their range, how
    many cases, and the reference(s) they were divided by.

    Example:
        >>> rows = [{"suite": "s", "impl": "kit", "kind": "kit", "ratio": r, "reference": "torch"} for r in (0.5, 1.0, 2.0)]
        >>> headlines(rows)
        [('s', 1.0, 0.5, 2.0, 3, 'torch')]
    """
    import statistics

    by: dict = {}
    for r in rows:
        if r.get("kind") == "kit" and "ratio" in r and "reference" in r and r["impl"] != r["reference"]:
            by.setdefault(r["suite"], []).append(r)
    out = []
    for suite, rs in by.items():
        ratios = [r["ratio"] for r in rs]
        anchors = ", ".join(dict.fromkeys(r["reference"] for r in rs))
        out.append((suite, statistics.median(ratios), min(ratios), max(ratios), len(ratios), anchors))
    return out


def overview(rows: list, env: dict):
    """The overview ``Figure``: one bar per suite, its headline ratio (:func:`headlines`) on a
    log axis, the range of its cases as a whisker.

    Raises ImportError when matplotlib is not installed.

    Example:
        >>> row = {"suite": "s", "group": "g", "name": "op", "impl": "kit", "kind": "kit",
        ...        "median_us": 2.0, "ratio": 2.0, "reference": "torch"}
        >>> overview([row], {}).axes[0].get_yticklabels()[0].get_text()
        's'
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    heads = headlines(rows)
    fig = Figure(figsize=(11, 0.55 * max(len(heads), 1) + 1.8), layout="constrained")
    ax = fig.subplots()
    fig.suptitle(
        "subclass-kit bench: each suite's headline, the kit's time as a ratio to its anchor\n"
        "(median over the suite's cases, whisker: their range; log scale; < 1 is faster; "
        f"torch {env.get('torch', '?')}{', quick run' if env.get('quick') else ''})", fontsize=11)
    if not heads:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center")
        ax.set_axis_off()
        return fig
    for y, (suite, med, lo, hi, n, anchor) in enumerate(heads):
        ax.barh(y, med - 1, left=1, height=0.6, color=_COLOURS["kit"], edgecolor="black", linewidth=0.4)
        ax.plot([lo, hi], [y, y], color="black", linewidth=1.0, zorder=3)
        ax.plot([med], [y], marker="D", markersize=5, color=_COLOURS["kit"], markeredgecolor="black", zorder=4)
        ax.annotate(f"{med:.2f}×  ({n} case{'s' if n != 1 else ''}, {lo:.2f}–{hi:.2f}×; ÷ {anchor})",
                    (max(hi, med), y), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8.5)
    lo = min(min(h[2] for h in heads), 1.0)
    hi = max(max(h[3] for h in heads), 1.0)
    ax.set_xscale("log")
    ax.set_xlim(lo / 2.0, hi * 8.0)
    ax.set_ylim(len(heads) - 0.4, -0.6)
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(range(len(heads)), [h[0] for h in heads], fontsize=9)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(axis="x", which="major", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    return fig


def figure(rows: list, env: dict):
    """The chart as a matplotlib ``Figure``: one panel (axes) per suite, in row order.

    Raises ImportError when matplotlib is not installed.

    Example:
        >>> row = {"suite": "s", "group": "g", "name": "op", "impl": "kit", "kind": "kit",
        ...        "median_us": 2.0, "ratio": 2.0, "reference": "torch"}
        >>> fig = figure([row], {})
        >>> [ax.get_title(loc="left") for ax in fig.axes], fig.axes[0].get_xscale()
        (['suite: s'], 'log')
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    suites: dict = {}
    for r in rows:
        if "ratio" in r and "reference" in r:
            suites.setdefault(r["suite"], []).append(r)
    panels = [(suite, _cases(rs)) for suite, rs in suites.items()]
    heights = [max(2, sum(len(rs) for _, rs in cases) + len(cases)) for _, cases in panels] or [2]
    fig = Figure(figsize=(11, 0.26 * sum(heights) + 1.2 * len(heights) + 1.0), layout="constrained")
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    threads = sorted({r.get("threads") for r in rows if r.get("threads") is not None})
    fig.suptitle(
        "subclass-kit bench: time per call as a ratio to the reference (log scale; < 1 is faster)\n"
        f"torch {env.get('torch', '?')}, {env.get('cpus', '?')} CPUs, threads while timing: "
        f"{', '.join(map(str, threads)) or '?'}{', quick run' if env.get('quick') else ''}",
        fontsize=11,
    )
    if not panels:
        axes[0].text(0.5, 0.5, "no rows", ha="center", va="center")
        axes[0].set_axis_off()

    for ax, (suite, cases) in zip(axes, panels):
        y, ticks, labels, kinds_seen = 0.0, [], [], []
        spans = []
        ratios = [r["ratio"] for _, rs in cases for r in rs] or [1.0]
        for label, rs in cases:
            top = y
            for r in rs:
                ratio = max(r["ratio"], 1e-3)
                kind = r["kind"]
                ax.barh(y, ratio - 1, left=1, height=0.8, color=_COLOURS[kind], edgecolor="black", linewidth=0.4,
                        label=_LEGEND[kind] if kind not in kinds_seen else None)
                kinds_seen.append(kind)
                # The bar's end, marked: a ratio near 1 has almost no bar to see.
                ax.plot([ratio], [y], marker="D", markersize=4, color=_COLOURS[kind], markeredgecolor="black",
                        markeredgewidth=0.5, zorder=3)
                ax.annotate(f"{r['ratio']:.2f}×  ({_us(r['median_us'])})", (ratio, y),
                            xytext=(4 if ratio >= 1 else -4, 0), textcoords="offset points",
                            ha="left" if ratio >= 1 else "right", va="center", fontsize=8)
                ticks.append(y)
                labels.append(r["impl"] + _ranks(r.get("world_size")))
                y += 1
            spans.append((top, label))
            y += 1  # a gap between cases
        for top, label in spans:
            # The case and its reference, written above its bars.
            ax.text(0.002, top - 0.55, label, transform=ax.get_yaxis_transform(),
                    fontsize=8.5, fontweight="bold", va="bottom", ha="left",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85})
            if top > 0:
                ax.axhline(top - 1, color="#dddddd", linewidth=0.6)
        ax.set_xscale("log")
        lo, hi = min(min(ratios), 1.0), max(max(ratios), 1.0)
        ax.set_xlim(lo / 6.0, hi * 4.0)  # room for the annotations on both sides
        ax.set_ylim(y - 0.5, -1.2)
        ax.axvline(1.0, color="black", linewidth=1.2, label="reference (= 1×)")
        ax.set_yticks(ticks, labels, fontsize=8.5)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(axis="x", which="major", color="#eeeeee", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_title(f"suite: {suite}", loc="left", fontsize=10, fontweight="bold")
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return fig
