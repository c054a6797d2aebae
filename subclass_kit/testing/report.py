"""The result of a conformance run: rows, a verdict, a table and JSON.

A :class:`CheckRow` is one check on one subject (a class): its name, ``status``
(``"pass"``, ``"fail"`` or ``"skip"``), the seconds it took and a message. For a failure the
message says what is wrong and how to fix it; for a skip, why it did not run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import SubclassCheckError

__all__ = ["CheckRow", "CheckReport", "PASS", "FAIL", "SKIP", "format_row", "format_summary"]

PASS, FAIL, SKIP = "pass", "fail", "skip"
# The OpInfo sweep's outcomes (subclass_kit.testing.opinfo.OUTCOMES), in report order.
OPINFO_OUTCOMES = ("pass", "wrong", "error", "timeout", "unsupported", "skip")
JSON_VERSION = 1


@dataclass(frozen=True)
class CheckRow:
    """One check's outcome.

    Example:
        >>> row = CheckRow("ctx.hashable", "pass", 0.001, "", subject="TwoTensor")
        >>> row.status, row.ok
        ('pass', True)
    """

    name: str
    status: str
    seconds: float
    message: str = ""
    subject: str = ""
    outcome: str = ""  # the OpInfo sweep's finer outcome (wrong, unsupported, ...) on opinfo rows

    @property
    def ok(self) -> bool:
        """True unless the check failed (a skip is not a failure)."""
        return self.status != FAIL

    def to_json(self) -> dict:
        """The row as a JSON-able dict."""
        d = asdict(self)
        d["seconds"] = round(self.seconds, 4)
        if not d["outcome"]:
            del d["outcome"]
        return d


@dataclass
class CheckReport:
    """All rows of one :func:`~subclass_kit.testing.check_subclass` run.

    Example:
        >>> report = CheckReport("Demo", [CheckRow("ctx.hashable", "pass", 0.0)])
        >>> report.ok, len(report.failures)
        (True, 0)
        >>> report.raise_if_failed()  # nothing failed: returns None
    """

    subject: str
    rows: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no row failed."""
        return all(r.ok for r in self.rows)

    @property
    def failures(self) -> list:
        """The failing rows, in run order."""
        return [r for r in self.rows if r.status == FAIL]

    def row(self, name: str) -> CheckRow:
        """The row called ``name`` (KeyError naming the known rows if there is none)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"{self.subject} has no row {name!r}; rows: {[r.name for r in self.rows]}")

    def counts(self) -> dict:
        """``{"pass": n, "fail": n, "skip": n}``."""
        out = {PASS: 0, FAIL: 0, SKIP: 0}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    @property
    def seconds(self) -> float:
        """Total time of all rows."""
        return sum(r.seconds for r in self.rows)

    def raise_if_failed(self) -> None:
        """Raise :class:`SubclassCheckError` listing every failing row; do nothing if none failed.

        Example:
            >>> bad = CheckReport("Demo", [CheckRow("ctx.hashable", "fail", 0.0, "ctx is a list.")])
            >>> try:
            ...     bad.raise_if_failed()
            ... except AssertionError as e:
            ...     print(e)
            Demo failed 1 of 1 checks:
              - ctx.hashable: ctx is a list.
        """
        fails = self.failures
        if not fails:
            return None
        lines = [f"{self.subject} failed {len(fails)} of {len(self.rows)} checks:"]
        for r in fails:
            lines.append(f"  - {r.name}: {r.message}")
        raise SubclassCheckError("\n".join(lines), report=self)

    def coverage(self) -> dict | None:
        """The OpInfo sweep's coverage, or None when it did not run: ``{"ops": M, "pass": N,
        "by_outcome": {outcome: [op names]}}`` (outcomes: pass, wrong, error, timeout,
        unsupported, skip).

        Example:
            >>> r = CheckReport("Demo", [CheckRow("opinfo[neg]", "pass", 0.0, outcome="pass"),
            ...                          CheckRow("opinfo[sin]", "skip", 0.0, "unsupported: ...", outcome="unsupported")])
            >>> r.coverage()["pass"], r.coverage()["ops"], r.coverage()["by_outcome"]["unsupported"]
            (1, 2, ['sin'])
        """
        rows = [r for r in self.rows if r.name.startswith("opinfo[")]
        if not rows:
            return None
        by: dict = {o: [] for o in OPINFO_OUTCOMES}
        for r in rows:
            outcome = r.outcome or ("skip" if r.status == SKIP else "error" if r.status == FAIL else "pass")
            by.setdefault(outcome, []).append(r.name[len("opinfo["):-1])
        return {"ops": len(rows), "pass": len(by["pass"]), "by_outcome": by}

    def coverage_line(self) -> str:
        """``"Demo: N of M ops pass (0 wrong, ...)"``, or "" without an OpInfo sweep."""
        cov = self.coverage()
        if cov is None:
            return ""
        rest = ", ".join(f"{len(v)} {k}" for k, v in cov["by_outcome"].items() if k != "pass")
        return f"{self.subject}: {cov['pass']} of {cov['ops']} ops pass ({rest})"

    def to_json(self) -> dict:
        """The report as a JSON-able dict (``subject``, ``ok``, ``counts``, ``rows``, and
        ``opinfo`` with the coverage when the sweep ran)."""
        out = {
            "subject": self.subject,
            "ok": self.ok,
            "counts": self.counts(),
            "seconds": round(self.seconds, 3),
            "rows": [r.to_json() for r in self.rows],
        }
        cov = self.coverage()
        if cov is not None:
            out["opinfo"] = cov
        return out

    def to_markdown(self) -> str:
        """The report as Markdown: a row table, then the OpInfo coverage when the sweep ran."""
        lines = [f"## {self.subject}", "", f"{'passed' if self.ok else 'FAILED'}: "
                 + ", ".join(f"{n} {k}" for k, n in self.counts().items()), "",
                 "| check | status | seconds | message |", "|---|---|---|---|"]
        for r in self.rows:
            msg = r.message.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{r.name}` | {_MARK.get(r.status, r.status)} | {r.seconds:.2f} | {msg} |")
        cov = self.coverage()
        if cov is not None:
            lines += ["", f"### OpInfo coverage: {cov['pass']} of {cov['ops']} ops pass", "",
                      "| outcome | ops | which |", "|---|---|---|"]
            for k, names in cov["by_outcome"].items():
                lines.append(f"| {k} | {len(names)} | {', '.join(names) or '-'} |")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        lines = [format_row(r) for r in self.rows]
        lines.append(format_summary([self]))
        return "\n".join(lines)


_MARK = {PASS: "PASS", FAIL: "FAIL", SKIP: "skip"}


def format_row(row: CheckRow, *, width: int = 34) -> str:
    """One line: status, time, subject, check name, message.

    Example:
        >>> print(format_row(CheckRow("ctx.hashable", "pass", 0.0123, "", subject="TwoTensor")))
        PASS   0.01s  TwoTensor  ctx.hashable
    """
    head = f"{_MARK.get(row.status, row.status):<5} {row.seconds:6.2f}s  "
    if row.subject:
        head += f"{row.subject}  "
    if not row.message:
        return head + row.name
    return head + f"{row.name:<{width}} {row.message}"


def format_summary(reports) -> str:
    """A table with one line per subject (passed / failed / skipped / seconds) and a total.

    Example:
        >>> r = CheckReport("Demo", [CheckRow("a", "pass", 1.0), CheckRow("b", "skip", 0.5)])
        >>> print(format_summary([r]))
        subject    pass  fail  skip    seconds
        Demo          1     0     1       1.50
        total         1     0     1       1.50
    """
    reports = list(reports)
    width = max([len("subject"), len("total")] + [len(r.subject) for r in reports])
    lines = [f"{'subject':<{width}}  {'pass':>4}  {'fail':>4}  {'skip':>4}  {'seconds':>9}"]
    tot = {PASS: 0, FAIL: 0, SKIP: 0}
    secs = 0.0
    for r in reports:
        c = r.counts()
        for k in tot:
            tot[k] += c.get(k, 0)
        secs += r.seconds
        lines.append(
            f"{r.subject:<{width}}  {c[PASS]:>4}  {c[FAIL]:>4}  {c[SKIP]:>4}  {r.seconds:>9.2f}"
        )
    lines.append(
        f"{'total':<{width}}  {tot[PASS]:>4}  {tot[FAIL]:>4}  {tot[SKIP]:>4}  {secs:>9.2f}"
    )
    return "\n".join(lines)
