"""The opt-in OpInfo family: one ``opinfo[<op>]`` row per op of torch's OpInfo database (or
the ops asked for), run through the subject by :func:`~subclass_kit.testing.opinfo.sweep_ops`'s
engine, then an ``opinfo.coverage`` row: N of M ops pass, and which.

Row status per outcome: ``pass`` passes; ``wrong``, ``error`` and ``timeout`` fail;
``unsupported`` and ``skip`` are skips whose message starts with the outcome. The engine's
outcome is kept on the row (``CheckRow.outcome``) for the coverage summary.
"""

from __future__ import annotations

from ._check import Check, Fail, Skip
from .opinfo import SKIP as OP_SKIP, UNSUPPORTED, OpResult, OpSweep, _full_name, opinfo_ops, sweep_op

__all__ = ["plan"]


def _names(spec):
    if spec is True:
        return None
    return spec


def plan(run) -> list:
    if not run.opinfo:
        return []  # opt-in: no row unless asked for
    infos = opinfo_ops(_names(run.opinfo))
    if getattr(run.cls, "from_plain", None) is None or not callable(getattr(run.cls, "to_plain", None)):
        # One row saying why, not one skip per op of a 700-op database.
        return [Check("opinfo.coverage", _coverage, ())]
    checks = [Check(f"opinfo[{_full_name(i)}]", _make(i), ("protocol.flatten",)) for i in infos]
    checks.append(Check("opinfo.coverage", _coverage, ()))
    return checks


def _hook(run):
    hook = getattr(run.cls, "from_plain", None)
    if hook is None:
        raise Skip(
            f"{run.name} has no from_plain(dense) classmethod, so the sweep cannot build instances; "
            "add one returning an instance that holds the dense tensor (see docs/checking.md)"
        )
    if not callable(getattr(run.cls, "to_plain", None)):
        raise Skip(f"{run.name} has no to_plain(), so results cannot be compared with the dense op")
    return hook


def _make(info):
    def check(run):
        hook = _hook(run)
        res = sweep_op(info, hook, backward=run.backward, timeout=run.timeout)
        run.state.setdefault("opinfo", []).append(res)
        run.state.setdefault("outcomes", {})[f"opinfo[{res.op}]"] = res.outcome
        if res.failed:
            raise Fail(f"{res.outcome.upper()}: {res.message}", _fix(run, res))
        if res.outcome == UNSUPPORTED:
            raise Skip(f"unsupported: {res.message}")
        if res.outcome == OP_SKIP:
            raise Skip(res.message)
        back = f"; backward {res.backward}" if res.backward else ""
        note = f"; {res.message}" if res.message else ""
        return f"{res.samples} sample(s) match the dense op{back}{note}"

    return check


def _fix(run, res: OpResult) -> str:
    if res.outcome == "timeout":
        return "find the loop or wait at that line; an op must return"
    if res.outcome == "error":
        return (f"raise NotImplementedError (UnsupportedOpError) from {run.name} for ops it does not support, "
                "and fix the handler or fallback otherwise")
    fix = (f"fix {run.name}'s handler for {res.op} (or the fallback that served it): it returns a result that "
           "differs from the same op on to_plain()")
    if not hasattr(run.cls, "__plain_mask__"):
        fix += ("; if the positions that differ mean nothing in to_plain() (padding), declare the meaningful ones "
                f"with {run.name}.__plain_mask__ (docs/checking.md)")
    return fix


def sweep_of(run) -> OpSweep:
    return OpSweep(run.name, list(run.state.get("opinfo", [])))


def _coverage(run):
    sweep = sweep_of(run)
    if not sweep.results:
        _hook(run)  # says why nothing ran, when it is the hook
        raise Skip("no OpInfo op ran")
    return sweep.summary().split(": ", 1)[1]
