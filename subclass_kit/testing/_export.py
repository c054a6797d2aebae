"""Export check: ``torch.export`` of the ops on a sample input runs and matches eager, also
after ``torch.export.save`` / ``torch.export.load``."""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from .. import _compat
from ._compare import difference
from ._compiled import composite
from ._ops import INPLACE
from ._check import Check, Fail, Skip
from ._subject import describe

__all__ = ["plan"]

_FIX_OFF = "; or pass export=False (--no-export) if you never export models that take it"


def plan(run) -> list:
    if not run.export:
        return [Check("export.round_trip", _off, ())]
    return [Check("export.round_trip", _export, ("protocol.flatten", "protocol.round_trip_fake"))]


def _off(run):
    raise Skip("turned off (export=False)")


class _Ops(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _first_line(e) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _export(run):
    cases = [c for c in run.compile_cases() if c.kind != INPLACE]
    if not cases:
        raise Skip("no op passed its eager check, so there is nothing to export")
    x = run.first
    fn = composite(cases)
    expected = fn(x)
    try:
        # A failed non-strict export prints the partial graph to stderr; the row says enough.
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch's own, about torch.jit
            ep = _compat.export(_Ops(fn), (x,))
    except Exception as e:
        if _ragged_dims(x):
            return _export_jagged(run, fn, x, expected, e)
        raise Fail(
            f"torch.export.export (non-strict) of {len(cases)} ops on {describe(x)} raised "
            f"{type(e).__name__}: {_first_line(e)}",
            "make the ops traceable with fake tensors (see the compile rows)" + _FIX_OFF,
        ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        d = difference(ep.module()(x), expected)
    if d:
        raise Fail(f"the exported program's result differs from eager: {d}", "see the compile rows; export traces the same way")
    try:
        from ._serialization import allowed_globals

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ep2 = _compat.export_round_trip(ep, allowed_globals(run.cls))
            got = ep2.module()(x)
    except Exception as e:
        raise Fail(
            f"torch.export.save/load of the exported program failed: {type(e).__name__}: {_first_line(e)}",
            "keep the class and its ctx importable at module level and picklable" + _FIX_OFF,
        ) from None
    d = difference(got, expected)
    if d:
        raise Fail(f"after torch.export.save/load the program's result differs from eager: {d}", "keep the ctx picklable with equal values")
    return f"{len(cases)} ops, saved and loaded"


def _ragged_dims(x) -> list:
    return [d for d, s in enumerate(x.shape) if not isinstance(s, int)]


def _export_jagged(run, fn, x, expected, nonstrict_error):
    """A jagged (nested int) outer dim: non-strict export failed; try strict export, its
    module and save/load. Each stage that torch cannot do is named; none is the class's."""
    d = _ragged_dims(x)[0]
    said = f"non-strict export raised {type(nonstrict_error).__name__}: {_first_line(nonstrict_error)}"
    stage = "strict torch.export.export"
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ep = _compat.export(_Ops(fn), (x,), strict=True)
            stage = "the strict program's module() (its input guards)"
            got = ep.module()(x)
            diff = difference(got, expected)
            if diff:
                raise Fail(f"the strictly exported program's result differs from eager: {diff}", "see the compile rows")
            stage = "torch.export.save/load of the strict program"
            from ._serialization import allowed_globals

            got = _compat.export_round_trip(ep, allowed_globals(run.cls)).module()(x)
    except Fail:
        raise
    except Exception as e:
        raise Skip(
            f"torch {torch.__version__.split('+')[0]} cannot export a model taking {describe(x)} (dim {d} is a "
            f"nested int): {said}; {stage} raised {type(e).__name__}: {_first_line(e)[:120]} -- a limit "
            "of torch.export, not of the class"
        ) from None
    diff = difference(got, expected)
    if diff:
        raise Fail(f"after torch.export.save/load the program's result differs from eager: {diff}", "keep the ctx picklable with equal values")
    return f"strict export, saved and loaded ({said})"
