"""Compile checks: ``torch.compile(fullgraph=True)`` per backend equals eager, in one frame.

The function compiled applies every op that passed its eager check to one sample and
returns all results, so a backend is compiled once per class; when it fails, each op is
compiled alone to name the culprit. A second call with a flatten/unflatten copy of the
input must reuse the compiled frame (a ctx that is not equal to its own copy recompiles
on every call).
"""

from __future__ import annotations

import os
import re
import traceback

import torch

from .. import _compat
from ._compare import difference
from ._ops import VIEW
from ._check import Check, Fail, Skip
from ._subject import describe, flatten

__all__ = ["plan", "composite", "explain_error", "compile_and_run", "usable_cases", "guard_cases"]


def plan(run) -> list:
    return [Check(f"compile[{b}]", _make(b), ("protocol.flatten",)) for b in run.backends]


def _make(backend):
    def check(run):
        return _compile_check(run, backend)

    return check


def composite(cases):
    """``fn(x) -> tuple`` applying every case to ``x``."""

    def fn(x):
        return tuple(c.call(x) for c in cases)

    return fn


_GUARD_PREFERRED = (
    "aten.mul.Tensor(x, 2.0)",
    "aten.slice.Tensor(x, 0, 0, n//2)",
    "aten.add.Tensor(x, x)",
    "aten.detach.default(x)",
)


def guard_cases(cases, limit: int = 4) -> list:
    """A few representative ops for the guard checks (sweep, meta change): what they test
    is the input's guards, which any op shows; fewer ops compile faster."""
    by_label = {c.label: c for c in cases}
    picked = [by_label[k] for k in _GUARD_PREFERRED if k in by_label]
    rest = [c for c in cases if c not in picked]
    return (picked + rest)[:limit]


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.+)')


def _foreign(path: str) -> bool:
    """True for frames of torch, the standard library or this checker (not the user's)."""
    path = os.path.abspath(path)
    if "<" in path or path.startswith(_SKIP_DIRS):
        return True
    return path.startswith(_STDLIB) and "site-packages" not in path


_SKIP_DIRS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (torch.__file__, __file__))
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


def _user_frame(chain) -> str:
    """The innermost frame of user code in the exceptions' tracebacks (the subclass's
    handler that raised), else the frame dynamo quotes after 'from user code:'."""
    for exc in reversed(chain):
        for fr in reversed(traceback.extract_tb(exc.__traceback__)):
            if not _foreign(fr.filename):
                return f"{fr.filename}:{fr.lineno} in {fr.name}: {(fr.line or '').strip()}"
    text = "\n".join(str(x) for x in chain)
    tail = text.split("from user code:", 1)[-1] if "from user code:" in text else ""
    for path, line, fn, code in reversed(_USER_FRAME.findall(tail)):
        if not _foreign(path):
            return f"{path}:{line} in {fn}: {code.strip()}"
    return ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    for ln in text.splitlines():
        ln = ln.strip()
        if ln and not ln.startswith(("backend=", "Set TORCHDYNAMO", "While executing", "Original traceback")):
            return ln[:240]
    return type(e).__name__


def locate(fn, x) -> str:
    """Where ``fn(x)`` fails on a fake copy of ``x``: dynamo strips the tracebacks of the
    errors it re-raises, so the frame in the subclass is found by replaying outside it."""
    env = _compat.shape_env()
    mode = _compat.fake_mode(env)
    try:
        fx = mode.from_tensor(x)
        with mode:
            fn(fx)
    except Exception as e:
        chain: list[BaseException] = []
        c: BaseException | None = e
        while c is not None and len(chain) < 6:
            chain.append(c)
            c = c.__cause__ or c.__context__
        return _user_frame(chain)
    return ""


