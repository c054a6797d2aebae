"""Serialization check: ``torch.save`` then ``torch.load(weights_only=True)`` gives back an
equal instance, with only the globals the kit allows for the class.

For a kit class the allowed set is ``subclass_kit.serialization.required_globals(cls)``,
exactly what ``serialization.allow(cls)`` adds; for other classes it is the class itself.
The globals are allowed for the duration of the load only, so the check leaves the
process's safe-globals list as it found it.
"""

from __future__ import annotations

import io
import re

import torch

from .. import _compat
from ._compare import difference
from ._check import Check, Fail, Skip
from ._subject import describe

__all__ = ["plan", "allowed_globals"]


def plan(run) -> list:
    if not run.serialization:
        return [Check("serialization.save_load", _off, ())]
    return [Check("serialization.save_load", _save_load, ("protocol.flatten",))]


def _off(run):
    raise Skip("turned off (serialization=False)")


def allowed_globals(cls) -> list:
    """What ``torch.load(weights_only=True)`` is allowed to import for ``cls``."""
    if hasattr(cls, "__kit_spec__"):
        from .. import serialization

        return list(serialization.required_globals(cls))
    return [cls]


_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _save_load(run):
    how = "subclass_kit.serialization.allow(cls)" if run.subject.is_kit else "torch.serialization.add_safe_globals([cls])"
    for i, x in enumerate(run.samples):
        what = f"sample {i} ({describe(x)})"
        buf = io.BytesIO()
        try:
            torch.save(x, buf)
        except Exception as e:
            raise Fail(
                f"torch.save of {what} raised {type(e).__name__}: {str(e).strip()[:160]}",
                "make the class importable at module level and its ctx picklable",
            ) from None
        buf.seek(0)
        try:
            with torch.serialization.safe_globals(allowed_globals(run.cls)):
                y = torch.load(buf, weights_only=True)
        except Exception as e:
            text = str(e)
            m = _GLOBAL.search(text)
            if m:
                raise Fail(
                    f"torch.load(weights_only=True) of {what} needs the global {m.group(1)}, which "
                    f"{how} does not allow",
                    f"pickle only the class, tensors and plain values (tuples, ints, strs, dtypes) in "
                    f"the ctx, or allow {m.group(1)} too with torch.serialization.add_safe_globals",
                ) from None
            raise Fail(
                f"torch.load(weights_only=True) of {what} raised {type(e).__name__}: {text.strip().splitlines()[0][:160]}",
                "make the instance pickle as (class, inner tensors, ctx) with plain values",
            ) from None
        d = difference(y, x, "loaded")
        if d:
            raise Fail(f"torch.load gave back a different value for {what}: {d}", "pickle every inner tensor and the whole ctx")
        same_stride = [_compat.sym_expr(s) for s in y.stride()] == [_compat.sym_expr(s) for s in x.stride()]
        if not same_stride or y.requires_grad != x.requires_grad:
            raise Fail(
                f"torch.load changed the stride or requires_grad of {what}",
                "pickle the outer stride and requires_grad and pass them back on load",
            )
    if not run.samples:
        raise Skip("no samples")
    return f"loaded with {how}"
