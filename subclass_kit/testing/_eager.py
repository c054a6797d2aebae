"""Eager op checks: each op on every sample against the same op on ``to_plain()``.

Beyond values: a view op must return a result that aliases its input (every inner tensor a
view of an inner tensor of the input, and the wrapper itself marked as aliasing, which
``return_and_correct_aliasing`` does), or mutations through the view are lost and
AOTAutograd's alias analysis is wrong; an in-place op must update every inner tensor
exactly as the out-of-place op computes them.
"""

from __future__ import annotations

import torch

from .. import _compat
from ._compare import dense_difference, difference
from ._ops import INPLACE, VIEW
from ._check import Check, Fail, Skip
from ._mask import MASK_HOOK, ShapeDependsError, plain_mask, reference
from ._subject import dense, describe, flatten

__all__ = ["plan"]

_ALIAS_FIX = (
    "apply the view op to each inner tensor (func(x.a, *rest)) instead of copying, and return "
    "torch.utils._python_dispatch.return_and_correct_aliasing(func, args, kwargs, out) from "
    "__torch_dispatch__ (subclass_kit.WrapperTensor does both)"
)


def plan(run) -> list:
    checks = []
    for case in run.cases:
        if not any(case.applies(x) for x in run.samples):
            continue
        # A wrong to_plain() makes every dense comparison compare two wrong values: the
        # eager rows wait for protocol.to_plain instead of passing on them.
        req = ("protocol.flatten", "protocol.to_plain") if run.subject.has_to_plain else ("protocol.flatten",)
        checks.append(Check(f"eager[{case.label}]", _make(case), req))
    return checks


def _make(case):
    def check(run):
        return _check_case(run, case)

    return check


def _unsupported_fix(run, case) -> str:
    name = run.name
    if run.subject.is_kit:
        return (
            f"register a handler with @{name}.implements({case.label.split('(')[0]}), or set "
            "__fallback__ = fallbacks.map_inner / fallbacks.to_plain in the class body"
        )
    return f"handle {case.label.split('(')[0]} in {name}.__torch_dispatch__"


def _dense_error(run, case, x):
    """``"Type: message"`` when the op raises on ``to_plain()`` of the sample as well, else None."""
    if not run.subject.has_to_plain:
        return None
    try:
        case.call(dense(x))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first}"
    return None


def _check_case(run, case):
    notes: list = []
    refused: list = []
    for i, x in enumerate(run.samples):
        if not case.applies(x):
            continue
        what = f"sample {i} ({describe(x)})"
        try:
            out = case.call(x)
        except NotImplementedError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if case.required:
                raise Fail(
                    f"{run.name} does not support {case.label} ({type(e).__name__}: {first[:160]}); "
                    f"it is needed because {case.why}",
                    _unsupported_fix(run, case),
                ) from None
            raise Skip(f"not supported by {run.name} (NotImplementedError); fine unless you need it") from None
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            dense_error = _dense_error(run, case, x)
            if dense_error is not None:
                # The op refuses this sample densely too (det of a non-square matrix): the
                # class raised where torch raises, which is right; the sample judges nothing.
                refused.append(f"sample {i}: {dense_error}")
                continue
            if isinstance(e, AssertionError) and not case.required:
                # A handler that refuses inputs with `assert` (torchao's do) refuses the op;
                # not a wrong result, so not judged -- but said, with where.
                raise Skip(
                    f"refused by an assertion in {run.name}'s handler{_where(e)} "
                    f"(AssertionError: {first[:120]}); not judged -- pass ops=[...] for the ops you need"
                ) from None
            raise Fail(
                f"{case.label} on {what} raised {type(e).__name__}: {first[:200]}",
                "raise NotImplementedError for ops the class does not support, and fix the handler otherwise",
            ) from None
        if case.kind == VIEW:
            note = _check_alias(run, case, x, out, what)
            if note and note not in notes:
                notes.append(note)
        if case.kind == INPLACE:
            _check_inplace(run, case, x, out, what)
        if run.subject.has_to_plain:
            note = _compare_dense(run, case, x, out, what)
            if note and note not in notes:
                notes.append(note)
    if refused and len(refused) == sum(1 for x in run.samples if case.applies(x)):
        raise Skip(f"{case.label} raises on every sample for the dense tensor too ({refused[0][:160]}); not judged")
    if case not in run.passed_cases:
        run.passed_cases.append(case)
    if not run.subject.has_to_plain:
        notes.append("not compared with a dense result (no to_plain)")
    return "; ".join(notes)