def explain_error(e: BaseException, *, backend: str, where: str, replay=None) -> tuple:
    """``(what, fix)`` for an exception raised while compiling or running a compiled fn;
    ``replay`` (fn, x) finds the failing frame when the exception lost it."""
    chain: list[BaseException] = []
    c: BaseException | None = e
    while c is not None and len(chain) < 6:
        chain.append(c)
        c = c.__cause__ or c.__context__
    text = "\n".join(str(x) for x in chain)
    frame = _user_frame(chain)
    if replay is not None and (not frame or "subclass_kit/testing" in frame):
        frame = locate(*replay) or frame
    at = f" at {frame}" if frame else ""
    data_dep = any(isinstance(x, _compat.DATA_DEPENDENT_ERRORS) for x in chain) or "data-dependent" in text or "data dependent" in text
    if data_dep:
        return (
            f"torch.compile(backend={backend!r}, fullgraph=True) of {where} hit a data-dependent "
            f"Python branch{at} (a graph break without fullgraph): {_first_line(e)}",
            "do not branch in Python on tensor values in __torch_dispatch__/__torch_function__ "
            "or op handlers; compute both sides with tensor ops (torch.where), or keep the "
            "decision in the ctx (a meta value dynamo guards on)",
        )
    if any(isinstance(x, _compat.GRAPH_BREAK_ERRORS) for x in chain):
        return (
            f"torch.compile(backend={backend!r}, fullgraph=True) of {where} hit a graph break{at}: "
            f"{_first_line(e)}",
            "keep code dynamo cannot trace out of __torch_function__ and properties (set "
            "__torch_function__ = torch._C._disabled_torch_function_impl unless you need it)",
        )
    return (
        f"torch.compile(backend={backend!r}, fullgraph=True) of {where} raised "
        f"{type(chain[-1]).__name__}{at}: {_first_line(chain[-1])}",
        "make every handler traceable with fake tensors (no .item()/.tolist()/numpy/data_ptr), "
        "and make __tensor_unflatten__ honour outer_size/outer_stride",
    )


def _as_strided_probe(case, x) -> str:
    """What ``aten.as_strided`` on the wrapped input gives for the view's geometry: how
    AOTAutograd regenerates a compiled output that aliases an input. '' if it is right."""
    try:
        view = case.call(x)
        got = torch.ops.aten.as_strided.default(x, view.shape, view.stride(), view.storage_offset())
    except Exception as e:
        return f"aten.as_strided on it raises {type(e).__name__}"
    d = difference(got, view, "as_strided")
    return d or ""


def _as_strided_unsupported(run, case, e, backend) -> tuple:
    return (
        f"{case.label}: compiled with backend={backend!r}, returning this view of an input fails: "
        f"{_first_line(e)}. AOTAutograd regenerates a compiled output that aliases an input from "
        f"the input itself, with aten.as_strided(x, size, stride, storage_offset), which {run.name} "
        "does not support",
        f"support aten.as_strided.default on {run.name} (at least for the geometries of its view "
        "ops), or do not return views of compiled inputs (return x.t().clone())",
    )


def explain_difference(run, case, d: str, backend: str, x=None) -> tuple:
    """``(what, fix)`` for a compiled result that differs from eager by ``d``."""
    label = f"{case.label}: " if case is not None else ""
    if case is not None and case.kind == VIEW and x is not None:
        probe = _as_strided_probe(case, x)
        if probe:
            return (
                f"{label}compiled with backend={backend!r}, this view of the input comes back wrong "
                f"({d}). AOTAutograd regenerates a compiled output that aliases an input from the "
                f"input itself, with aten.as_strided(x, size, stride, storage_offset), and on a "
                f"{run.name} that gives {probe.split(': ', 1)[-1]}",
                f"handle aten.as_strided.default in {run.name} so that it returns the same type and "
                "ctx as the view would (at least for the input's own geometry, where it is an "
                "alias, and for the geometries of the class's view ops)",
            )
    return (
        f"{label}torch.compile(backend={backend!r}) result differs from eager: {d}",
        "make handlers return the same ctx and values under fake tensors as in eager; "
        "check __tensor_unflatten__ honours outer_size/outer_stride",
    )


def compile_and_run(fn, args, *, backend: str, dynamic=None):
    """Compile ``fn`` with a counting backend and run it; ``(result, counter, compiled)``."""
    cnt = _compat.compile_counter(backend)
    cfn = torch.compile(fn, backend=cnt, fullgraph=True, dynamic=dynamic)
    return cfn(*args), cnt, cfn


