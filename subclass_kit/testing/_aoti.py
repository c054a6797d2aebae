"""AOTInductor check (opt-in, slow): a model holding a sample as a parameter deploys.

``check_subclass(..., aoti=True)`` / ``subclass-kit check --aoti``. One package per
subject: a module holding the first sample twice -- as a wrapped parameter as it is, and
parametrized into plain tensors by torch's ``unwrap_tensor_subclass_parameters`` (torchao's
path) -- runs a few of the ops that passed eager on both, makes each result plain with
``to_plain()`` and multiplies it by a plain input whose batch dim is dynamic. The module is
exported (non-strict), compiled with ``aoti_compile_and_package``, loaded, and compared
with eager at two batch sizes the export never saw. Off by default: the compile takes
tens of seconds.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
import warnings

import torch

from ._compiled import composite, guard_cases
from ._ops import INPLACE
from ._check import Check, Fail, Skip
from ._subject import describe

__all__ = ["plan"]

_EXPORT_BATCH = 5
_BATCHES = (3, 9)  # neither is the batch the export saw


def plan(run) -> list:
    if not run.aoti:
        return []  # opt-in: no row unless asked for
    return [Check("aoti.package", _aoti, ("protocol.flatten", "protocol.round_trip_fake"))]


def _first_line(e) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


class _Holder(torch.nn.Module):
    def __init__(self, sample):
        super().__init__()
        self.w = torch.nn.Parameter(sample, requires_grad=False)


class _Deploy(torch.nn.Module):
    def __init__(self, sample, fn):
        super().__init__()
        from .._compat import unwrap_tensor_subclass_parameters

        self.fn = fn
        self.as_is = _Holder(sample)
        self.parametrized = unwrap_tensor_subclass_parameters(_Holder(sample.detach().clone()))

    def forward(self, x):
        outs = []
        for holder in (self.as_is, self.parametrized):
            for o in self.fn(holder.w):
                if not isinstance(o, torch.Tensor):
                    continue
                p = o.to_plain() if hasattr(type(o), "to_plain") and type(o) is not torch.Tensor else o
                outs.append(x.reshape((-1,) + (1,) * p.dim()) * p)
        return tuple(outs)


def _aoti(run):
    from ..deploy import aoti_package, load_package

    cls = run.cls
    if not hasattr(cls, "to_plain"):
        raise Skip(
            f"{cls.__qualname__} has no to_plain(): an AOTInductor package returns plain tensors "
            "only, and this row makes wrapped results plain with it; define to_plain()"
        )
    cases = guard_cases([c for c in run.compile_cases() if c.kind != INPLACE])
    if not cases:
        raise Skip("no op passed its eager check, so there is nothing to compile")
    x = run.first
    model = _Deploy(x, composite(cases)).eval()
    batch = torch.export.Dim("batch", min=2, max=1024)
    example = torch.randn(_EXPORT_BATCH)
    quiet = contextlib.redirect_stderr(io.StringIO())
    try:
        with quiet, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with torch.no_grad():
                ep = torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)
    except Exception as e:
        raise Fail(
            f"torch.export.export (non-strict) of a module holding {describe(x)} as a parameter "
            f"(as is and parametrized) running {len(cases)} ops raised {type(e).__name__}: "
            f"{_first_line(e)}",
            "see the export row; pass aoti=False (omit --aoti) if you never deploy with AOTInductor",
        ) from None
    with tempfile.TemporaryDirectory(prefix="kit-aoti-") as tmp:
        t0 = time.perf_counter()
        try:
            with quiet, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                path = aoti_package(ep, os.path.join(tmp, "model.pt2"))
        except Exception as e:
            raise Fail(
                f"AOTInductor could not compile the exported module holding {describe(x)}: "
                f"{type(e).__name__}: {_first_line(e)}",
                "see the compile[inductor] row (inductor lowers the same graph)",
            ) from None
        seconds = time.perf_counter() - t0
        size = os.path.getsize(path)
        runner = load_package(path)
        for b in _BATCHES:
            xb = torch.randn(b)
            with torch.no_grad():
                expected = model(xb)
            got = runner(xb)
            got = tuple(got) if isinstance(got, (list, tuple)) else (got,)
            if len(got) != len(expected):
                raise Fail(f"the package returned {len(got)} outputs, eager {len(expected)}")
            for i, (g, want) in enumerate(zip(got, expected)):
                try:
                    torch.testing.assert_close(g, want)
                except AssertionError as err:
                    raise Fail(
                        f"at batch {b}, output {i} of the package differs from eager: "
                        f"{_first_line(err)}",
                        "see the compile[inductor] row; the package runs the same kernels",
                    ) from None
    return (
        f"{len(cases)} ops on the parameter as is and parametrized, batch dynamic "
        f"{_BATCHES}: package equals eager ({size / 1e6:.1f} MB, compiled in {seconds:.0f} s)"
    )