def _compare_dense(run, case, x, out, what) -> str:
    """Compare ``out`` with the op on ``to_plain()`` at the positions that mean something
    (see ``_mask``); a note when some meaningful positions could not be judged."""
    mask = plain_mask(x)
    d0 = dense(x)
    try:
        # (random or uninitialized results: shapes and dtypes only, so nothing to narrow)
        masked = mask is not None and case.deterministic
        ref = reference(case.call, [d0], [mask if masked else None], op=case.op,
                        args=case.args(d0) if masked and case.kind != INPLACE else None)
    except ShapeDependsError as e:
        raise Skip(f"{case.label} on {what}: {e}; not judged") from None
    d = dense_difference(out, ref.expected, "result", values=case.deterministic, judged=ref.judged)
    if d:
        op = case.label.split("(")[0]
        against = f"{ref.how} on to_plain()" if ref.how else "the same op on to_plain()"
        if mask is None and not hasattr(run.cls, MASK_HOOK):
            fix = (f"fix the handler for {op} where it differs (or to_plain(), if it is the one that is wrong); "
                   f"if those positions of to_plain() mean nothing (padding), declare the meaningful ones with "
                   f"{run.name}.__plain_mask__(self) (docs/checking.md)")
        else:
            fix = (f"fix the handler for {op}: it differs at positions {run.name}.__plain_mask__ marks meaningful "
                   "(or fix __plain_mask__ / to_plain(), if they are the ones that are wrong)")
        raise Fail(f"{case.label} on {what} disagrees with {against}: {d}", fix)
    notes = []
    if ref.how:
        notes.append(f"compared with {ref.how}")
    judged, skipped = ref.counts(out)
    if skipped and not judged:
        raise Skip(f"{case.label} on {what}: the dense result at every meaningful position depends on don't-care "
                   "positions of the input (or on the op's own randomness), so nothing could be judged")
    if skipped:
        notes.append(f"{skipped} meaningful position(s) not judged: the dense result there depends on "
                     "don't-care positions of the input")
    return "; ".join(notes)


def _storages(t) -> list:
    out = []
    for n in flatten(t)[0]:
        v = getattr(t, n)
        if not isinstance(v, torch.Tensor):
            continue
        if _compat.is_traceable_wrapper_subclass(v):
            out.extend(_storages(v))
        else:
            out.append(v)
    return out


def _check_alias(run, case, x, out, what):
    if not isinstance(out, torch.Tensor):
        return ""
    if not _compat.is_traceable_wrapper_subclass(out):
        return f"returns a plain {type(out).__name__} (a copy, not a view): in-place ops on the result do not reach the input"
    ins = _storages(x)
    for n in flatten(out)[0]:
        v = getattr(out, n)
        if not isinstance(v, torch.Tensor) or _compat.is_traceable_wrapper_subclass(v):
            continue
        if not any(_compat.same_storage(v, s) for s in ins):
            raise Fail(
                f"{case.label} is a view op, but inner {n!r} of its result on {what} does not "
                "share storage with any inner tensor of the input: it is a copy, so mutating the "
                "view would not update the input",
                _ALIAS_FIX,
            )
    if not _compat.same_storage(out, x):
        raise Fail(
            f"{case.label} is a view op, but its {type(out).__name__} result on {what} does not "
            "alias the input at the wrapper level; AOTAutograd then treats the view as a new "
            "tensor and replays mutations wrongly",
            _ALIAS_FIX,
        )
    return ""


def _check_inplace(run, case, x, out, what):
    if case.twin is None:
        return
    expected = case.call_twin(x)
    if not _compat.is_traceable_wrapper_subclass(out):
        return
    if not _compat.is_traceable_wrapper_subclass(expected) or type(expected) is not type(out):
        return
    names, ctx = flatten(out)
    for n in flatten(expected)[0]:
        a, e = getattr(out, n, None), getattr(expected, n)
        if isinstance(e, torch.Tensor):
            d = difference(a, e, f"inner {n!r}")
            if d:
                raise Fail(
                    f"{case.label} on {what} left {d.split(':')[0]} different from what "
                    f"{case.twin} computes ({d.split(': ', 1)[-1]}): the in-place op did not update "
                    f"inner {n!r} the way the out-of-place op does",
                    f"update every inner tensor in the {case.label.split('(')[0]} handler "
                    "(e.g. func(x.a, ...); func(x.b, ...)) and return the input itself",
                )


def _where(e: BaseException) -> str:
    import traceback

    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        f = fr.filename.replace("\\", "/")
        if "/subclass_kit/" not in f and "/torch/" not in f:
            return f" (at {fr.filename.rsplit('/', 1)[-1]}:{fr.lineno})"
    return ""