def _culprits(run, cases, x, backend: str) -> list:
    """Compile each case alone: ``(case, (what, fix))`` for every one that fails or differs."""
    out = []
    for c in cases:
        _compat.dynamo_reset()
        fn = composite([c])
        try:
            got, _, _ = compile_and_run(fn, (x,), backend=backend)
        except Exception as e:
            if c.kind == VIEW and "as_strided" in str(e):
                out.append((c, _as_strided_unsupported(run, c, e, backend)))
            else:
                out.append((c, explain_error(e, backend=backend, where=c.label, replay=(c.call, x))))
            continue
        d = difference(got, fn(x))
        if d:
            out.append((c, explain_difference(run, c, d, backend, x)))
    return out


def usable_cases(run, backend: str) -> list:
    """The ops the other compile checks may use: those compile[backend] did not flag.
    Raises Skip when compile[backend] failed without naming single ops."""
    bad = run.state.get("compile_bad", {}).get(backend)
    if bad is None:
        return run.compile_cases()
    if bad == "all":
        raise Skip(f"compile[{backend}] failed for the ops together but for none alone; fix that first")
    return [c for c in run.compile_cases() if c.label not in bad]


def _fail_with_culprits(run, cases, x, backend, what, fix):
    found = _culprits(run, cases, x, backend)
    bad = run.state.setdefault("compile_bad", {})
    if not found:
        bad[backend] = "all"
        raise Fail(what, fix)
    bad[backend] = {c.label for c, _ in found}
    c, (what1, fix1) = found[0]
    what = what1 if what1.startswith(c.label) else f"{c.label}: {what1}"
    if "graph break" in what:
        reasons = _compat.graph_break_reasons(composite([c]), x)
        if reasons:
            what += f" [without fullgraph: {len(reasons)} graph break(s): {reasons[0]}]"
    if len(found) > 1:
        what += f" (also failing alone: {', '.join(o.label for o, _ in found[1:])})"
    raise Fail(what, fix1 or fix)


def _compile_check(run, backend: str):
    cases = run.compile_cases()
    if not cases:
        raise Skip("no op passed its eager check, so there is nothing to compile")
    x = run.first
    where = f"{len(cases)} ops on {describe(x)}"
    fn = composite(cases)
    expected = fn(x)
    _compat.dynamo_reset()
    try:
        got, cnt, cfn = compile_and_run(fn, (x,), backend=backend)
    except Exception as e:
        what, fix = explain_error(e, backend=backend, where=where)
        _fail_with_culprits(run, cases, x, backend, what, fix)
    d = difference(got, expected)
    if d:
        what, fix = explain_difference(run, None, d, backend)
        _fail_with_culprits(run, cases, x, backend, what, fix)
    names, ctx = flatten(x)
    copy_ = type(x).__tensor_unflatten__({n: getattr(x, n) for n in names}, ctx, x.shape, x.stride())
    cfn(x)
    cfn(copy_)
    if cnt.frame_count == 2 and x._is_view() and not copy_._is_view():
        # The sample is a view of another tensor and dynamo guards its base (for a jagged
        # NestedTensor: ``L['x']._base.size()[0]``); a copy has no base, so that guard
        # fails on None and the copy compiles its own frame. Whether the ctx is equal to
        # its copy's is then seen on a second copy, which must reuse the copy's frame.
        reasons = _compat.guard_failure_reasons()
        again = type(x).__tensor_unflatten__({n: getattr(x, n) for n in names}, ctx, x.shape, x.stride())
        cfn(again)
        if cnt.frame_count == 2:
            why = f" ({reasons[-1].strip()[:120]})" if reasons else ""
            return (
                f"{len(cases)} ops, 1 frame; a flatten/unflatten copy compiled a second frame because "
                f"the sample is a view and the copy is not (dynamo guards a view's _base{why}); a "
                "second copy reused the copy's frame"
            )
    if cnt.frame_count != 1:
        reasons = _compat.guard_failure_reasons()
        raise Fail(
            f"calling the compiled function again with the same input (and with a flatten/"
            f"unflatten copy of it) compiled {cnt.frame_count} frames instead of 1"
            + (f"; dynamo's reason: {reasons[-1].strip()[:200]}" if reasons else ""),
            "make the ctx equal (==) to the ctx of a copy with the same values: a tuple or "
            "frozen dataclass, not an object compared by identity",
        )
    return f"{len(cases)} ops, 1 frame"
