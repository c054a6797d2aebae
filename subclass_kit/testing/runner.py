"""``check_subclass``: run every family of checks on each subject and collect a report.

A family module exposes ``plan(run) -> list[Check]``. A check is a function of the
:class:`Run` that returns a note (pass), raises :class:`Skip` (with the reason) or
:class:`Fail` (what is wrong, and the fix); any other exception fails the row with the
exception named. Checks may name other checks they ``requires``; when one of those did
not pass, the dependent check is skipped and says so instead of failing twice.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Iterable, Sequence

from .. import _compat
from . import (
    _aoti as aoti,
    _autograd as autograd,
    _compiled as compiled,
    _ctx as ctx,
    _dynamic as dynamic,
    _eager as eager,
    _export as export,
    _identity as identity,
    _objects as objects,
    _opinfo as opinfo,
    _protocol as protocol,
    _serialization as serialization,
)
from ._check import Check, Fail, Run, Skip, selected as _selected
from ._deadline import CheckTimeout, deadline
from .parametrize import BACKENDS
from ._ops import default_cases, user_cases
from .report import FAIL, PASS, SKIP, CheckReport, CheckRow
from ._subject import Subject, resolve

__all__ = ["check_subclass", "check_subjects", "Check", "Fail", "Skip", "Run", "BACKENDS"]



# Seconds a row may run before it is interrupted and fails as a hang: far above what any
# row takes on a loaded 2-core machine (an inductor compile of every op: ~60 s).
DEFAULT_TIMEOUT = 600.0


def _valid_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"check_subclass: timeout must be seconds >= 0 or None (0/None: no limit); got {timeout!r}")
    return float(timeout) or None


def _opinfo_spec(opinfo):
    """``opinfo=``: False, True (every OpInfo op), or op names (a list or "a,b")."""
    if opinfo is False or opinfo is None:
        return False
    if opinfo is True:
        return True
    if isinstance(opinfo, str):
        opinfo = [n.strip() for n in opinfo.split(",") if n.strip()]
    opinfo = list(opinfo)
    if not opinfo or not all(isinstance(n, str) for n in opinfo):
        raise ValueError(f"check_subclass: opinfo= takes True or OpInfo op names; got {opinfo!r}")
    return opinfo


class UnknownCheckError(ValueError):
    """``only=`` names a check (or prefix) that does not exist."""


def _families():
    return (protocol, ctx, identity, eager, compiled, dynamic, autograd, export, serialization, objects, aoti, opinfo)


def _check_only(only, names, *, aoti: bool = False, opinfo=False) -> None:
    """An ``only`` entry that selects no check is a typo: say so, with the valid names.
    Selecting the opt-in ``aoti`` row without turning it on gets its own advice."""
    if not only or not names:
        return
    bad = [o for o in only if not any(n.startswith(o) for n in names)]
    off = [o for o in bad if not aoti and "aoti.package".startswith(o)]
    if not opinfo:
        off_opinfo = [o for o in bad if "opinfo".startswith(o) or o.startswith("opinfo")]
        if off_opinfo:
            raise UnknownCheckError(
                f"check_subclass: only={off_opinfo} selects the opt-in OpInfo sweep, which is off; "
                "pass opinfo=True (CLI: --opinfo) to run it"
            )
    if off:
        raise UnknownCheckError(
            f"check_subclass: only={off} selects the opt-in AOTInductor row, which is off; "
            "pass aoti=True (CLI: --aoti) to run it"
        )
    if bad:
        valid = sorted({n.split("[")[0] for n in names} | {n.split(".")[0].split("[")[0] for n in names})
        raise UnknownCheckError(
            f"check_subclass: only={bad} selects no check; valid names and prefixes: {', '.join(valid)}"
        )


def _unexpected(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = ""
    for fr in reversed(tb):
        if "/subclass_kit/testing/" not in fr.filename.replace("\\", "/"):
            where = f" (at {fr.filename}:{fr.lineno} in {fr.name})"
            break
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"raised {type(e).__name__}: {first}{where}"


def _run_one(run: Run, check: Check) -> CheckRow:
    missing = [r for r in check.requires if run.status.get(r) not in (None, PASS)]
    t0 = time.perf_counter()
    if missing:
        status, msg = SKIP, f"skipped because {', '.join(missing)} did not pass"
    else:
        try:
            with deadline(run.timeout, f"{check.name} on {run.name}"):
                note = check.fn(run)
            status, msg = PASS, (note or "")
        except Skip as e:
            status, msg = SKIP, str(e)
        except Fail as e:
            status, msg = FAIL, e.message
        except CheckTimeout as e:
            status, msg = FAIL, (f"{e}: a hang. Fix: find the loop or wait at that line; every op must return "
                                 f"(the limit is timeout= / --timeout)")
        except SystemExit as e:
            # Code under check that exits would end the whole run and read as its verdict.
            status, msg = FAIL, (f"called sys.exit({e.code!r}){_where(e)}; code under check must raise, not exit. "
                                 "Fix: raise an exception instead of calling sys.exit")
        except Exception as e:
            status, msg = FAIL, _unexpected(e)
    secs = time.perf_counter() - t0
    run.status[check.name] = status
    outcome = run.state.get("outcomes", {}).get(check.name, "")
    return CheckRow(check.name, status, secs, msg, subject=run.name, outcome=outcome)


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if "/subclass_kit/testing/" not in fr.filename.replace("\\", "/"):
            return f" at {fr.filename}:{fr.lineno} in {fr.name}"
    return ""


def _valid_backends(backends) -> tuple:
    if isinstance(backends, str):
        backends = (backends,)
    backends = tuple(backends)
    names = [b for b in backends if isinstance(b, str) and b not in BACKENDS]
    if names:
        known = set(_compat.list_backends()) | set(BACKENDS)
        bad = [b for b in names if b not in known]
        if bad:
            raise ValueError(
                f"check_subclass: unknown torch.compile backend(s) {bad}; choose from {sorted(known)}"
            )
    return backends


def check_subjects(
    subjects: Iterable[Subject],
    *,
    ops=None,
    backends=BACKENDS,
    dynamic=True,
    backward=True,
    export=True,
    serialization=True,
    only=None,
    on_row=None,
    aoti=False,
    opinfo=False,
    timeout=DEFAULT_TIMEOUT,
) -> list:
    """Run the battery on already-resolved subjects; one :class:`CheckReport` per subject."""
    backends = _valid_backends(backends)
    if isinstance(only, str):
        only = (only,)
    runs: list[Any] = []
    plans: list[Any] = []
    names: list[str] = []
    for subject in subjects:
        cases = user_cases(ops) if ops is not None else default_cases(subject.cls)
        run = Run(subject, cases, backends, dynamic, backward, export, serialization, tuple(only or ()), aoti=aoti,
                  opinfo=_opinfo_spec(opinfo), timeout=_valid_timeout(timeout))
        plan: list[Any] = []
        for family in _families():
            full = family.plan(run)
            names.extend(c.name for c in full)
            plan.extend(c for c in full if _selected(c.name, only))
        runs.append(run)
        plans.append([c for c in plan if not c.late] + [c for c in plan if c.late])
    _check_only(only, names, aoti=aoti, opinfo=opinfo)
    # Families with work to start early for all subjects at once (one child process).
    for family in _families():
        start = getattr(family, "start", None)
        if start is not None:
            start(runs)
    reports = []
    for run, plan in zip(runs, plans):
        report = CheckReport(run.name)
        try:
            for check in plan:
                with _compat.quiet_torch_logs():
                    row = _run_one(run, check)
                report.rows.append(row)
                if on_row is not None:
                    on_row(row)
        finally:
            for cleanup in run.state.pop("cleanups", []):
                cleanup()
            _compat.dynamo_reset()
        reports.append(report)
    return reports


def check_subclass(
    samples: Any,
    *,
    ops: Sequence[Any] | None = None,
    backends: Sequence[str] = BACKENDS,
    dynamic: bool = True,
    backward: bool = True,
    export: bool = True,
    serialization: bool = True,
    only: str | Sequence[str] | None = None,
    on_row: Callable[..., Any] | None = None,
    aoti: bool = False,
    opinfo: Any = False,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> CheckReport:
    """Check that a wrapper tensor subclass is compile-ready; say what is wrong if not.

    Runs, on every sample: the flatten/unflatten round trip on real, fake, meta and
    symbolic tensors (with a non-contiguous outer stride); the ctx (hashable, immutable,
    tensor-free, picklable, equal after a round trip); the class importable by its
    qualified name and ``_stable_hash_for_caching`` equal in another process; eager ops
    against ``to_plain()`` (views alias, in-place ops update every inner tensor);
    ``torch.compile(fullgraph=True)`` per backend against eager with no graph break; a
    dynamic-shape sweep that compiles once; a meta change that recompiles and stays
    right; backward against the dense computation, eager and compiled; ``torch.export``;
    ``torch.save``/``torch.load(weights_only=True)``; deepcopy; repr.

    Args:
        samples: an instance, a list of instances, a zero-argument factory, or a class
            with a ``__samples__()`` classmethod. Samples of several classes give rows for
            each (all in one report, the subject naming the classes).
        ops: aten overloads or callables to exercise, each called as ``op(sample)``;
            default: a catalog of common ops plus the ops the class registers.
        backends: ``torch.compile`` backends to check.
        dynamic, backward, export, serialization: turn those families off.
        only: check names or prefixes to run (e.g. ``["protocol", "ctx.hashable"]``).
        aoti: add the opt-in ``aoti.package`` row (slow): a model holding a sample as a
            parameter, as is and parametrized, exported and AOTInductor-packaged with a
            dynamic batch dim, equals eager.
        opinfo: add the opt-in operator sweep: True runs torch's whole OpInfo database
            through the class (``from_plain`` builds instances), a list (or ``"a,b"``) runs
            those ops; one ``opinfo[<op>]`` row per op and an ``opinfo.coverage`` row
            (see :func:`~subclass_kit.testing.sweep_ops`).
        timeout: seconds a row (an OpInfo op) may run; past it the row fails as a hang,
            naming where it was interrupted, and the run goes on. 0 or None: no limit.
        on_row: called with each :class:`CheckRow` as soon as it completes.

    Returns:
        A :class:`CheckReport`; ``.ok``, ``.rows``, ``.raise_if_failed()``.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> from subclass_kit.testing import check_subclass
        >>> x = TwoTensor(torch.randn(4, 6), torch.randn(4, 6))
        >>> report = check_subclass(x, backends=("eager",), only=["protocol", "ctx"])
        >>> report.ok, report.row("ctx.hashable").status
        (True, 'pass')
    """
    subjects = resolve(samples)
    reports = check_subjects(
        subjects,
        ops=ops,
        backends=backends,
        dynamic=dynamic,
        backward=backward,
        export=export,
        serialization=serialization,
        only=only,
        on_row=on_row,
        aoti=aoti,
        opinfo=opinfo,
        timeout=timeout,
    )
    if len(reports) == 1:
        return reports[0]
    merged = CheckReport(" + ".join(r.subject for r in reports))
    for r in reports:
        merged.rows.extend(r.rows)
    return merged

